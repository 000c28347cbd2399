"""Sampling: saving an adapter for samplers, sampling sessions, ``asample`` (and ``compute_logprobs``,
which the SDK sends as a one-token sample with prompt logprobs). The engine starts on first need, so a
server that only trains never starts one."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.tinker.checkpoints import Checkpoints
from agentrl.tinker.errors import TinkerNotFound, TinkerUserError
from agentrl.tinker.futures import Future, Futures
from agentrl.tinker.sampler import SamplerError, SampleResult, SlotSampler
from agentrl.tinker.service import Model, TinkerService
from agentrl.tinker.trainer import LORA_ALPHA
from agentrl.tinker.wire import sample_response

log = logging.getLogger(__name__)


@dataclass
class Sampler:
    sampler_id: str
    owner: str
    model_path: str | None
    adapter: str | None
    """The checkpoint's own adapter name in the engine (None: the base model)."""
    adapter_dir: Path | None
    model_id: str | None = None
    """The training model the checkpoint was saved from: while it is that model's latest, its live adapter
    serves it."""


def _adapter_name(owner: str, path: str) -> str:
    return "t" + hashlib.sha256(f"{owner}|{path}".encode()).hexdigest()[:20]


def _prompt_tokens(prompt: Any) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.chunks:
        if getattr(chunk, "type", None) != "encoded_text":
            raise TinkerUserError(f"a {getattr(chunk, 'type', '?')} chunk in the prompt: this server samples from "
                                  "token chunks (EncodedTextChunk) only")
        tokens += [int(t) for t in chunk.tokens]
    if not tokens:
        raise TinkerUserError("the prompt has no tokens")
    return tokens


def _check_served(req: Any) -> None:
    """Refuse the sampling options this server does not serve, rather than answer without them."""
    unserved = [name for name, asked in (("topk_sample_logprobs", req.topk_sample_logprobs > 0),
                                         ("target_prompt_logprobs", req.target_prompt_logprobs is not None),
                                         ("prompt_alt_tokens_k", req.prompt_alt_tokens_k > 0),
                                         ("record_stability_info", bool(req.record_stability_info))) if asked]
    if unserved:
        raise TinkerUserError(f"{', '.join(unserved)}: not served by this server (see docs/tinker.md)")


class Sampling:
    """The samplers of every owner, over one lazily started engine."""

    def __init__(self, svc: TinkerService, start_engine: Callable[[], Awaitable[SlotSampler]]) -> None:
        self.svc = svc
        self._start_engine = start_engine
        self._engine: asyncio.Task[SlotSampler] | None = None
        self.samplers: dict[str, Sampler] = {}

    async def engine(self) -> SlotSampler:
        """The engine, started on first call (a failed start is tried again on the next call)."""
        if self._engine is None or (self._engine.done() and self._engine.exception() is not None):
            self._engine = asyncio.get_running_loop().create_task(self._start_engine())
        try:
            return await asyncio.shield(self._engine)
        except Exception as e:
            raise SamplerError(f"the sampling engine did not start: {e}") from e

    def _sampler(self, owner: str, model_path: str | None, base_model: str | None) -> Sampler:
        if model_path is None:
            if base_model is not None and base_model != self.svc.model_name:
                raise TinkerUserError(f"base model {base_model!r}: this server serves {self.svc.model_name!r} only")
            return Sampler(uuid.uuid4().hex, owner, None, None, None)
        ckpt = self.svc.checkpoints.find(model_path, owner)
        return Sampler(uuid.uuid4().hex, owner, model_path, _adapter_name(owner, model_path), ckpt.dir,
                       ckpt.model_id)

    def create_sampling_session(self, owner: str, req: Any) -> str:
        self.svc.session(owner, req.session_id)
        s = self._sampler(owner, req.model_path, req.base_model)
        self.samplers[s.sampler_id] = s
        return s.sampler_id

    def own(self, owner: str, sampler_id: str) -> Sampler:
        s = self.samplers.get(sampler_id)
        if s is None or s.owner != owner:
            raise TinkerNotFound(f"no sampling session {sampler_id!r} for this API key")
        return s

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        s = self.own(owner, sampler_id)
        return {"sampler_id": s.sampler_id, "base_model": self.svc.model_name, "model_path": s.model_path}

    def save_weights_for_sampler(self, owner: str, req: Any) -> Future:
        """The adapter as it is now, at ``tinker://MODEL/sampler_weights/NAME`` (a name of its own when the
        SDK asks for a sampling session instead of a path); published into the engine when it is running."""
        async def work(model: Model, fut: Future) -> None:
            model.sampler_saves += 1
            name = req.path or f"sampler-{model.sampler_saves:06d}"
            ckpt = self.svc.checkpoints.new(owner, model.model_id, "sampler_weights", name)
            await self.svc.run(self.svc.trainer.save, model.adapter, ckpt.dir, optimizer=False)
            Checkpoints.seal(ckpt, owner, {"base_model": self.svc.model_name, "optimizer": False,
                                           "user_metadata": req.user_metadata})
            out: dict[str, Any] = {"path": ckpt.path, "type": "save_weights_for_sampler"}
            if req.path is None:
                s = self._sampler(owner, ckpt.path, None)
                self.samplers[s.sampler_id] = s
                out["sampling_session_id"] = s.sampler_id
            await self._publish_live(model, ckpt.path, ckpt.dir)
            Futures.succeed(fut, json=out)
        return self.svc.ordered(owner, req.model_id, req.seq_id, "save_weights_for_sampler", work)

    def asample(self, owner: str, req: Any) -> Future:
        """``POST /api/v1/asample``: ``num_samples`` sequences; the future carries ``sample_sequence_ids``."""
        s = self.own(owner, req.sampling_session_id) if req.sampling_session_id is not None \
            else self._sampler(owner, req.model_path, req.base_model)
        _check_served(req)
        prompt = _prompt_tokens(req.prompt)
        sp = req.sampling_params
        max_tokens = sp.max_tokens if sp.max_tokens is not None else 16
        if req.num_samples < 1 or max_tokens < 1:
            raise TinkerUserError("num_samples and max_tokens must be at least 1")
        if len(prompt) + max_tokens > self.svc.max_context:
            raise TinkerUserError(f"{len(prompt)} prompt tokens + max_tokens {max_tokens} exceed the context of "
                                  f"{self.svc.max_context} tokens")
        fut = self.svc.futures.create(owner, "sample")
        fut.extra["sample_sequence_ids"] = [f"{fut.request_id}:{i}" for i in range(req.num_samples)]

        async def work() -> None:
            res = await self._sample(s, prompt, num_samples=req.num_samples, max_tokens=max_tokens,
                                     temperature=sp.temperature, top_p=sp.top_p, top_k=sp.top_k, seed=sp.seed,
                                     stop=sp.stop, prompt_logprobs=bool(req.prompt_logprobs),
                                     topk_prompt_logprobs=req.topk_prompt_logprobs)
            lps = res.prompt_logprobs
            if lps is not None and req.prompt_logprobs_last_n:
                keep = len(lps) - req.prompt_logprobs_last_n
                lps = [None] * keep + lps[keep:]
            Futures.succeed(fut, proto=sample_response(res.sequences, lps, res.topk_prompt_logprobs))
        return self.svc.spawn(fut, work)

    def _running(self) -> SlotSampler | None:
        """The engine if it has started (None while it starts, or before the first sampling request)."""
        task = self._engine
        return task.result() if task is not None and task.done() and task.exception() is None else None

    async def _publish_live(self, model: Model, path: str, adapter_dir: Path) -> None:
        """``path`` becomes the model's live version: copied in place into its live adapter when the engine
        runs (else loaded when first sampled)."""
        from safetensors.torch import load_file

        engine = self._running()
        if engine is not None:
            tensors = await asyncio.to_thread(load_file, str(adapter_dir / "adapter_model.safetensors"))
            try:
                await engine.publish_live(model.live_adapter, tensors, adapter_dir, scale=LORA_ALPHA / model.spec.rank,
                                          on_update=lambda: setattr(model, "live_path", path))
            except Exception as e:  # every sampler reads its own checkpoint's files instead
                log.warning("%s: the live adapter was not updated (%s); samplers load their checkpoints", model.model_id, e)
                model.live_path = None
        else:
            model.live_path = path

    async def _sample(self, s: Sampler, prompt: list[int], **kw: Any) -> SampleResult:
        """Sample ``s``'s weights: the base model, the live adapter while ``s`` is its model's latest version,
        else the checkpoint's own adapter (loaded from its directory)."""
        engine = await self.engine()
        if s.adapter is None or s.adapter_dir is None:
            return await engine.sample(None, prompt, **kw)
        model = self.svc.models.get(s.model_id or "")
        if model is not None and model.live_path == s.model_path:
            async with engine.gate(model.live_adapter).read():
                if model.live_path == s.model_path:  # still the live version, and stays so while this runs
                    if not engine.knows(model.live_adapter):
                        await engine.publish(model.live_adapter, s.adapter_dir)
                    return await engine.sample(model.live_adapter, prompt, cache_salt=s.adapter, **kw)
        await engine.publish(s.adapter, s.adapter_dir)
        return await engine.sample(s.adapter, prompt, cache_salt=s.adapter, **kw)

    async def close(self) -> None:
        if self._engine is not None and not self._engine.done():
            self._engine.cancel()
        engine = self._running()
        if engine is not None:
            await engine.close()
