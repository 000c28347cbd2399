"""Full-weight sync: the trainer's whole model into running engines, one bucket of layers at a time.

Per sync (:meth:`FullWeightSync.publish`):

1. every engine pauses with ``keep`` (in-flight requests freeze where they are) and begins a weight load;
2. the trainer gathers bucket *i* from its FSDP2 shards (``full_tensor()`` on every rank, cast to the engine's
   dtype) and rank 0 writes it into slot ``i % 2`` of a shared-memory segment owned here, while the engines
   load bucket *i - 1* from the other slot: double-buffered, gathering overlaps loading. Engines on this host
   map the segment; engines on other hosts get the bucket's bytes in the call (no shared filesystem);
3. every engine finishes the load, is labelled with the new version, drops its prefix cache (running
   requests are preempted and recompute their KV under the new weights) and resumes. In-flight episodes go
   on, and every token keeps the version that produced it.

An engine that fails any step of a load holds a mix of two versions: it leaves the rotation (its frozen
requests are aborted, so they retry elsewhere) and rejoins only after a complete load (the engine watch
republishes the current version to it first).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import time
import weakref
from collections.abc import AsyncIterator
from multiprocessing import shared_memory
from typing import Any, Protocol

from agentrl.config.sync import FullSync
from agentrl.weight_sync.base import LoadingEngines, Publisher, PublishTarget
from agentrl.weight_sync.buckets import Layout, layout_bytes, payload_bytes, plan_buckets
from agentrl.weight_sync.hosts import call_body_engines
from agentrl.weight_sync.inplace import SyncError, release_segment
from agentrl.weight_sync.rotation import abandon, each_endpoint, go_live, live_urls

BEGIN_METHOD = "agentrl_begin_weights"
LOAD_METHOD = "agentrl_load_weights"
LOAD_BYTES_METHOD = "agentrl_load_weights_bytes"
FINISH_METHOD = "agentrl_finish_weights"
DTYPE_METHOD = "agentrl_weight_dtype"
DEFAULT_BUCKET_BYTES = 128 << 20


class WeightSource(Protocol):
    """The trainer, as a full-weight publisher needs it (:class:`agentrl.trainer.client.TrainerProcess`)."""

    async def weight_specs(self) -> list[tuple[str, list[int]]]: ...

    async def write_weight_bucket(self, layout: list[Any], shm_name: str | None, segment_bytes: int,
                                  offset: int) -> dict[str, Any]: ...


class FullWeightSync:
    """Publish the trainer's full weights into the engines of ``engine`` (a client or a subset of one).

    ``remote``: endpoints that cannot map this host's shared memory (they get each bucket in the call body);
    every other endpoint loads from the segment. ``bucket_bytes`` bounds one bucket (the trainer's rank 0
    holds at most one gathered bucket, and the segment is two of them).
    """

    def __init__(self, trainer: WeightSource, engine: LoadingEngines, *, remote: list[str] | None = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, set_version: bool = True,
                 rpc_timeout_s: float = 600.0) -> None:
        self.trainer = trainer
        self.engine = engine
        self.remote = set(remote or [])
        self.bucket_bytes = bucket_bytes
        self.set_version = set_version
        self.rpc_timeout_s = rpc_timeout_s
        self.buckets: list[Layout] = []
        self.dtype = ""
        self.shm: shared_memory.SharedMemory | None = None
        self._finalizer: weakref.finalize | None = None
        self._slot = 0
        self._metas: list[str] = []

    # ------------------------------------------------------------------------------------------ set-up
    async def _prepare(self, urls: list[str]) -> None:
        """Once: the engines' dtype, the bucket plan over the trainer's parameters, and the segment."""
        if self.buckets:
            return
        dtypes = {w.get("dtype") for per in await self.engine.subset(urls).collective_rpc(
            DTYPE_METHOD, timeout=self.rpc_timeout_s) for w in per if isinstance(w, dict) and w.get("ok")}
        if len(dtypes) != 1:
            raise SyncError(f"the engines report weight dtypes {sorted(map(str, dtypes))}: full-weight sync needs "
                            "one dtype on every engine (and the agentrl worker extension)")
        self.dtype = str(dtypes.pop())
        self.buckets = plan_buckets(await self.trainer.weight_specs(), self.dtype, self.bucket_bytes)
        self._metas = [json.dumps({"tensors": b}, separators=(",", ":")) for b in self.buckets]
        self._slot = max(layout_bytes(b) for b in self.buckets)
        name = f"agentrl_full_{os.getpid()}_{secrets.token_hex(4)}"
        self.shm = shared_memory.SharedMemory(name=name, create=True, size=2 * self._slot)
        self._finalizer = weakref.finalize(self, release_segment, self.shm)

    @property
    def bytes_per_sync(self) -> int:
        """State-dict bytes in the engine's dtype moved per sync (known after the first publish)."""
        return payload_bytes(self.buckets)

    # ------------------------------------------------------------------------------------------ one sync
    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine in rotation; returns each stage's time in ms (and ``sync_s``)."""
        t0 = time.perf_counter()
        await self._prepare(list(self.engine.endpoints))
        await self.engine.pause("keep")
        live = live_urls(self.engine)
        failed: dict[str, str] = {}
        t1 = time.perf_counter()
        stats = {"gather_ms": 0.0, "write_ms": 0.0, "load_ms": 0.0}
        try:
            await self._each(BEGIN_METHOD, {}, live, failed)
            t2 = time.perf_counter()
            await self._stream(live, failed, stats)
            t3 = time.perf_counter()
            await self._each(FINISH_METHOD, {}, live, failed)
        except BaseException:
            await abandon(self.engine, {u: "the weight load was interrupted" for u in live})
            raise
        t4 = time.perf_counter()
        ok = [u for u in live if u not in failed]
        await abandon(self.engine, failed)
        if not ok:
            raise SyncError("full-weight load failed on every engine: " + "; ".join(f"{u}: {w}" for u, w in
                                                                                      failed.items()))
        live_ms = await go_live(self.engine, ok, version, set_version=self.set_version)
        t5 = time.perf_counter()
        return {
            "full_pause_ms": (t1 - t0) * 1e3,
            "full_begin_ms": (t2 - t1) * 1e3,
            "full_stream_ms": (t3 - t2) * 1e3,
            "full_gather_ms": stats["gather_ms"],
            "full_write_ms": stats["write_ms"],
            "full_load_ms": stats["load_ms"],
            "full_finish_ms": (t4 - t3) * 1e3,
            **live_ms,
            "total_ms": (t5 - t0) * 1e3,
            "sync_s": t5 - t0,
            "weight_bytes": float(self.bytes_per_sync),
            "buckets": float(len(self.buckets)),
            "engines_failed": float(len(failed)),
        }

    async def _each(self, method: str, kwargs: dict[str, str], urls: list[str], failed: dict[str, str]) -> None:
        await each_endpoint(self.engine, method, kwargs, urls, failed, self.rpc_timeout_s)

    async def _stream(self, urls: list[str], failed: dict[str, str], stats: dict[str, float]) -> None:
        """Every bucket into every engine, double-buffered: the trainer writes bucket i + 1 into one slot while
        the engines load bucket i from the other."""
        n = len(self.buckets)
        write = asyncio.ensure_future(self._write(0, stats))
        try:
            for i in range(n):
                await write
                write = asyncio.ensure_future(self._write(i + 1, stats)) if i + 1 < n else None
                t = time.perf_counter()
                await self._load(i, urls, failed)
                stats["load_ms"] += (time.perf_counter() - t) * 1e3
                if write is None:
                    break
        finally:
            if write is not None and not write.done():
                write.cancel()
                with contextlib.suppress(BaseException):
                    await write

    async def _write(self, i: int, stats: dict[str, float]) -> None:
        """Bucket ``i`` into slot ``i % 2``: the trainer writes it there, or hands its bytes back (another host)."""
        assert self.shm is not None
        offset = (i % 2) * self._slot
        out = await self.trainer.write_weight_bucket(self.buckets[i], self.shm.name, 2 * self._slot, offset)
        stats["gather_ms"] += float(out.get("gather_ms", 0.0))
        stats["write_ms"] += float(out.get("write_ms", 0.0))
        if not out.get("written"):
            data = out["data"]
            self.shm.buf[offset:offset + len(data)] = data

    async def _load(self, i: int, urls: list[str], failed: dict[str, str]) -> None:
        """Every engine loads bucket ``i`` from its slot (this host) or from the call body (other hosts)."""
        assert self.shm is not None
        offset = (i % 2) * self._slot
        here = [u for u in urls if u not in self.remote]
        away = [u for u in urls if u in self.remote]
        calls = []
        if here:
            calls.append(self._each(LOAD_METHOD, {"shm_name": self.shm.name, "segment_bytes": str(2 * self._slot),
                                                  "offset": str(offset), "meta_json": self._metas[i]}, here, failed))
        if away:
            nbytes = layout_bytes(self.buckets[i])
            payload = await asyncio.to_thread(
                lambda: base64.b64encode(bytes(self.shm.buf[offset:offset + nbytes])).decode("ascii"))
            calls.append(self._each(LOAD_BYTES_METHOD, {"payload_b64": payload, "meta_json": self._metas[i]},
                                    away, failed))
        await asyncio.gather(*calls)

    def close(self) -> None:
        """Unlink the segment. Idempotent."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self.shm = None

    def __enter__(self) -> FullWeightSync:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextlib.asynccontextmanager
async def open_publisher(sync: FullSync, target: PublishTarget) -> AsyncIterator[Publisher]:
    """The ``full`` transport over ``target``'s engines: shared memory for the engines on this host, the call
    body for the others (``sync.carrier = "network"``: for every engine)."""
    with FullWeightSync(target.trainer, target.engines,
                        remote=await call_body_engines(sync.carrier, target.engines)) as publisher:
        yield publisher
