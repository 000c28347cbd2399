"""Weight sync through POSIX shared memory: no files, the engine copies the adapter in place.

The trainer's LoRA tensors are written into one persistent shared-memory segment (allocated once, reused
while the layout stays the same; owned here and unlinked on ``close``). Every engine then runs the worker
method ``agentrl_update_lora`` (:mod:`agentrl.engine.adapter`) over ``POST /collective_rpc``, which
copies them into the adapter's live slot and its cached copy. The engine core sets the new weight version
and drops the prefix cache in the same call when it runs in-process; otherwise this is done over HTTP.
Engines on another host cannot map the segment: use :class:`agentrl.weight_sync.file.FileAdapterSync` there (it is
also the ``fallback`` when an engine refuses the update, e.g. the adapter is not loaded yet).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
import weakref
from multiprocessing import shared_memory
from typing import Any

import torch

from agentrl.core.errors import WeightSyncError
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import AdapterSource, EngineRPC, Publisher

UPDATE_METHOD = "agentrl_update_lora"
_ALIGN = 64


class SyncError(WeightSyncError, RuntimeError):
    """An engine refused the in-place update and there is no fallback."""

    code = "weight_sync.publish_failed"


Layout = list[tuple[str, str, list[int], int]]
"""Packed adapter tensors: (peft name, dtype, shape, byte offset) in name order, each 64-byte aligned."""


def pack_layout(tensors: dict[str, torch.Tensor]) -> tuple[Layout, int]:
    """Where each tensor goes in one packed buffer, and the buffer's size in bytes (the same layout for
    shared memory and for the network payload: the worker extension reads both the same way)."""
    layout: Layout = []
    offset = 0
    for n in sorted(tensors):
        t = tensors[n]
        layout.append((n, str(t.dtype).removeprefix("torch."), list(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    return layout, offset


def layout_views(buf: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Typed views of each tensor's place in the uint8 buffer ``buf``."""
    views = []
    for _, dtype, shape, off in layout:
        dt = getattr(torch, dtype)
        size = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
        views.append(buf[off:off + size].view(dt).view(shape))
    return views


def layout_meta(layout: Layout, nbytes: int, b_scale: float | None) -> str:
    """The engines' description of a packed buffer: its layout, and ``b_scaled`` when the B tensors in it are
    already multiplied by the adapter's scaling (the engine then checks that scaling against its own, per
    module, instead of scaling each update again)."""
    meta: dict[str, Any] = {"nbytes": nbytes, "tensors": layout}
    if b_scale is not None:
        meta["b_scaled"] = b_scale
    return json.dumps(meta, separators=(",", ":"))


def fill(views: list[torch.Tensor], layout: Layout, tensors: dict[str, torch.Tensor], b_scale: float | None) -> None:
    """Copy ``tensors`` into their ``views`` of a packed buffer, the B tensors (``lora_B``) multiplied by
    ``b_scale`` when given: done here, on the publisher's side, the engine's update is one copy."""
    torch._foreach_copy_(views, [tensors[n] for n, *_ in layout])
    if b_scale is not None and b_scale != 1.0:
        torch._foreach_mul_([v for v, (n, *_) in zip(views, layout, strict=True) if ".lora_B." in n], b_scale)


def worker_failures(workers: list[Any]) -> list[str]:
    """Why each worker that did not apply the update refused it (empty: every worker applied it). An
    endpoint out of rotation (a ``down`` record of ``collective_rpc``) is not a refusal: it rejoins later
    with the weights of that time."""
    return [str(w.get("error") if isinstance(w, dict) else w) for w in workers
            if not (isinstance(w, dict) and (w.get("ok") or w.get("down")))]


def applied(workers: list[Any]) -> list[dict[str, Any]]:
    """The workers' records of an applied update (down endpoints left out)."""
    return [w for w in workers if isinstance(w, dict) and w.get("ok")]


async def after_copy(engine: EngineRPC, workers: list[dict[str, Any]], version: int, *, set_version: bool,
                     reset: str) -> float:
    """After an in-place copy: label the weights and reset the prefix cache over HTTP where the workers could
    not do it in their engine core (workers in processes of their own: tensor parallelism, or a backend
    chosen in ``inference.extra_args``). Returns the
    reset's status: 1 done, 0 refused (requests running), -1 done over HTTP (unchecked)."""
    reset_ok = float(all(w.get("prefix_reset") for w in workers))
    calls = []
    if reset and not reset_ok and not any(w.get("reset_ms") is not None for w in workers):
        calls.append(engine.reset_prefix_cache())
        reset_ok = -1.0  # done over HTTP; the client does not report vLLM's success flag
    if set_version and not all(w.get("version_set") for w in workers):
        calls.append(engine.set_weight_version(engine_label(version)))
    await asyncio.gather(*calls)  # both after the copy; their relative order does not matter
    return reset_ok


def control_stages(workers: list[dict[str, Any]]) -> dict[str, float]:
    """The control-link figures of applied worker records (none when every engine took HTTP):
    ``control_queue_ms``, the longest wait of a message for the engine's current step to end, and
    ``engines_control``, how many workers were reached over a link."""
    over = [w for w in workers if w.get("control_core_ms") is not None]
    if not over:
        return {}
    return {"control_queue_ms": max(float(w.get("control_queue_ms") or 0.0) for w in over),
            "engines_control": float(len(over))}


def _release(shm: shared_memory.SharedMemory) -> None:
    """Close and unlink ``shm`` (idempotent; used by ``close`` and at interpreter exit)."""
    try:
        shm.close()
    except BufferError:  # a tensor view is still alive: the mapping goes when it does
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass


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

    def _allocate(self, layout: Layout, nbytes: int) -> None:
        if self.shm is None or self.shm.size < nbytes:
            self._close_segment()
            name = f"agentrl_lora_{os.getpid()}_{secrets.token_hex(4)}"
            self.shm = shared_memory.SharedMemory(name=name, create=True, size=nbytes)
            self._finalizer = weakref.finalize(self, _release, self.shm)
        self._views = layout_views(torch.frombuffer(self.shm.buf, dtype=torch.uint8, count=nbytes), layout)
        self._layout = layout
        self._meta_json = layout_meta(layout, nbytes, self.b_scale)
        self._layout_id = hashlib.sha1(f"{self.shm.name}:{self._meta_json}".encode()).hexdigest()[:16]

    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine; returns each stage's time in ms (and ``sync_s``)."""
        t0 = time.perf_counter()
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
            "trainer_gather_ms": (t1 - t0) * 1e3,
            "shm_write_ms": (t2 - t1) * 1e3,
            "rpc_ms": (t3 - t2) * 1e3,
            "engine_ms": max(float(w["engine_ms"]) for w in workers),
            "engine_copy_ms": max(float(w.get("live_ms", 0.0)) for w in workers),  # the copy alone, no plan lookup
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
