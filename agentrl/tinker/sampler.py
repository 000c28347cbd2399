"""The sampling half: one vLLM engine (agentrl's own launcher, LoRA on) serving the base model, with the saved
adapters the samplers read in its LoRA slots.

Each sampler checkpoint (``save_weights_for_sampler``) is its own adapter directory, never rewritten, and is
published into the engine under a name of its own (``vLLM``'s ``/v1/load_lora_adapter``): a sampler reads
exactly the weights that were saved at its path, and the engine's prefix cache, keyed by adapter, never mixes
two versions. At most ``max_adapters`` adapters sit in the engine's GPU/CPU slots at once (vLLM moves them
between slots itself); at most ``max_registered`` stay registered, the least recently used is unloaded
beyond that, and loaded again from its directory when it is next sampled."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from agentrl.config.inference import VLLMServerConfig, engine_lora_rank
from agentrl.config.trainer import ALL_LINEAR, OUTPUT_LAYER
from agentrl.inference.client import InferenceClient
from agentrl.inference.server import VLLMServer
from agentrl.tinker.errors import TinkerError, TinkerUserError
from agentrl.tinker.wire import WireSequence

log = logging.getLogger(__name__)
BASE = "base"
"""The engine's name for the base model (adapters are addressed by their own names)."""


class SamplerError(TinkerError, RuntimeError):
    """The engine failed a sampling request or could not start."""

    code = "tinker.sampler"


class _Gate:
    """Samples of a live adapter run together; an in-place update waits until none runs, and new samples
    wait for the update: a sample never sees two versions."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._readers = 0
        self._writing = False

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing)
            self._readers += 1
        try:
            yield
        finally:
            async with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._writing)
            self._writing = True
            await self._cond.wait_for(lambda: self._readers == 0)
        try:
            yield
        finally:
            async with self._cond:
                self._writing = False
                self._cond.notify_all()


class _Tensors:
    """The tensors of the next in-place update (the publisher's ``AdapterSource``)."""

    def __init__(self) -> None:
        self.tensors: dict[str, Any] = {}

    async def get_adapter_tensors(self) -> dict[str, Any]:
        return self.tensors


@dataclass
class SampleResult:
    sequences: list[WireSequence]
    prompt_logprobs: list[float | None] | None = None
    topk_prompt_logprobs: list[list[tuple[int, float]] | None] | None = None


def _stop_fields(stop: Any) -> dict[str, Any]:
    """The SDK's ``stop`` as vLLM's fields: None keeps EOS stopping, ``[]`` disables it, ints are token ids."""
    if stop is None:
        return {}
    if isinstance(stop, str):
        return {"stop": [stop]}
    stop = list(stop)
    if not stop:
        return {"ignore_eos": True}
    if all(isinstance(s, int) for s in stop):
        return {"stop_token_ids": stop}
    return {"stop": [str(s) for s in stop]}


def _prompt_logprobs(prompt: list[int], raw: list[Any] | None, k: int) -> tuple[list[float | None],
                                                                               list[list[tuple[int, float]] | None]]:
    """vLLM's per-position dicts (token id -> logprob record) as the prompt token's logprob and the top ``k``."""
    lps: list[float | None] = []
    tops: list[list[tuple[int, float]] | None] = []
    for i, tok in enumerate(prompt):
        entry = raw[i] if raw is not None and i < len(raw) else None
        if not entry:
            lps.append(None)
            tops.append(None)
            continue
        by_id = {int(str(t).rpartition(":")[2]): float(v["logprob"] if isinstance(v, dict) else v)
                 for t, v in entry.items()}
        lps.append(by_id.get(tok))
        ranked = sorted(by_id.items(), key=lambda kv: -kv[1])
        tops.append(ranked[:k] if k else None)
    return lps, tops


class SlotSampler:
    """The engine and the adapters published into it, by name."""

    def __init__(self, server: VLLMServer, *, max_adapters: int, max_rank: int, max_registered: int) -> None:
        self.server = server
        self.max_adapters = max_adapters
        self.max_rank = max_rank
        self.max_registered = max_registered
        self._client = InferenceClient([server.url], model=BASE, timeout_s=600)
        self._http = httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(600.0, connect=10.0))
        self._paths: dict[str, Path] = {}
        self._loaded: OrderedDict[str, Path] = OrderedDict()
        self._lock = asyncio.Lock()
        self._gates: dict[str, _Gate] = {}
        self._live: dict[str, tuple[Any, _Tensors]] = {}
        """Per live adapter: its in-place publisher (shared memory) and the tensors it copies."""

    @classmethod
    async def start(cls, model_dir: Path, *, state_dir: Path, max_adapters: int = 4, max_rank: int = 32,
                    max_model_len: int | None = None, log_dir: Path | None = None) -> SlotSampler:
        cfg = VLLMServerConfig(model=str(model_dir), served_model_name=BASE, dtype="float32",
                               max_model_len=max_model_len or 2048, enable_lora=True,
                               max_lora_rank=engine_lora_rank(max_rank), max_loras=max_adapters,
                               lora_target_modules=[*ALL_LINEAR, OUTPUT_LAYER],  # what an adapter can cover
                               extra_args=["--max-cpu-loras", str(max_adapters * 2)])
        server = VLLMServer(cfg, log_dir or state_dir / "logs")
        await asyncio.to_thread(server.start)
        log.info("sampler engine %s ready in %.1f s", server.url, server.startup_s or -1)
        return cls(server, max_adapters=max_adapters, max_rank=max_rank, max_registered=max_adapters * 4)

    async def publish(self, name: str, adapter_dir: Path) -> dict[str, float]:
        """Make adapter ``name`` serve the adapter saved in ``adapter_dir`` (loaded now, or again after it was
        unloaded as the least recently used). Returns timings (``engine_ms``: the engine's load)."""
        async with self._lock:
            self._paths[name] = adapter_dir
            if name in self._loaded:
                self._loaded.move_to_end(name)
                return {"engine_ms": 0.0}
            while len(self._loaded) >= self.max_registered:
                old, _ = self._loaded.popitem(last=False)
                await self._client.unload_lora_adapter(old)
            t0 = time.perf_counter()
            try:
                await self._client.load_lora_adapter(name, str(adapter_dir.resolve()), inplace=True)
            except Exception as e:
                raise SamplerError(f"the engine could not load adapter {name}: {e}") from e
            self._loaded[name] = adapter_dir
            ms = (time.perf_counter() - t0) * 1000
            log.info("adapter %s published from %s in %.1f ms", name, adapter_dir, ms)
            return {"engine_ms": ms}

    def knows(self, name: str) -> bool:
        """Whether adapter ``name`` was published (loaded now, or loadable again from its directory)."""
        return name in self._paths

    def gate(self, name: str) -> _Gate:
        """The reader/writer gate of live adapter ``name``."""
        return self._gates.setdefault(name, _Gate())

    async def publish_live(self, name: str, tensors: dict[str, Any], adapter_dir: Path, *, scale: float,
                           on_update: Any = None) -> dict[str, float]:
        """Make live adapter ``name`` serve ``tensors`` (saved in ``adapter_dir`` too): copied in place into
        its engine slot (agentrl's shared-memory weight sync, B pre-scaled by ``scale``), or loaded from
        ``adapter_dir`` where the engine holds no slot for it yet (first publish, or after it was unloaded).
        Waits until no sample of ``name`` runs, then calls ``on_update()`` and updates; samples after it read
        the new weights."""
        from agentrl.weight_sync.inplace import SyncError
        from agentrl.weight_sync.shm import SharedMemoryAdapterSync

        async with self.gate(name).write():
            if on_update is not None:
                on_update()
            if name not in self._live:
                source = _Tensors()
                pub = SharedMemoryAdapterSync(source, self._client, name, reset="", set_version=False, b_scale=scale)
                self._live[name] = (pub, source)
            pub, source = self._live[name]
            source.tensors = tensors
            if name in self._loaded:
                try:
                    out = await pub.publish(0)
                    async with self._lock:
                        self._paths[name] = self._loaded[name] = adapter_dir
                        self._loaded.move_to_end(name)
                    log.info("adapter %s updated in place in %.2f ms (engine)", name, out.get("engine_ms", -1))
                    return {**out, "in_place": 1.0}
                except SyncError as e:  # no slot for it (evicted by the engine): load the files instead
                    log.info("adapter %s: in-place update refused (%s); loading it from %s", name, e, adapter_dir)
                    async with self._lock:
                        self._loaded.pop(name, None)
            return {**await self.publish(name, adapter_dir), "in_place": 0.0}

    async def _ensure(self, name: str | None) -> str:
        if name is None:
            return BASE
        if name not in self._loaded:
            if name not in self._paths:
                raise TinkerUserError(f"adapter {name} was never published")
            await self.publish(name, self._paths[name])
        else:
            self._loaded.move_to_end(name)
        return name

    async def sample(self, name: str | None, prompt: list[int], *, num_samples: int, max_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = -1, seed: int | None = None,
                     stop: Any = None, prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0,
                     cache_salt: str | None = None) -> SampleResult:
        """``num_samples`` completions of ``prompt`` by adapter ``name`` (None: the base model), token-faithful,
        with the sampled tokens' logprobs and, if asked, the prompt's. ``cache_salt``: the version of the
        weights, so the engine never reuses a prefix computed with another version of a live adapter."""
        model = await self._ensure(name)
        body: dict[str, Any] = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "n": num_samples,
                                "temperature": temperature, "top_p": top_p, "top_k": top_k if top_k > 0 else -1,
                                "logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True,
                                "skip_special_tokens": False, **_stop_fields(stop)}
        if seed is not None:
            body["seed"] = seed
        if cache_salt:
            body["cache_salt"] = cache_salt
        want_prompt = prompt_logprobs or topk_prompt_logprobs > 0
        if want_prompt and name is not None:
            self._check_prompt_logprobs(name)
        if want_prompt:
            body["prompt_logprobs"] = max(topk_prompt_logprobs, 1)
        if temperature == 0 and num_samples > 1:  # vLLM takes n > 1 at a temperature above 0 only
            outs = await asyncio.gather(*(self._complete({**body, "n": 1}) for _ in range(num_samples)))
            out = {**outs[0], "choices": [dict(o["choices"][0], index=i) for i, o in enumerate(outs)]}
        else:
            out = await self._complete(body)
        return self._result(out, prompt, want_prompt, topk_prompt_logprobs)

    def _check_prompt_logprobs(self, name: str) -> None:
        """Prompt logprobs of an adapter with an output-layer LoRA (``train_unembed``) are right on the CPU build
        only: vLLM's GPU op maps the output layer's rows to adapters one per sampled sequence, so a prompt's
        rows would get another request's adapter or none (agentrl's CPU fast path maps them to their tokens)."""
        from agentrl.config.facts import cpu_build
        from agentrl.weight_sync.saved import carries_output_lora

        path = self._paths.get(name)
        if path is not None and not cpu_build() and carries_output_lora(path):
            raise TinkerUserError(f"prompt logprobs of adapter {name}: its output-layer LoRA (train_unembed) is "
                                  "scored wrongly by vLLM's GPU LoRA op on prompt positions; create the training "
                                  "client with train_unembed=False to compute prompt logprobs on a GPU engine")

    async def _complete(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await self._http.post("/v1/completions", json=body)
        except httpx.HTTPError as e:
            raise SamplerError(f"the sampling engine did not answer: {e}") from e
        if r.status_code == 400:
            raise TinkerUserError(f"the engine refused the sampling request: {r.text[:300]}")
        if r.status_code != 200:
            raise SamplerError(f"the engine answered {r.status_code}: {r.text[:300]}")
        return r.json()

    @staticmethod
    def _result(out: dict[str, Any], prompt: list[int], want_prompt: bool, k: int) -> SampleResult:
        seqs = []
        for ch in sorted(out["choices"], key=lambda c: c.get("index", 0)):
            toks = [int(t) for t in ch.get("token_ids") or []]
            lps = [float(x) if x is not None else -math.inf for x in (ch.get("logprobs") or {}).get("token_logprobs")
                   or []]
            seqs.append(WireSequence(toks, lps, "length" if ch.get("finish_reason") == "length" else "stop"))
        result = SampleResult(seqs)
        if want_prompt:
            raw = out["choices"][0].get("prompt_logprobs")
            result.prompt_logprobs, tops = _prompt_logprobs(prompt, raw, k)
            result.topk_prompt_logprobs = tops if k else None
        return result

    async def close(self) -> None:
        for pub, _ in self._live.values():
            pub.close()
        await self._http.aclose()
        await self._client.aclose()
        await asyncio.to_thread(self.server.stop)
