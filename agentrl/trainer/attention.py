"""Variable-length attention for packed rows through PyTorch's SDPA, with no mask and no padding.

transformers keeps a packed row's samples apart in two ways: flash-attention's varlen kernels read
``cu_seq_lens_q`` / ``cu_seq_lens_k``, and every other implementation gets a block-diagonal mask built
from restarting position ids. With SDPA that mask is a dense ``P x P`` tensor, and the attention kernel
still computes every block of it: a row of 4096 tokens holding 20 samples of about 200 costs 20 times
the attention of the same samples padded. :data:`VARLEN_SDPA` is an attention implementation that reads
the same ``cu_seq_lens`` as flash-attention and runs causal SDPA on each sample's slice of the row
(SDPA's own flash or memory-efficient kernel where it has one), so attention costs what the samples
need and the dense layers see no padding. Without ``cu_seq_lens`` (a padded batch) it is plain SDPA.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from agentrl.trainer.errors import BatchError, TrainerSettingError

VARLEN_SDPA = "agentrl_varlen_sdpa"
"""The name under which :func:`varlen_sdpa` is registered with transformers."""


def varlen_sdpa(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature (``B x heads x T x D`` in, ``B x T x heads x D`` out). With
    no mask: causal SDPA (within the model's sliding window, if any) per sample of a packed row
    (``cu_seq_lens_q``, or position ids that restart), or over whole rows. With a padding mask:
    transformers' SDPA."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    bounds = _bounds(kwargs, query.shape[0]) or [0, query.shape[2]]
    window = kwargs.get("sliding_window")
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    layout = kwargs.get("prefix_layout_S_4")
    if layout is not None:
        if window is not None:
            raise TrainerSettingError("shared prompts (trainer.share_prefix) do not support sliding-window attention")
        return _shared(query, key, value, layout, dropout, scaling), None
    parts = []
    for lo, hi in itertools.pairwise(bounds):
        if hi <= lo:
            continue
        q, k, v = query[:, :, lo:hi], key[:, :, lo:hi], value[:, :, lo:hi]
        if window is None or hi - lo <= window:  # the window reaches back past the sample's start: causal
            parts.append(F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling, is_causal=True))
        else:
            parts.append(F.scaled_dot_product_attention(q, k, v, attn_mask=_band(hi - lo, window, q.device),
                                                        dropout_p=dropout, scale=scaling))
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


def _shared(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: torch.Tensor, dropout: float,
            scaling: float | None) -> torch.Tensor:
    """Attention of a packed row whose families hold their prompt once (``agentrl.trainer.packing``): each
    prefix attends causally to itself, each suffix to its prefix and causally to itself. ``layout``: one line
    per sample, ``[prefix start, prefix length, suffix start, suffix length]``."""
    parts: list[tuple[int, torch.Tensor]] = []
    done: set[int] = set()
    for p0, q, s0, n in layout.tolist():
        if q and p0 not in done:
            done.add(p0)
            sl = slice(p0, p0 + q)
            parts.append((p0, F.scaled_dot_product_attention(query[:, :, sl], key[:, :, sl], value[:, :, sl],
                                                             dropout_p=dropout, scale=scaling, is_causal=True)))
        ss = slice(s0, s0 + n)
        if not q:
            parts.append((s0, F.scaled_dot_product_attention(query[:, :, ss], key[:, :, ss], value[:, :, ss],
                                                             dropout_p=dropout, scale=scaling, is_causal=True)))
            continue
        sl = slice(p0, p0 + q)
        k = torch.cat([key[:, :, sl], key[:, :, ss]], dim=2)
        v = torch.cat([value[:, :, sl], value[:, :, ss]], dim=2)
        mask = torch.ones((n, q + n), dtype=torch.bool, device=query.device)
        mask[:, q:] = torch.ones((n, n), dtype=torch.bool, device=query.device).tril()
        parts.append((s0, F.scaled_dot_product_attention(query[:, :, ss], k, v, attn_mask=mask, dropout_p=dropout,
                                                         scale=scaling)))
    parts.sort(key=lambda x: x[0])
    return torch.cat([t for _, t in parts], dim=2).transpose(1, 2).contiguous()


def _band(n: int, window: int, device: torch.device) -> torch.Tensor:
    """Causal sliding-window mask of one sample: position ``i`` sees ``j`` for ``i - window < j <= i``
    (transformers' convention)."""
    i = torch.arange(n, device=device)
    diff = i[:, None] - i[None, :]
    return (diff >= 0) & (diff < window)


def _bounds(kwargs: dict[str, Any], batch: int) -> list[int] | None:
    """The sample boundaries of a packed row, from ``cu_seq_lens_q`` or else from restarting position ids;
    None for anything else (several rows, or one sample a row)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        if batch != 1:
            raise BatchError(f"packed attention takes one row, got a batch of {batch}")
        return [int(b) for b in cu.tolist()]
    pos = kwargs.get("position_ids")
    if pos is None or batch != 1 or pos.shape[0] != 1:
        return None
    starts = (pos[0] == 0).nonzero().flatten().tolist()
    if len(starts) < 2 or starts[0] != 0:
        return None
    return [*starts, int(pos.shape[1])]


def _varlen_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """No mask where the caller gave none (:func:`varlen_sdpa` then keeps samples apart, causal and within
    the window itself); SDPA's padding mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> str:
    """Register :func:`varlen_sdpa` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_SDPA, varlen_sdpa)
    AttentionMaskInterface.register(VARLEN_SDPA, _varlen_mask)
    return VARLEN_SDPA

