"""Weight sync through POSIX shared memory: no files, the engine copies the adapter in place.

The trainer's LoRA tensors are written into one persistent shared-memory segment (allocated once, reused
while the layout stays the same; owned here and unlinked on ``close``). Every engine then runs the worker
method ``agentrl_update_lora`` (:mod:`agentrl.engine.adapter`) over ``POST /collective_rpc``, which
copies them into the adapter's live slot and its cached copy. The engine core sets the new weight version
and drops the prefix cache in the same call when it runs in-process; otherwise this is done over HTTP.
Engines on another host cannot map the segment: :func:`open_publisher` (the ``shm`` transport) probes every
engine once and serves those over the network transport (:mod:`agentrl.weight_sync.network`), and falls back to
files (:mod:`agentrl.weight_sync.file`) when an engine refuses the update (the adapter is not loaded yet).
The engine half is :mod:`agentrl.engine.transports.shm`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import time
import weakref
from collections.abc import AsyncIterator
from multiprocessing import shared_memory
from typing import Any

import torch

from agentrl.config.sync import ShmSync
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import AdapterSource, EngineRPC, Publisher, PublishTarget
from agentrl.weight_sync.control import controlled
from agentrl.weight_sync.file import FileAdapterSync
from agentrl.weight_sync.hosts import RoutedAdapterSync, engines_on_this_host
from agentrl.weight_sync.inplace import (
    Layout,
    SyncError,
    after_copy,
    applied,
    control_stages,
    fill,
    layout_meta,
    layout_views,
    pack_layout,
    release_segment,
    worker_failures,
)
from agentrl.weight_sync.network import NetworkAdapterSync

UPDATE_METHOD = "agentrl_update_lora"


class SharedMemoryAdapterSync:
    """Publish adapters through shared memory: gather (trainer) → write segment → in-place copy (engines).

    ``reset``: "1" drops the prefix cache when no request is running (vLLM refuses otherwise; reported as
    ``prefix_reset_ok`` = 0), "running" also preempts running requests so none continues on KV computed
    with the old weights. ``b_scale``: the adapter's scaling (``lora_alpha / r``), when the publisher knows it:
    the B tensors are written pre-scaled, so the engine's update is a copy and nothing more (an engine whose
    adapter scales a module otherwise refuses the update, which then goes through ``fallback``).
    """

    def __init__(self, trainer: AdapterSource, engine: EngineRPC, name: str, *, fallback: Publisher | None = None,
                 set_version: bool = True, reset: str = "1", rpc_timeout_s: float = 30.0,
                 b_scale: float | None = None) -> None:
        self.trainer = trainer
        self.b_scale = b_scale
        self.engine = engine
        self.name = name
        self.fallback = fallback
        self.set_version = set_version
        self.reset = reset
        self.rpc_timeout_s = rpc_timeout_s
        self.shm: shared_memory.SharedMemory | None = None
        self._finalizer: weakref.finalize | None = None
        self._layout: Layout = []
        self._nbytes = 0
        self._trainer_declined = False
        self._layout_id = ""
        self._meta_json = ""
        self._views: list[torch.Tensor] = []

    @property
    def atomic(self) -> bool:
        """Whether every engine applies a publish between two of its steps with the new label, so that no pause is
        needed around it: engines reached over local control links
        (:class:`agentrl.weight_sync.control.ControlledEngines`)."""
        return bool(getattr(self.engine, "atomic", False))

    @property
    def shm_name(self) -> str | None:
        """Name of the current segment (``/dev/shm/<name>``), if allocated."""
        return self.shm.name if self.shm is not None else None

    def write(self, tensors: dict[str, torch.Tensor]) -> int:
        """Copy ``tensors`` into the segment (allocating it on first use or when the layout changes); bytes."""
        layout, offset = pack_layout(tensors)
        if layout != self._layout or self.shm is None or self.shm.size < offset:
            self._allocate(layout, max(offset, 1))
        fill(self._views, layout, tensors, self.b_scale)
        return offset

    async def _trainer_writes(self) -> bool:
        """Ask a trainer that can (``write_adapter``: one rank, the adapter gathered once) to write the adapter into
        the segment itself, once the segment and its layout exist; whether it did (else the tensors are gathered
        through the trainer's connection and written here). A trainer that declined (several ranks) is not asked
        again until the layout changes: a publish pays no extra round trip for it."""
        write = getattr(self.trainer, "write_adapter", None)
        if write is None or self.shm is None or not self._layout or self._trainer_declined:
            return False
        wrote = bool((await write(self._layout, self.shm.name, self._nbytes, self.b_scale)).get("written"))
        self._trainer_declined = not wrote
        return wrote

    def _allocate(self, layout: Layout, nbytes: int) -> None:
        if self.shm is None or self.shm.size < nbytes:
            self._close_segment()
            name = f"agentrl_lora_{os.getpid()}_{secrets.token_hex(4)}"
            self.shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
            self._finalizer = weakref.finalize(self, release_segment, self.shm)
        self._views = layout_views(torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=nbytes), layout)
        self._layout = layout
        self._nbytes = nbytes
        self._trainer_declined = False
        self._meta_json = layout_meta(layout, nbytes, self.b_scale)
        self._layout_id = hashlib.sha1(f"{self.shm.name}:{self._meta_json}".encode()).hexdigest()[:16]

    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine; returns each stage's time in ms (and ``sync_s``)."""
        t0 = time.perf_counter()
        wrote = await self._trainer_writes()
        if wrote:
            t1 = t2 = time.perf_counter()
            nbytes = self._nbytes
        else:
            tensors = await self.trainer.get_adapter_tensors()
            t1 = time.perf_counter()
            nbytes = self.write(tensors)
            t2 = time.perf_counter()
        assert self.shm is not None
        kwargs = {"adapter": self.name, "shm_name": self.shm.name, "meta_json": self._meta_json,
                  "layout_id": self._layout_id, "weight_version": engine_label(version) if self.set_version else "",
                  "reset_prefix_cache": self.reset}
        results = await self.engine.collective_rpc(UPDATE_METHOD, kwargs=kwargs, timeout=self.rpc_timeout_s)
        t3 = time.perf_counter()
        workers = [w for per_endpoint in results for w in per_endpoint]
        bad = worker_failures(workers)
        workers = applied(workers)
        if bad or not workers:
            why = "; ".join(bad) or "no worker answered"
            if self.fallback is None:
                raise SyncError(f"in-place LoRA update refused: {why}")
            if not self.atomic:
                out = await self.fallback.publish(version)
            else:  # the caller did not pause (the copy would have been atomic): the file load is not
                await self.engine.pause("keep")
                try:
                    out = await self.fallback.publish(version)
                finally:
                    await self.engine.resume()
            return {**out, "fallback": 1.0}
        reset_ok = await after_copy(self.engine, workers, version, set_version=self.set_version, reset=self.reset)
        t4 = time.perf_counter()
        in_engine_reset = max((float(w.get("reset_ms") or 0.0) for w in workers), default=0.0)
        return {
            **control_stages(workers),
            "trainer_gather_ms": (t1 - t0) * 1e3,  # or, with trainer_wrote, the trainer's write into the segment
            "shm_write_ms": (t2 - t1) * 1e3,
            "trainer_wrote": float(wrote),
            "rpc_ms": (t3 - t2) * 1e3,
            "engine_ms": max(float(w["engine_ms"]) for w in workers),
            "engine_copy_ms": max(float(w.get("live_ms", 0.0)) for w in workers),  # the copy alone, no plan lookup
            # the rest of engine_ms: finding (or building, once per adapter and layout) the copy plan, and what
            # follows the copy (the CPU copy's bookkeeping, layers vLLM re-slices)
            "engine_plan_ms": max(float(w.get("plan_ms", 0.0)) for w in workers),
            "engine_after_copy_ms": max(float(w.get("cache_ms", 0.0)) for w in workers),
            # copies the engine made for the live slot: 1 where its slots are laid out as the segment
            "engine_copies": max(float(w.get("copies", 0)) for w in workers),
            "prefix_reset_ms": in_engine_reset + (t4 - t3) * 1e3,
            "prefix_reset_ok": reset_ok,  # 1 done, 0 refused (requests running), -1 over HTTP (unchecked)
            "total_ms": (t4 - t0) * 1e3,
            "sync_s": t4 - t0,
            "adapter_bytes": float(nbytes),
        }

    def _close_segment(self) -> None:
        self._views = []
        self._layout = []
        if self._finalizer is not None:
            self._finalizer()  # close + unlink, once
            self._finalizer = None
        self.shm = None

    def close(self) -> None:
        """Unlink the segment (engines keep a mapping until their next update or exit). Idempotent."""
        self._close_segment()

    def __enter__(self) -> SharedMemoryAdapterSync:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@contextlib.asynccontextmanager
async def open_publisher(sync: ShmSync, target: PublishTarget) -> AsyncIterator[Publisher]:
    """The ``shm`` transport over ``target``'s engines: shared memory for the engines on this host (over their
    local control sockets where ``sync.control`` asks for them and they can open one; files when an engine
    refuses), the network transport for the others. Its first ``publish`` creates the engines' LoRA slots.
    No prefix-cache resets: rollouts salt the cache with the policy version instead."""
    client, name, b_scale = target.engines, target.adapter_name, target.b_scale
    local = await engines_on_this_host(client)
    here = [u for u, ok in local.items() if ok]
    away = [u for u, ok in local.items() if not ok]
    groups: list[tuple[str, Publisher, int]] = []
    async with contextlib.AsyncExitStack() as stack:
        if here:
            sub = client.subset(here)
            fast = await stack.enter_async_context(controlled(sub, enabled=sync.control == "socket"))
            shm = SharedMemoryAdapterSync(target.trainer, fast, name, reset="", b_scale=b_scale,
                                          fallback=FileAdapterSync(target.trainer, sub, target.adapter_dir, name))
            groups.append(("shm", stack.enter_context(shm), len(here)))
        if away:
            groups.append(("network", NetworkAdapterSync(target.trainer, client.subset(away), name,
                                                         target.adapter_dir / "network", reset="", b_scale=b_scale),
                           len(away)))
        yield groups[0][1] if len(groups) == 1 else RoutedAdapterSync(groups)
