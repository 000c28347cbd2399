"""Full-weight sync, trainer side: the model's parameters in engine order, and one bucket of them gathered
from the FSDP2 shards, cast to the engine's dtype and written where the publisher asked.

Every rank runs each call. When every rank can map the publisher's shared-memory segment (the trainer's node
is the engines' host), each rank writes its own FSDP2 shard of every parameter straight into the slot, cast to
the engine's dtype: dim-0 shards are contiguous rows, so no collective moves any weight and the ranks copy in
parallel. Otherwise the ranks gather the bucket (``full_tensor()``, one parameter at a time) and rank 0 writes it
there, or hands its bytes back through the trainer connection (another host). Either way at most one bucket is
held, never the whole model.

A LoRA model publishes its adapter instead (its tensors: ``agentrl.trainer.model_io.gather_trainable``); engines
that serve it merged into their weights do the merge themselves (``agentrl.engine.merge``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from agentrl.core.errors import WeightSyncError
from agentrl.weight_sync.buckets import Layout, layout_bytes
from agentrl.weight_sync.worker_io import attach_segment


class UnknownLayoutWeight(WeightSyncError, KeyError):
    """A weight-sync layout names a weight the trained model does not have."""

    code = "weight_sync.layout_unknown_weight"


class LayoutShapeMismatch(WeightSyncError, ValueError):
    """A weight's full shape in the trained model is not the one the weight-sync layout gives it."""

    code = "weight_sync.layout_shape"


def weight_specs(model: nn.Module) -> list[tuple[str, list[int]]]:
    """Every parameter's Hugging Face name and full (unsharded) shape, in model order (tied weights once)."""
    return [(name, list(p.shape)) for name, p in model.named_parameters()]


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if isinstance(t, DTensor) else t).detach()


def _layout_params(model: nn.Module, layout: Layout) -> Iterator[nn.Parameter]:
    """Each of ``layout``'s parameters, checked against its name and full shape in the layout."""
    params = dict(model.named_parameters())
    for name, _, shape, _ in layout:
        p = params.get(name)
        if p is None:
            raise UnknownLayoutWeight(f"{name} is not a parameter of the trained model")
        if list(p.shape) != list(shape):
            raise LayoutShapeMismatch(f"{name}: the model's shape {list(p.shape)} is not the layout's {shape}")
        yield p


def _full_tensors(model: nn.Module, layout: Layout) -> Iterator[torch.Tensor]:
    """Collective, one parameter at a time: the full tensor of each of ``layout``'s parameters (every rank
    must consume the whole iterator)."""
    for p in _layout_params(model, layout):
        yield _full(p)


def _row_offset(p: DTensor, rank: int, world: int) -> int | None:
    """The first global row of this rank's dim-0 shard of ``p`` (``torch.chunk`` split, as FSDP2 shards), or
    None when ``p`` is not sharded that way (then it is gathered)."""
    if tuple(p.placements) != (Shard(0),) or p.device_mesh.ndim != 1:
        return None
    n = p.shape[0]
    size = -(-n // world)
    start = min(rank * size, n)
    return start if p.to_local().shape[0] == max(0, min(size, n - start)) else None


class BucketWriter:
    """Each rank's mapping of the publisher's segment, kept while it is the same segment."""

    def __init__(self) -> None:
        self._name = ""
        self._mapping: tuple[Any, torch.Tensor] | None = None

    def _segment(self, name: str, size: int) -> torch.Tensor | None:
        if self._mapping is None or self._name != name or self._mapping[1].numel() < size:
            self._mapping = None
            try:
                self._mapping = attach_segment(name, size)
            except (OSError, ValueError):
                return None  # another host: the bucket is gathered instead
            self._name = name
        return self._mapping[1]

    def write_adapter(self, live: dict[str, torch.Tensor] | None, layout: Layout, shm_name: str, segment_bytes: int,
                      b_scale: float | None) -> dict[str, Any]:
        """Rank 0 of a single-rank trainer: the adapter's tensors ``live`` (by name; None where the trainer has
        no plan of them yet) into segment ``shm_name`` at the places of ``layout``, B scaled by ``b_scale``.
        ``written`` False where ``live`` packs into another layout (names, dtypes, shapes), or the segment cannot
        be mapped: the publisher then gathers the tensors."""
        from agentrl.weight_sync.inplace import fill, layout_views, pack_layout

        t0 = time.perf_counter()
        if live is None or pack_layout(live)[0] != [tuple(e) for e in layout]:
            return {"written": False}
        seg = self._segment(shm_name, segment_bytes)
        if seg is None:
            return {"written": False}
        fill(layout_views(seg[:segment_bytes], layout), layout, live, b_scale)
        return {"written": True, "write_ms": (time.perf_counter() - t0) * 1e3}

    def write(self, model: nn.Module, layout: Layout, shm_name: str | None, segment_bytes: int,
              offset: int) -> dict[str, Any]:
        """Collective: bucket ``layout`` at ``offset`` of segment ``shm_name``: every rank writes its shards
        when all can map it, else rank 0 writes the gathered bucket, or returns its packed bytes as ``data``
        (no segment, or one rank 0 cannot map)."""
        t0 = time.perf_counter()
        rank, world = dist.get_rank(), dist.get_world_size()
        seg = self._segment(shm_name, segment_bytes) if shm_name else None
        mapped = torch.tensor([int(seg is not None)])
        if world > 1:
            dist.all_reduce(mapped, op=dist.ReduceOp.MIN)
        if mapped.item():
            assert seg is not None
            return self._write_shards(model, layout, seg[offset:], t0)
        return self._write_gathered(_full_tensors(model, layout), layout,
                                    seg[offset:] if rank == 0 and seg is not None else None, t0)

    def _write_shards(self, model: nn.Module, layout: Layout, slot: torch.Tensor, t0: float) -> dict[str, Any]:
        """Every rank copies its rows of each parameter into ``slot``; parameters not sharded by rows are
        gathered and written by rank 0. Returns once every rank is done (a barrier)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        gathered_s = 0.0
        for (_, dtype, shape, off), p in zip(layout, _layout_params(model, layout), strict=True):
            dt = getattr(torch, dtype)
            full = slot[off:off + p.numel() * dt.itemsize].view(dt).view(shape)
            start = _row_offset(p, rank, world) if isinstance(p, DTensor) else None
            if start is not None:
                local = p.to_local().detach()
                full[start:start + local.shape[0]].copy_(local)
            elif isinstance(p, DTensor):
                t = time.perf_counter()
                whole = p.full_tensor().detach()
                gathered_s += time.perf_counter() - t
                if rank == 0:
                    full.copy_(whole)
            elif rank == 0:
                full.copy_(p.detach())
        t1 = time.perf_counter()
        if world > 1:
            dist.barrier()
        if rank != 0:
            return {}
        return {"written": True, "bytes": layout_bytes(layout), "mode": "shards", "gather_ms": gathered_s * 1e3,
                "write_ms": (t1 - t0 - gathered_s) * 1e3, "barrier_ms": (time.perf_counter() - t1) * 1e3}

    def _write_gathered(self, fulls: Iterator[torch.Tensor], layout: Layout, slot: torch.Tensor | None,
                        t0: float) -> dict[str, Any]:
        """Gather each tensor (``fulls``: collective); rank 0 writes it into ``slot`` (or a buffer whose bytes it
        returns)."""
        rank0 = dist.get_rank() == 0
        nbytes = layout_bytes(layout)
        buf = slot[:nbytes] if slot is not None else torch.zeros(nbytes if rank0 else 0, dtype=torch.uint8)
        write_s = 0.0
        for (_, dtype, shape, off), full in zip(layout, fulls, strict=True):
            if rank0:  # one copy: cast to the engine's dtype and move to the host in the same step
                t = time.perf_counter()
                dt = getattr(torch, dtype)
                buf[off:off + full.numel() * dt.itemsize].view(dt).view(shape).copy_(full)
                write_s += time.perf_counter() - t
        if not rank0:
            return {}
        total_s = time.perf_counter() - t0
        out: dict[str, Any] = {"written": slot is not None, "bytes": nbytes, "mode": "gathered",
                               "gather_ms": (total_s - write_s) * 1e3, "write_ms": write_s * 1e3}
        if slot is None:
            out["data"] = buf.numpy().tobytes()
        return out
