"""Sequence packing and token-balanced ranks (pure logic plus one collate; no model).

Packing puts several samples into one row of at most ``micro_batch_tokens`` tokens, with position ids that
restart at 0 for every sample. Given restarting ``position_ids`` and no attention mask, transformers builds a
block-diagonal causal mask (sdpa, eager, flex attention) or takes flash-attention's varlen path, so no token
attends across a sample boundary. The packed row's logprobs are then gathered back into the padded
``B x T`` layout of :func:`agentrl.trainer.batch.collate`, so the loss, its normalisers, the per-token
versions and the importance weights see exactly what they see without packing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from agentrl.errors import ConfigError
from agentrl.trainer.batch import collate
from agentrl.types import TrainSample


class TooLongForBudget(ConfigError, ValueError):
    """A sample is longer than one micro-batch's token budget (``trainer.micro_batch_tokens``)."""

    code = "config.too_long_for_budget"


def too_long_message(length: int, budget: int) -> str:
    """Why a sample of ``length`` tokens cannot be trained under a ``budget``-token micro-batch."""
    return (f"a training sample of {length} tokens is longer than trainer.micro_batch_tokens = {budget}, the "
            "activation budget of one forward/backward: set sampling.max_context_tokens <= "
            "trainer.micro_batch_tokens (or raise the budget)")


def pack(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped into rows of at most ``max_tokens`` tokens: first-fit decreasing (longest first, each
    into the first row with room). Deterministic for a given input; each row lists its indices in ascending
    order. Raises :class:`TooLongForBudget` for a sample longer than the budget."""
    if max_tokens < 1:
        raise ValueError("max_tokens must be positive")
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        n = lengths[i]
        if n > max_tokens:
            raise TooLongForBudget(too_long_message(n, max_tokens))
        for r, free in enumerate(room):
            if n <= free:
                rows[r].append(i)
                room[r] -= n
                break
        else:
            rows.append([i])
            room.append(max_tokens - n)
    return [sorted(row) for row in rows]


def sequence_cost(length: int, attention_len: float) -> float:
    """Relative compute of one sequence of ``length`` tokens: ``length * (1 + length / attention_len)``.

    Per layer a token costs about ``2 P`` flops in the dense layers (``P`` parameters per layer) and, on
    average over a causal sequence of ``n``, ``2 d n`` in attention (``d`` = heads x head dim), so a
    sequence costs ``2 P n (1 + n d / P)``: ``attention_len = P / d`` is the length at which attention
    doubles a token's cost (about 16k for Qwen2-0.5B). ``inf`` counts tokens alone."""
    return length * (1.0 + length / attention_len)


def attention_len(config: object) -> float:
    """``P / d`` (see :func:`sequence_cost`) of a Hugging Face decoder config, from its shapes; ``inf`` when
    they are missing."""
    h = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    if not h or not heads:
        return float("inf")
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    inter = getattr(config, "moe_intermediate_size", None) or getattr(config, "intermediate_size", None) or 4 * h
    active = getattr(config, "num_experts_per_tok", None) or 1
    d = heads * head_dim
    params = 2 * h * d + 2 * h * kv * head_dim + 3 * h * inter * active
    return params / d


def balance(costs: Sequence[float], world: int) -> list[list[int]]:
    """Indices dealt to ``world`` ranks so their summed costs are close: largest first, each to the rank
    with the least so far (ties to the lower rank). Deterministic; each rank's indices ascend."""
    if world < 1:
        raise ValueError("world must be positive")
    loads = [0.0] * world
    out: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        out[r].append(i)
        loads[r] += costs[i]
    return [sorted(idx) for idx in out]


def strided(n: int, world: int) -> list[list[int]]:
    """Indices dealt round-robin, ``rank::world``, whatever their lengths (balancing off)."""
    return [list(range(n))[r::world] for r in range(world)]


def collate_packed(samples: Sequence[TrainSample], pad_id: int) -> dict[str, Tensor]:
    """:func:`collate`'s padded loss-side tensors (whose ``input_ids_B_T`` and ``attention_mask_B_T`` keep
    describing each sample) plus the packed row: ``input_ids_1_P``, ``position_ids_1_P`` (restarting at 0
    per sample), ``temperatures_P`` (each position's sample's temperature), ``cu_seq_lens_S1`` (int32: each
    sample's first position in the row, then the row's length, as flash-attention's varlen kernels take
    them) and ``unpack_B_T`` (the row position of every padded position; 0 at padding). With
    MoE routing, ``routing_1_P_L_K`` replaces ``routing_B_T_L_K``."""
    out = collate(samples, pad_id)
    lengths = [len(s.input_ids) for s in samples]
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    out["input_ids_1_P"] = torch.tensor([t for s in samples for t in s.input_ids], dtype=torch.long)[None]
    out["position_ids_1_P"] = torch.cat([torch.arange(n) for n in lengths])[None]
    out["temperatures_P"] = torch.cat(
        [torch.full((n,), float(s.temperature), dtype=torch.float32) for s, n in zip(samples, lengths, strict=True)])
    out["cu_seq_lens_S1"] = torch.tensor([*starts, sum(lengths)], dtype=torch.int32)
    T = out["input_ids_B_T"].shape[1]
    unpack = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(T)[None]
    out["unpack_B_T"] = torch.where(out["attention_mask_B_T"].bool(), unpack, torch.zeros_like(unpack))
    routing = out.pop("routing_B_T_L_K", None)
    if routing is not None:
        out["routing_1_P_L_K"] = torch.cat([routing[b, :n] for b, n in enumerate(lengths)])[None]
    return out


def packed_token_logprobs(logits_P_V: Tensor, ids_P: Tensor, temperatures_P: Tensor, starts_S: Tensor,
                          chunk: int = 1024) -> Tensor:
    """:func:`agentrl.trainer.loss.token_logprobs` for a packed row: position ``p`` holds
    ``log p(ids[p] | its sample's tokens before p)`` at its sample's temperature, and each sample's first
    position holds 0. Float32, ``chunk`` positions at a time, so no ``P x V`` float32 copy is made at once."""
    P = ids_P.shape[0]
    out_P = logits_P_V.new_zeros((P,), dtype=torch.float32)
    parts = []
    for lo in range(1, P, chunk):
        hi = min(lo + chunk, P)
        logits = logits_P_V[lo - 1 : hi - 1].float() / temperatures_P[lo:hi, None].to(logits_P_V.device)
        picked = logits.gather(-1, ids_P[lo:hi, None]).squeeze(-1)
        parts.append(picked - torch.logsumexp(logits, dim=-1))
    if parts:
        out_P = torch.cat([out_P[:1], *parts])
    keep_P = torch.ones(P, dtype=out_P.dtype, device=out_P.device)
    keep_P[starts_S.to(out_P.device)] = 0.0
    return out_P * keep_P
