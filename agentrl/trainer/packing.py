"""Sequence packing and token-balanced ranks (pure logic plus one collate; no model).

Packing puts several samples into one row of at most ``micro_batch_tokens`` tokens, with position ids that
restart at 0 for every sample. Given restarting ``position_ids`` and no attention mask, transformers builds a
block-diagonal causal mask (sdpa, eager, flex attention) or takes flash-attention's varlen path, so no token
attends across a sample boundary. The packed row's logprobs are then gathered back into the padded
``B x T`` layout of :func:`agentrl.trainer.batch.collate`, so the loss, its normalisers, the per-token
versions and the importance weights see exactly what they see without packing.

**Shared prompts.** The episodes of a GRPO group open on the same prompt (the system prompt, the tool list and
the task), often most of each episode's tokens. With sharing (``trainer.share_prefix``), samples of one row that
open on the same prompt form a *family*: the row holds the prompt once (the *prefix*, all but its last token)
and then each member's rest (the *suffix*, from the prompt's last token on), with position ids that continue
the prefix's. :func:`agentrl.trainer.attention.varlen_sdpa` lets each suffix attend to the prefix and to itself
causally (``prefix_layout_S_4``), so every token sees exactly the context it sees alone, and the gradients
through the prefix sum over the members. Each loss token is predicted from inside its own suffix (the duplicated
last prompt token predicts the first sampled one), so logprobs, loss and gradients equal the unshared ones to
float32 rounding, for a fraction of the tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from agentrl.core.errors import ConfigError
from agentrl.core.types import TrainSample
from agentrl.trainer.batch import collate
from agentrl.trainer.errors import BatchError
from agentrl.trainer.kept import mask_logits, pack_kept


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
        raise BatchError("max_tokens must be positive")
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


MIN_SHARED = 16
"""A prompt shorter than this is not shared (the bookkeeping would cost more than the tokens it saves)."""


def shared_len(sample: TrainSample) -> int:
    """How many leading tokens of ``sample`` a family may hold once: its prompt (the tokens before its first
    loss token) less the prompt's last token, which each suffix keeps; 0 when that is under :data:`MIN_SHARED`."""
    first = next((i for i, m in enumerate(sample.loss_mask) if m), len(sample.loss_mask))
    q = first - 1
    return q if q >= MIN_SHARED else 0


def shares_prefix(cfg: Any, config: Any) -> bool:
    """Whether a trainer of ``cfg`` (a ``TrainerConfig``) on a model of ``config`` packs shared prompts: it
    asks for them, packs under agentrl's varlen SDPA (the attention that reads the layout), and the model has
    no sliding window and no experts (routing replay is laid out per sample)."""
    if not (cfg.share_prefix and cfg.packing and cfg.attn_implementation == "sdpa"):
        return False
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    experts = any(getattr(config, k, None) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    return not window and not experts


def families(samples: Sequence[TrainSample]) -> list[list[int]]:
    """Indices grouped by the prompt their samples open on (same shared length and the same tokens), in order
    of first appearance; samples with nothing to share are families of one."""
    keys: dict[tuple[int, ...], list[int]] = {}
    out: list[list[int]] = []
    for i, s in enumerate(samples):
        q = shared_len(s)
        if q == 0:
            out.append([i])
            continue
        key = tuple(s.input_ids[:q + 1])  # the whole prompt: the shared part and the token each suffix repeats
        if key not in keys:
            keys[key] = []
            out.append(keys[key])
        keys[key].append(i)
    return out


def family_tokens(lengths: Sequence[int], q: int) -> int:
    """Row tokens of a family whose members have ``lengths`` and share ``q`` tokens."""
    return q + sum(n - q for n in lengths) if len(lengths) > 1 else sum(lengths)


def pack_shared(samples: Sequence[TrainSample], max_tokens: int) -> list[list[int]]:
    """:func:`pack` with shared prompts: families (:func:`families`, split where one would not fit a row) are
    packed first-fit decreasing by the tokens they take in a row. Each row lists its indices ascending."""
    if max_tokens < 1:
        raise BatchError("max_tokens must be positive")
    chunks: list[tuple[int, list[int]]] = []
    for fam in families(samples):
        q = shared_len(samples[fam[0]]) if len(fam) > 1 else 0
        current: list[int] = []
        for i in sorted(fam, key=lambda i: (-len(samples[i].input_ids), i)):
            n = len(samples[i].input_ids)
            if n > max_tokens:
                raise TooLongForBudget(too_long_message(n, max_tokens))
            trial = [*current, i]
            if current and family_tokens([len(samples[j].input_ids) for j in trial], q) > max_tokens:
                chunks.append((family_tokens([len(samples[j].input_ids) for j in current], q), current))
                trial = [i]
            current = trial
        chunks.append((family_tokens([len(samples[j].input_ids) for j in current], q), current))
    rows: list[list[int]] = []
    room: list[int] = []
    for cost, members in sorted(chunks, key=lambda c: (-c[0], min(c[1]))):
        for r, free in enumerate(room):
            if cost <= free:
                rows[r] += members
                room[r] -= cost
                break
        else:
            rows.append(list(members))
            room.append(max_tokens - cost)
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
        raise BatchError("world must be positive")
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


def collate_packed(samples: Sequence[TrainSample], pad_id: int, share: bool = False) -> dict[str, Tensor]:
    """:func:`collate`'s padded loss-side tensors (whose ``input_ids_B_T`` and ``attention_mask_B_T`` keep
    describing each sample) plus the packed row: ``input_ids_1_P``, ``position_ids_1_P`` (restarting at 0
    per sample), ``temperatures_P`` (each position's sample's temperature), ``cu_seq_lens_S1`` (int32: each
    sample's first position in the row, then the row's length, as flash-attention's varlen kernels take
    them), ``starts_S`` (the row positions where a sample's tokens begin, whose logprob is 0) and
    ``unpack_B_T`` (the row position of every padded position; 0 at padding). With MoE routing,
    ``routing_1_P_L_K`` replaces ``routing_B_T_L_K``. With ``share``, samples that open on the same prompt
    hold it once (see the module docstring) and ``prefix_layout_S_4`` says how: one line per sample, ``[prefix
    start, prefix length, suffix start, suffix length]`` (prefix length 0: the sample alone)."""
    fams = [f for f in families(samples) if len(f) > 1] if share else []
    if fams and not any(s.routing is not None for s in samples):
        return _collate_shared(samples, pad_id, fams)
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
    out["starts_S"] = torch.tensor(starts, dtype=torch.long)
    T = out["input_ids_B_T"].shape[1]
    unpack = torch.tensor(starts, dtype=torch.long)[:, None] + torch.arange(T)[None]
    out["unpack_B_T"] = torch.where(out["attention_mask_B_T"].bool(), unpack, torch.zeros_like(unpack))
    routing = out.pop("routing_B_T_L_K", None)
    if routing is not None:
        out["routing_1_P_L_K"] = torch.cat([routing[b, :n] for b, n in enumerate(lengths)])[None]
    pack_kept(out)
    return out


def _collate_shared(samples: Sequence[TrainSample], pad_id: int, fams: list[list[int]]) -> dict[str, Tensor]:
    """:func:`collate_packed` for a row whose families ``fams`` (two members or more) hold their prompt once."""
    out = collate(samples, pad_id)
    family_of = {i: f for f in fams for i in f}
    ids: list[int] = []
    pos: list[Tensor] = []
    temps: list[Tensor] = []
    layout: dict[int, list[int]] = {}
    starts: list[int] = []
    first_suffix: dict[int, int] = {}  # a family's first member -> the row position of its first suffix
    for i, s in enumerate(samples):
        if i in layout:
            continue
        fam = family_of.get(i, [i])
        q = shared_len(s) if len(fam) > 1 else 0
        p0 = len(ids)
        starts.append(p0)
        ids += s.input_ids[:q]
        pos.append(torch.arange(q))
        temps.append(torch.full((q,), float(s.temperature)))
        first_suffix[fam[0]] = len(ids)
        for j in fam:
            n = len(samples[j].input_ids)
            layout[j] = [p0, q, len(ids), n - q]
            ids += samples[j].input_ids[q:]
            pos.append(torch.arange(q, n))
            temps.append(torch.full((n - q,), float(samples[j].temperature)))
    out["input_ids_1_P"] = torch.tensor(ids, dtype=torch.long)[None]
    out["position_ids_1_P"] = torch.cat(pos)[None]
    out["temperatures_P"] = torch.cat(temps).float()
    out["cu_seq_lens_S1"] = torch.tensor([*starts, len(ids)], dtype=torch.int32)  # one span per family
    out["starts_S"] = torch.tensor(starts, dtype=torch.long)
    out["prefix_layout_S_4"] = torch.tensor([layout[i] for i in range(len(samples))], dtype=torch.long)
    T = out["input_ids_B_T"].shape[1]
    t = torch.arange(T)
    unpack = torch.zeros((len(samples), T), dtype=torch.long)
    for b in range(len(samples)):
        p0, q, s0, _ = layout[b]
        row = torch.where(t < q, p0 + t, s0 + t - q)
        if q:  # the prompt's last token is predicted at the prefix's end, which the family's first suffix follows
            row[q] = first_suffix[family_of[b][0]]
        unpack[b] = torch.where(out["attention_mask_B_T"][b].bool(), row, torch.zeros_like(row))
    out["unpack_B_T"] = unpack
    pack_kept(out)
    return out


def packed_token_logprobs(logits_P_V: Tensor, ids_P: Tensor, temperatures_P: Tensor, starts_S: Tensor,
                          chunk: int = 1024, kept_row_P: Tensor | None = None,
                          kept_M_V: Tensor | None = None) -> Tensor:
    """:func:`agentrl.trainer.loss.token_logprobs` for a packed row: position ``p`` holds
    ``log p(ids[p] | its sample's tokens before p)`` at its sample's temperature, and each sample's first
    position holds 0. Float32, ``chunk`` positions at a time, so no ``P x V`` float32 copy is made at once."""
    P = ids_P.shape[0]
    out_P = logits_P_V.new_zeros((P,), dtype=torch.float32)
    parts = []
    for lo in range(1, P, chunk):
        hi = min(lo + chunk, P)
        logits = logits_P_V[lo - 1 : hi - 1].float() / temperatures_P[lo:hi, None].to(logits_P_V.device)
        if kept_row_P is not None:
            logits = mask_logits(logits, kept_row_P[lo:hi], kept_M_V)
        picked = logits.gather(-1, ids_P[lo:hi, None]).squeeze(-1)
        parts.append(picked - torch.logsumexp(logits, dim=-1))
    if parts:
        out_P = torch.cat([out_P[:1], *parts])
    keep_P = torch.ones(P, dtype=out_P.dtype, device=out_P.device)
    keep_P[starts_S.to(out_P.device)] = 0.0
    return out_P * keep_P
