"""Per-token log-probabilities without the logits: the output layer and the log-softmax fused, chunk by chunk.

A causal LM's forward ends with ``logits = lm_head(hidden)``: ``positions x vocabulary`` numbers, which autograd
keeps for the backward. With a real vocabulary that tensor is most of a micro-batch's memory: 4,096 positions
of a 49,152-token vocabulary are 805 MB in float32, and the log-softmax's own float32 copy as much again, to
get one number per position. The trainer needs only ``log p(next token)``.

:class:`LogprobHead` stands in for the model's output layer during the trainer's forward (the model runs its
own forward, so FSDP2 unshards and reshards the output layer as it always does) and returns that one number per
position. :class:`ChunkedLogprob` computes it ``chunk`` positions at a time, ``logit[target] / T -
logsumexp(logits / T)`` in float32, and keeps only the hidden states and one logsumexp per position; its
backward recomputes each chunk's logits to form ``(onehot - softmax) / T`` and the gradients of the hidden
states and of the output weight (the tied embedding of a full-weight run). Peak memory is one chunk's logits
(``chunk x V``), whatever the micro-batch's length. The result equals the plain computation to float32
rounding (tests compare logprobs and gradients).

An output layer with a LoRA adapter (``trainer.lora_train_unembed``: peft's ``lora.Linear`` around it) adds
``scale * (hidden @ A^T) @ B^T`` to the logits. Each chunk adds that rank-``R`` term (:func:`head_lora`: the
``N x R`` side of the hidden states and ``B``) to its logits, and the backward gives the side its gradient
(``g @ B``, through which autograd reaches ``A``) and ``B`` its own (``g^T @ side``), never the frozen output
weight's: the logits still never exist whole, and the adapter costs two rank-``R`` products per chunk.

Models whose forward changes the logits after the output layer (a final soft-cap, a logit scale) or whose output
layer has a bias are scored the plain way: :func:`fusable` says which.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn

from agentrl.trainer.kept import mask_logits

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
"""Config fields of models whose forward transforms the logits after the output layer."""


class ChunkedLogprob(torch.autograd.Function):
    """``log softmax((hidden @ weight.T + side_h @ side_w.T) / T)[target]`` per row, ``chunk`` rows at a time (see
    the module docstring); ``side_h`` / ``side_w``: an output-layer LoRA's rank-``R`` term, or None."""

    @staticmethod
    def forward(ctx: Any, hidden_N_H: Tensor, weight_V_H: Tensor, target_N: Tensor, inv_temp_N: Tensor,
                chunk: int, kept_row_N: Tensor | None = None, kept_M_V: Tensor | None = None,
                side_N_R: Tensor | None = None, side_V_R: Tensor | None = None) -> Tensor:
        N = hidden_N_H.shape[0]
        out_N = torch.empty(N, dtype=torch.float32, device=hidden_N_H.device)
        lse_N = torch.empty(N, dtype=torch.float32, device=hidden_N_H.device)
        for lo in range(0, N, chunk):
            hi = min(lo + chunk, N)
            logits = _logits(hidden_N_H, weight_V_H, side_N_R, side_V_R, lo, hi) * inv_temp_N[lo:hi, None]
            logits = mask_logits(logits, _rows(kept_row_N, lo, hi), kept_M_V)
            lse = torch.logsumexp(logits, dim=-1)
            out_N[lo:hi] = logits.gather(-1, target_N[lo:hi, None]).squeeze(-1) - lse
            lse_N[lo:hi] = lse
        ctx.save_for_backward(hidden_N_H, weight_V_H, target_N, inv_temp_N, lse_N, side_N_R, side_V_R)
        ctx.chunk, ctx.kept = chunk, (kept_row_N, kept_M_V)
        return out_N

    @staticmethod
    def backward(ctx: Any, grad_N: Tensor) -> tuple[Tensor | None, ...]:
        hidden_N_H, weight_V_H, target_N, inv_temp_N, lse_N, side_N_R, side_V_R = ctx.saved_tensors
        kept_row_N, kept_M_V = ctx.kept
        want = ctx.needs_input_grad
        grad_h = torch.empty_like(hidden_N_H) if want[0] else None
        grad_w = torch.zeros(weight_V_H.shape, dtype=torch.float32, device=weight_V_H.device) if want[1] else None
        grad_sh = torch.empty_like(side_N_R) if side_N_R is not None and want[7] else None
        grad_sw = torch.zeros(side_V_R.shape, dtype=torch.float32, device=side_V_R.device) \
            if side_V_R is not None and want[8] else None
        grad_N = grad_N.float()
        N, chunk = hidden_N_H.shape[0], ctx.chunk
        for lo in range(0, N, chunk):
            hi = min(lo + chunk, N)
            inv_t = inv_temp_N[lo:hi, None]
            logits = _logits(hidden_N_H, weight_V_H, side_N_R, side_V_R, lo, hi) * inv_t
            logits = mask_logits(logits, _rows(kept_row_N, lo, hi), kept_M_V)
            probs = torch.exp(logits - lse_N[lo:hi, None])  # 0 outside a recorded kept set
            g = probs.mul_(-grad_N[lo:hi, None])
            g.scatter_add_(-1, target_N[lo:hi, None], grad_N[lo:hi, None])
            g = (g * inv_t).to(weight_V_H.dtype)  # d/d(raw logits) = d/d(tempered logits) / T
            if grad_h is not None:
                grad_h[lo:hi] = g @ weight_V_H
            if grad_w is not None:
                grad_w += (g.T @ hidden_N_H[lo:hi]).float()
            if grad_sh is not None:
                grad_sh[lo:hi] = g.to(side_V_R.dtype) @ side_V_R
            if grad_sw is not None:
                grad_sw += (g.T.to(side_N_R.dtype) @ side_N_R[lo:hi]).float()
        return (grad_h, None if grad_w is None else grad_w.to(weight_V_H.dtype), None, None, None, None, None,
                grad_sh, None if grad_sw is None else grad_sw.to(side_V_R.dtype))


def _logits(hidden_N_H: Tensor, weight_V_H: Tensor, side_N_R: Tensor | None, side_V_R: Tensor | None,
            lo: int, hi: int) -> Tensor:
    """Rows ``lo:hi`` of the raw logits, float32: the output layer's, plus its LoRA term where there is one."""
    logits = (hidden_N_H[lo:hi] @ weight_V_H.T).float()
    if side_N_R is not None and side_V_R is not None:
        logits += (side_N_R[lo:hi] @ side_V_R.T).float()
    return logits


def _rows(kept_row_N: Tensor | None, lo: int, hi: int) -> Tensor | None:
    return None if kept_row_N is None else kept_row_N[lo:hi]


def chunked_logprobs(hidden_N_H: Tensor, weight_V_H: Tensor, target_N: Tensor, inv_temp_N: Tensor,
                     chunk: int = 1024, kept_row_N: Tensor | None = None, kept_M_V: Tensor | None = None,
                     side: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """Each row's ``log p(target)`` under ``softmax(hidden @ weight.T * inv_temp)``, float32 (see
    :class:`ChunkedLogprob`), renormalised over the recorded kept set of the rows that have one
    (``kept_row_N``, ``kept_M_V``: :mod:`agentrl.trainer.kept`); ``side``: an output-layer LoRA's term
    (:func:`head_lora`) added to the logits."""
    side_N_R, side_V_R = side if side is not None else (None, None)
    return ChunkedLogprob.apply(hidden_N_H, weight_V_H, target_N, inv_temp_N.float(), chunk, kept_row_N, kept_M_V,
                                side_N_R, side_V_R)


class LogprobHead(nn.Module):
    """An output layer that returns, at each position, the log-probability of the token that follows it
    (``B x T x 1``), at the row's temperature, instead of the logits; it wraps the model's own layer."""

    def __init__(self, head: nn.Module, next_B_T: Tensor, inv_temp_B_T: Tensor, chunk: int,
                 next_kept_B_T: Tensor | None = None, kept_M_V: Tensor | None = None,
                 scored_B_T: Tensor | None = None) -> None:
        super().__init__()
        self.head = head
        self.next_B_T = next_B_T
        self.inv_temp_B_T = inv_temp_B_T
        self.chunk = chunk
        self.next_kept_B_T, self.kept_M_V = next_kept_B_T, kept_M_V
        self.scored_N = None if scored_B_T is None else scored_B_T.reshape(-1).nonzero().squeeze(1)
        """The flat positions scored (the rest hold 0 and pass no gradient); None: every position."""

    def forward(self, hidden_B_T_H: Tensor) -> Tensor:
        B, T, H = hidden_B_T_H.shape
        hidden_N_H = hidden_B_T_H.reshape(B * T, H)
        target_N, inv_temp_N = self.next_B_T.reshape(-1), self.inv_temp_B_T.reshape(-1)
        kept_N = None if self.next_kept_B_T is None else self.next_kept_B_T.reshape(-1)
        idx = self.scored_N
        if idx is not None:  # only these positions reach the output layer: the others' logits are never formed
            hidden_N_H, target_N, inv_temp_N = hidden_N_H[idx], target_N[idx], inv_temp_N[idx]
            kept_N = None if kept_N is None else kept_N[idx]
        lp = chunked_logprobs(hidden_N_H, self.head.weight, target_N, inv_temp_N, self.chunk, kept_N, self.kept_M_V,
                              head_lora(self.head, hidden_N_H))
        if idx is not None:
            lp = lp.new_zeros(B * T).index_copy(0, idx, lp)
        return lp.view(B, T, 1).clone()  # not a view: FSDP2 hooks the output for its backward


def head_lora(head: nn.Module, hidden_N_H: Tensor) -> tuple[Tensor, Tensor] | None:
    """The LoRA term of the output layer ``head`` on ``hidden_N_H``, as ``(side_h, side_w)`` whose product is what
    it adds to the logits: ``scale * dropout(hidden) @ A^T`` (``N x R``) and ``B`` (``V x R``), the active
    adapters' side by side (peft's ``lora.Linear``, unmerged, adapters enabled); None where it has none."""
    lora_a = getattr(head, "lora_A", None)
    if lora_a is None or getattr(head, "disable_adapters", False) or getattr(head, "merged", False):
        return None
    hidden, weight = [], []
    for name in head.active_adapters:
        if name not in lora_a:
            continue
        a_R_H, b_V_R = lora_a[name].weight, head.lora_B[name].weight
        hidden.append((head.lora_dropout[name](hidden_N_H) @ a_R_H.T.to(hidden_N_H.dtype)) * head.scaling[name])
        weight.append(b_V_R.to(hidden_N_H.dtype))
    if not weight:
        return None
    if len(weight) == 1:
        return hidden[0], weight[0]
    return torch.cat(hidden, dim=-1), torch.cat(weight, dim=-1)


def fusable(model: nn.Module) -> bool:
    """Whether ``model``'s output layer can be replaced by :class:`LogprobHead`: a linear layer without a bias
    whose output is the logits, unchanged (no soft-cap or scale in the model's config)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    config = getattr(base, "config", None)
    if head is None or getattr(head, "bias", None) is not None or not isinstance(getattr(head, "weight", None), Tensor):
        return False
    texts = [config, getattr(config, "text_config", None)]
    return not any(getattr(c, name, None) not in (None, 1, 1.0) for c in texts if c is not None
                   for name in LOGIT_TRANSFORMS)


@contextlib.contextmanager
def logprob_head(model: nn.Module, next_B_T: Tensor, inv_temp_B_T: Tensor, chunk: int,
                 next_kept_B_T: Tensor | None = None, kept_M_V: Tensor | None = None,
                 scored_B_T: Tensor | None = None) -> Iterator[None]:
    """Within the block, ``model``'s forward returns next-token log-probabilities as its ``logits``
    (``B x T x 1``): position ``t`` holds ``log p(next_B_T[b, t] | tokens up to t)``, renormalised over the
    kept set ``kept_M_V[next_kept_B_T[b, t]]`` where that index is not -1. With ``scored_B_T`` (bool), only
    the positions it marks are scored and the rest hold 0: a trainer needs the loss tokens' logprobs only,
    and in an agent's episode most positions are prompt and tool output, whose output-layer work (a
    ``vocabulary x hidden`` product forward, two backward) this skips."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    base.set_output_embeddings(LogprobHead(head, next_B_T, inv_temp_B_T, chunk, next_kept_B_T, kept_M_V, scored_B_T))
    try:
        yield
    finally:
        base.set_output_embeddings(head)
