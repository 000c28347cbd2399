"""What the transports that copy packed tensors into engines share (:mod:`agentrl.weight_sync.shm`,
:mod:`~agentrl.weight_sync.network`, :mod:`~agentrl.weight_sync.merged`, :mod:`~agentrl.weight_sync.full`):
the packed layout of an adapter's tensors (the same in a shared-memory segment and in a call body), the
workers' records of an applied or refused copy, and the label and reset after a copy.
"""

from __future__ import annotations

import asyncio
import json
from multiprocessing import shared_memory
from typing import Any

import torch

from agentrl.core.errors import WeightSyncError
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import EngineRPC

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


def release_segment(shm: shared_memory.SharedMemory) -> None:
    """Close and unlink ``shm`` (idempotent; used by ``close`` and at interpreter exit)."""
    try:
        shm.close()
    except BufferError:  # a tensor view is still alive: the mapping goes when it does
        pass
    try:
        shm.unlink()
    except FileNotFoundError:
        pass
