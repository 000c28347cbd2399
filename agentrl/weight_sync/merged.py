"""Merged LoRA sync: only the adapter crosses to the engines, which merge it into their base weights and
generate on plain weights (the ``merged`` transport; its engine half is :mod:`agentrl.engine.transports.merged`).

Per sync (:meth:`MergedAdapterSync.publish`):

1. the trainer's adapter tensors are written into a shared-memory segment owned here (the in-place copy's
   packed layout, :mod:`agentrl.weight_sync.inplace`), or packed into the call body for engines on other hosts;
2. every engine pauses with ``keep`` (in-flight requests freeze where they are) and merges: ``W0 + scaling *
   B @ A`` for each module the adapter touches, from its kept copy of the base weights
   (:mod:`agentrl.engine.merge`), loaded with vLLM's own weight loading;
3. every engine that merged is labelled with the new version, drops its prefix cache (running requests are
   preempted and recompute their KV under the new weights) and resumes, as after a full-weight load
   (:func:`agentrl.weight_sync.rotation.go_live`). In-flight episodes go on, and every token keeps the version
   that produced it.

An engine that fails the merge is left with a partial load: it leaves the rotation (its frozen requests are
aborted, so they retry elsewhere) and rejoins after a complete one, as with full weights.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from agentrl.config.sync import MergedSync
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import LoadingEngines, Publisher, PublishTarget
from agentrl.weight_sync.control import controlled
from agentrl.weight_sync.hosts import call_body_engines
from agentrl.weight_sync.inplace import SyncError, control_stages, worker_failures
from agentrl.weight_sync.rotation import abandon, each_endpoint, go_live, live_urls
from agentrl.weight_sync.shm import SharedMemoryAdapterSync

MERGE_METHOD = "agentrl_merge_lora"
MERGE_BYTES_METHOD = "agentrl_merge_lora_bytes"


class MergedAdapterSync(SharedMemoryAdapterSync):
    """Publish a LoRA adapter that the engines of ``engine`` merge into their weights.

    ``trainer`` hands out the adapter's tensors and saves its files (read once, for ``adapter_config.json``:
    each module's scaling); ``remote``: endpoints that cannot map this host's shared memory (they get the
    adapter in the call body).
    """

    def __init__(self, trainer: Any, engine: LoadingEngines, *, remote: list[str] | None = None,
                 set_version: bool = True, rpc_timeout_s: float = 600.0) -> None:
        super().__init__(trainer, engine, "merged", set_version=set_version, rpc_timeout_s=rpc_timeout_s)
        self.remote = set(remote or [])
        self._peft_config: dict[str, Any] | None = None
        self._merge_meta = ("", "")  # (the segment layout's meta, the same with the adapter config)

    @property
    def loading(self) -> LoadingEngines:
        """The engines (the base class's ``engine``), with the pause and rotation calls a merge needs."""
        return cast(LoadingEngines, self.engine)

    async def peft_config(self) -> dict[str, Any]:
        """The adapter's ``adapter_config.json`` (saved by the trainer once)."""
        if self._peft_config is None:
            with tempfile.TemporaryDirectory(prefix="agentrl-merged-") as d:
                await self.trainer.save_adapter(Path(d) / "adapter")
                self._peft_config = json.loads((Path(d) / "adapter" / "adapter_config.json").read_text())
        return self._peft_config

    def merge_meta(self, peft_config: dict[str, Any]) -> str:
        """The engines' description of the segment: its layout and the adapter config."""
        if self._merge_meta[0] != self._meta_json:
            meta = {**json.loads(self._meta_json), "peft_config": peft_config}
            self._merge_meta = (self._meta_json, json.dumps(meta, separators=(",", ":")))
        return self._merge_meta[1]

    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine in rotation; returns each stage's time in ms (and ``sync_s``).
        Engines with a local control link merge, are labelled and reset in one message between two of their
        steps (no pause); the others are paused, merged and resumed over HTTP."""
        t0 = time.perf_counter()
        config = await self.peft_config()
        tensors = await self.trainer.get_adapter_tensors()
        t1 = time.perf_counter()
        nbytes = self.write(tensors)
        meta = self.merge_meta(config)
        t2 = time.perf_counter()
        live = live_urls(self.loading)
        failed: dict[str, str] = {}
        linked = [u for u in live if u in self._links()]
        merged, retry = await self._merge_linked(linked, meta, version, failed) if linked else ([], [])
        t3 = time.perf_counter()
        slow = [u for u in live if u not in linked] + retry
        stages = await self._merge_paused(slow, meta, nbytes, version, failed, merged) if slow else {}
        if len(failed) == len(live):
            raise SyncError("merging the adapter failed on every engine: " + "; ".join(f"{u}: {w}" for u, w in
                                                                                       failed.items()))
        t4 = time.perf_counter()
        return {
            "trainer_gather_ms": (t1 - t0) * 1e3,
            "shm_write_ms": (t2 - t1) * 1e3,
            **({"merge_control_ms": (t3 - t2) * 1e3} if linked else {}),
            **stages,
            **control_stages(merged),
            "engine_ms": max((float(w["engine_ms"]) for w in merged), default=0.0),
            "merge_plan_ms": max((float(w.get("plan_ms", 0.0)) for w in merged), default=0.0),
            "total_ms": (t4 - t0) * 1e3,
            "sync_s": t4 - t0,
            "adapter_bytes": float(nbytes),
            "engines_failed": float(len(failed)),
        }

    def _links(self) -> dict[str, Any]:
        return getattr(self.engine, "links", {})

    async def _merge_linked(self, urls: list[str], meta: str, version: int,
                            failed: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
        """Merge, label and reset on the engines of ``urls`` over their control links, each between two steps;
        an engine whose merge failed froze its generation there and leaves the rotation now. The records of
        the workers that merged, and the engines whose link broke (to do the HTTP way)."""
        assert self.shm is not None
        label = engine_label(version) if self.set_version else ""
        results = await self.engine.subset(urls).collective_rpc(
            MERGE_METHOD, kwargs={"shm_name": self.shm.name, "meta_json": meta, "layout_id": self._layout_id},
            timeout=self.rpc_timeout_s, version=label, reset="running", pause_on_failure=True)
        done: list[dict[str, Any]] = []
        retry: list[str] = []
        for url, workers in zip(urls, results, strict=True):
            if any(isinstance(w, dict) and w.get("link_failed") for w in workers):
                retry.append(url)
            elif bad := worker_failures(workers) or ([] if workers else ["no worker answered"]):
                failed[url] = f"{MERGE_METHOD}: " + "; ".join(bad)
            else:
                done += [w for w in workers if isinstance(w, dict)]
        await abandon(self.loading, {u: failed[u] for u in urls if u in failed})
        return done, retry

    async def _merge_paused(self, urls: list[str], meta: str, nbytes: int, version: int, failed: dict[str, str],
                            merged: list[dict[str, Any]]) -> dict[str, float]:
        """The HTTP way on ``urls``: pause (``keep``), merge, then label, reset and resume those that merged; the
        workers' records are added to ``merged``. The stages' ms."""
        t0 = time.perf_counter()
        await self.loading.subset(urls).pause("keep")
        t1 = time.perf_counter()
        fresh: dict[str, str] = {}
        try:
            merged += await self._merge(urls, meta, nbytes, fresh)
        except BaseException:
            await abandon(self.loading, {u: "the merge was interrupted" for u in urls})
            raise
        t2 = time.perf_counter()
        failed.update(fresh)
        await abandon(self.loading, fresh)
        ok = [u for u in urls if u not in fresh]
        live_ms = await go_live(self.loading, ok, version, set_version=self.set_version) if ok else {}
        return {"merge_pause_ms": (t1 - t0) * 1e3, "merge_rpc_ms": (t2 - t1) * 1e3, **live_ms}

    async def _merge(self, urls: list[str], meta: str, nbytes: int, failed: dict[str, str]) -> list[dict[str, Any]]:
        """Every engine of ``urls`` merges the adapter: from the segment (this host) or the call body."""
        assert self.shm is not None
        here = [u for u in urls if u not in self.remote]
        away = [u for u in urls if u in self.remote]
        calls = []
        if here:
            calls.append(each_endpoint(self.loading, MERGE_METHOD, {
                "shm_name": self.shm.name, "meta_json": meta, "layout_id": self._layout_id}, here, failed,
                self.rpc_timeout_s))
        if away:
            payload = base64.b64encode(bytes(self.shm.buf[:nbytes])).decode("ascii")
            calls.append(each_endpoint(self.loading, MERGE_BYTES_METHOD, {
                "payload_b64": payload, "meta_json": meta, "layout_id": self._layout_id}, away, failed,
                self.rpc_timeout_s))
        return [w for done in await asyncio.gather(*calls) for w in done]


@contextlib.asynccontextmanager
async def open_publisher(sync: MergedSync, target: PublishTarget) -> AsyncIterator[Publisher]:
    """The ``merged`` transport over ``target``'s engines: the adapter through shared memory to the engines on
    this host, in the call body to the others (``sync.carrier = "network"``: to every engine), merged by each
    engine (those on this host over their local control socket where ``sync.control`` asks for it and they
    can open one)."""
    client = target.engines
    remote = await call_body_engines(sync.carrier, client)
    here = [u for u in client.endpoints if u not in remote]
    async with controlled(client, here, enabled=sync.control == "socket" and bool(here)) as fast:
        with MergedAdapterSync(target.trainer, fast, remote=remote) as publisher:
            yield publisher
