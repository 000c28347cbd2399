"""Padding training samples into tensors, and micro-batching by a token budget."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.core.types import TrainSample
from agentrl.trainer.errors import BatchError
from agentrl.trainer.kept import collate_kept


def collate(samples: Sequence[TrainSample], pad_id: int) -> dict[str, Tensor]:
    """Right-pad samples into ``input_ids_B_T``, ``attention_mask_B_T``, ``loss_mask_B_T``,
    ``behav_logprobs_B_T`` (float32), ``versions_B_T``, ``advantages_B`` and ``temperatures_B`` (float32);
    with ``routing_B_T_L_K`` (long, -1 where a position has no recorded routing) when any sample has MoE
    routing, and ``kept_row_B_T`` / ``kept_M_V`` when any has sampling masks (:mod:`agentrl.trainer.kept`)."""
    if not samples:
        raise BatchError("collate() needs at least one sample")
    B = len(samples)
    T = max(len(s.input_ids) for s in samples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention = torch.zeros((B, T), dtype=torch.long)
    loss_mask = torch.zeros((B, T), dtype=torch.float32)
    behav = torch.zeros((B, T), dtype=torch.float32)
    versions = torch.full((B, T), -1, dtype=torch.long)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        input_ids[b, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attention[b, :n] = 1
        loss_mask[b, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
        behav[b, :n] = torch.tensor(s.behav_logprobs, dtype=torch.float32)
        versions[b, :n] = torch.tensor(s.versions, dtype=torch.long)
    behav = behav * loss_mask
    out = {
        "input_ids_B_T": input_ids,
        "attention_mask_B_T": attention,
        "loss_mask_B_T": loss_mask,
        "behav_logprobs_B_T": behav,
        "versions_B_T": versions,
        "advantages_B": torch.tensor([float(s.advantage) for s in samples], dtype=torch.float32),
        "temperatures_B": torch.tensor([float(s.temperature) for s in samples], dtype=torch.float32),
    }
    routed = [s.routing for s in samples if s.routing is not None]
    if routed:
        shape = {(r.layers, r.top_k) for r in routed}
        if len(shape) > 1:
            raise BatchError(f"samples of one batch have routing of different shapes {sorted(shape)}")
        (L, K), = shape
        routing = torch.full((B, T, L, K), -1, dtype=torch.long)
        for b, s in enumerate(samples):
            if s.routing is not None and s.routing.n:
                routing[b, : s.routing.n] = torch.from_numpy(s.routing.array().astype("int64"))
        out["routing_B_T_L_K"] = routing
    out.update(collate_kept(samples, T))
    return out


def micro_batches(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Group the indices of samples of these lengths so each padded micro-batch (``len * max length``) fits
    ``max_tokens``.

    Samples are taken longest first, which keeps padding low; a sample longer than the budget gets a
    micro-batch of its own. Deterministic for a given input.
    """
    if max_tokens < 1:
        raise BatchError("max_tokens must be positive")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    current_max = 0
    for i in order:
        n = lengths[i]
        new_max = max(current_max, n)
        if current and new_max * (len(current) + 1) > max_tokens:
            groups.append(current)
            current, new_max = [], n
        current.append(i)
        current_max = new_max
    if current:
        groups.append(current)
    return groups


def split_minibatches(samples: Sequence[TrainSample], n: int) -> list[list[TrainSample]]:
    """Split a batch into ``n`` contiguous, near-equal minibatches (one optimizer step each); empty ones
    are left out."""
    size, extra = divmod(len(samples), n)
    out, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        if end > start:
            out.append(list(samples[start:end]))
        start = end
    return out
