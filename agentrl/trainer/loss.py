"""The clipped policy-gradient loss with off-policy corrections (pure torch); group advantages are computed
on the orchestrator side (:func:`agentrl.orchestrator.samples.group_advantages`).

Shapes are suffixed to names: ``_B`` sequences, ``_T`` positions, ``_V`` vocabulary, ``_N`` samples.
Logprob tensors follow the convention of :func:`token_logprobs`: position ``t`` holds
``log p(input_ids[t] | input_ids[:t])``, so the behaviour logprobs recorded by the inference engine for
token ``t`` line up with the trainer's logprobs at the same position.

Correction modes (``LossConfig.is_correction``), with ``logp`` the current policy, ``prox`` the trainer's
own logprobs before this update (the proximal policy) and ``behav`` the policy that sampled the tokens:

- ``none``: plain PPO against the behaviour policy: ``r = exp(logp - behav)``, clipped.
- ``tis``: PPO against the proximal policy, ``r = exp(logp - prox)`` clipped, and every token's term is
  multiplied by the truncated behaviour weight ``w = min(exp(prox - behav), tis_cap)``.
- ``decoupled``: decoupled PPO (AReaL): the same clipped ``r = exp(logp - prox)`` times
  ``w = exp(prox - behav)``, but tokens whose weight exceeds ``tis_cap`` are *dropped* (``w = 0``)
  instead of truncated. Dropped tokens still count in the normaliser.

Both weights are detached. On-policy (``behav == prox == logp``) every ratio and weight is exactly 1.

Ratio level (``LossConfig.ratio_level``): ``token`` is the above. ``sequence`` (GSPO) replaces each
token's ratio ``r_t`` by its sequence's ``s = exp(mean_t(logp_t - base_t))`` over the loss tokens (``base``
is ``behav`` for ``none``, ``prox`` otherwise), in the form ``s_t = sg[s] * exp(logp_t - sg[logp_t])``:
the value is ``s`` at every token, so the clip keeps or cuts the whole sequence, and the gradient of
token ``t`` is ``s * grad logp_t``. The per-token terms ``max(-s_t A, -clip(s_t) A) * w_t`` then go
through the same aggregation; with ``seq_mean`` and ``none`` the gradient is exactly GSPO's,
``-s A mean_t(grad logp_t)`` for an unclipped sequence. The behaviour weight ``w_t`` stays per token
(the same ``tis`` truncation / ``decoupled`` drop, at the same cap): it corrects which tokens the
behaviour policy sampled, the sequence ratio bounds how far this update moves from ``base``. A dropped
token still counts in its sequence's ``s``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from agentrl.config.trainer import LossConfig
from agentrl.trainer.kept import mask_logits


def token_logprobs(logits_B_T_V: Tensor, input_ids_B_T: Tensor, temperatures_B: Tensor | None = None,
                   kept_row_B_T: Tensor | None = None, kept_M_V: Tensor | None = None) -> Tensor:
    """Per-position log-likelihood of the input tokens under ``softmax(logits / temperature)``; position 0
    (no context) gets 0. ``temperatures_B``: each sequence's sampling temperature (default 1).
    ``kept_row_B_T`` / ``kept_M_V``: the engine's recorded kept sets (:mod:`agentrl.trainer.kept`), over
    which a position's distribution is renormalised.

    The engine samples from the temperature-scaled distribution and reports its logprobs, so the ratios
    and importance weights compare the same distribution on both sides. Computed as
    ``logit[target] - logsumexp(logits)`` one sequence at a time, in float32, so no full-size
    log-softmax of the whole batch is materialised.
    """
    B, T, _ = logits_B_T_V.shape
    out_B_T = logits_B_T_V.new_zeros((B, T), dtype=torch.float32)
    if T < 2:
        return out_B_T
    rows = []
    for b in range(B):
        logits_T_V = logits_B_T_V[b, :-1].float()
        if temperatures_B is not None:
            logits_T_V = logits_T_V / temperatures_B[b].to(logits_T_V)
        if kept_row_B_T is not None:
            logits_T_V = mask_logits(logits_T_V, kept_row_B_T[b, 1:], kept_M_V)
        target_T = input_ids_B_T[b, 1:].unsqueeze(-1)
        picked_T = logits_T_V.gather(-1, target_T).squeeze(-1)
        rows.append(picked_T - torch.logsumexp(logits_T_V, dim=-1))
    return torch.cat([out_B_T[:, :1], torch.stack(rows)], dim=1)


def _advantages(advantages_B: Tensor, dtype: torch.dtype, cfg: LossConfig) -> Tensor:
    """Each sequence's advantage as a ``B x 1`` column of ``dtype``, the negative ones scaled by
    ``cfg.negative_weight``."""
    adv_B = advantages_B.to(dtype)
    if cfg.negative_weight != 1.0:
        adv_B = torch.where(adv_B < 0, adv_B * cfg.negative_weight, adv_B)
    return adv_B.unsqueeze(-1)


def _behaviour_weight(
    prox_B_T: Tensor, behav_B_T: Tensor, mask_B_T: Tensor, cfg: LossConfig
) -> tuple[Tensor, Tensor]:
    """The detached behaviour importance weight and the mask of tokens it truncated or dropped."""
    w_B_T = torch.exp((prox_B_T - behav_B_T) * mask_B_T)
    over_B_T = w_B_T > cfg.tis_cap
    if cfg.is_correction == "tis":
        w_B_T = torch.clamp(w_B_T, max=cfg.tis_cap)
    else:
        w_B_T = torch.where(over_B_T, torch.zeros_like(w_B_T), w_B_T)
    return w_B_T.detach(), over_B_T


class _Correction(NamedTuple):
    """What a correction mode makes of the behaviour policy (see the module docstring)."""

    base_B_T: Tensor
    """The detached logprobs the ratio is taken against: ``behav`` for ``none``, ``prox`` otherwise."""
    policy_B_T: Tensor
    """The detached policy whose distance to ``behav`` is reported (``behav_logp_diff``)."""
    w_B_T: Tensor
    """The detached behaviour weight of each token's term."""
    over_B_T: Tensor
    """The tokens whose weight was truncated or dropped."""


def _correction(logprobs_B_T: Tensor, behav_B_T: Tensor, prox_logprobs_B_T: Tensor | None, mask_B_T: Tensor,
                cfg: LossConfig) -> _Correction:
    """The ratio's baseline and the behaviour weights of ``cfg.is_correction``; no ``prox_logprobs_B_T`` means
    the current policy is the proximal one."""
    if cfg.is_correction == "none":
        return _Correction(behav_B_T, logprobs_B_T.detach(), torch.ones_like(logprobs_B_T),
                           torch.zeros_like(logprobs_B_T, dtype=torch.bool))
    prox = logprobs_B_T if prox_logprobs_B_T is None else prox_logprobs_B_T.to(logprobs_B_T.dtype)
    base_B_T = prox.detach()
    return _Correction(base_B_T, base_B_T, *_behaviour_weight(base_B_T, behav_B_T, mask_B_T, cfg))


def _log_ratio(logprobs_B_T: Tensor, base_B_T: Tensor, mask_B_T: Tensor, cfg: LossConfig) -> Tensor:
    """Each token's log-ratio to ``base_B_T`` at ``cfg.ratio_level``: its own, or its sequence's in the
    GSPO-token form; 0 off the mask."""
    # Masked-out positions may hold arbitrary values (padding): zero the log-ratio there before exp.
    log_ratio_B_T = (logprobs_B_T - base_B_T) * mask_B_T
    if cfg.ratio_level == "sequence":
        # GSPO-token form: every token's ratio has the value of its sequence's geometric-mean ratio s and
        # the gradient s * grad logp_t, so the clip decision is the sequence's and seq_mean gives GSPO's gradient.
        seq_log_ratio_B_1 = log_ratio_B_T.sum(-1, keepdim=True) / mask_B_T.sum(-1, keepdim=True).clamp(min=1.0)
        log_ratio_B_T = (logprobs_B_T - logprobs_B_T.detach() + seq_log_ratio_B_1.detach()) * mask_B_T
    return log_ratio_B_T


def _surrogate(ratio_B_T: Tensor, adv_B_1: Tensor, cfg: LossConfig) -> tuple[Tensor, Tensor]:
    """The two terms of the clipped surrogate (to minimise): ``-r A`` and ``-clip(r) A``."""
    clipped_B_T = torch.clamp(ratio_B_T, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    unclipped_loss_B_T = -ratio_B_T * adv_B_1
    clipped_loss_B_T = -clipped_B_T * adv_B_1
    return unclipped_loss_B_T, clipped_loss_B_T


def _add_kl(per_token_B_T: Tensor, logprobs_B_T: Tensor, ref_logprobs_B_T: Tensor | None, mask_B_T: Tensor,
            cfg: LossConfig) -> tuple[Tensor, Tensor]:
    """The per-token terms with the KL penalty to the reference policy added (k3 estimator), and that KL
    per token (zeros without a KL term)."""
    kl_B_T = torch.zeros_like(logprobs_B_T)
    if cfg.kl_coef > 0 and ref_logprobs_B_T is not None:
        delta_B_T = (ref_logprobs_B_T.to(logprobs_B_T.dtype) - logprobs_B_T) * mask_B_T
        kl_B_T = torch.exp(delta_B_T) - delta_B_T - 1.0
        per_token_B_T = per_token_B_T + cfg.kl_coef * kl_B_T
    return per_token_B_T, kl_B_T


def _aggregate(per_token_B_T: Tensor, mask_B_T: Tensor, cfg: LossConfig, num_tokens_global: float | None,
               num_seqs_global: float | None) -> Tensor:
    """The masked per-token terms reduced to the loss by ``cfg.aggregation``, under the global normaliser
    where one is given (see :func:`policy_loss`)."""
    tokens_B = mask_B_T.sum(-1)
    if cfg.aggregation == "token_mean":
        denom = float(tokens_B.sum().item()) if num_tokens_global is None else float(num_tokens_global)
        return (per_token_B_T * mask_B_T).sum() / max(denom, 1.0)
    seq_B = (per_token_B_T * mask_B_T).sum(-1) / tokens_B.clamp(min=1.0)
    n_seqs = float((tokens_B > 0).sum().item()) if num_seqs_global is None else float(num_seqs_global)
    return seq_B.sum() / max(n_seqs, 1.0)


@torch.no_grad()
def _metrics(logprobs_B_T: Tensor, behav_B_T: Tensor, mask_B_T: Tensor, corr: _Correction, ratio_B_T: Tensor,
             unclipped_loss_B_T: Tensor, clipped_loss_B_T: Tensor, kl_B_T: Tensor) -> dict[str, float]:
    """The loss's metrics: means over the masked tokens, and their count ``num_tokens``."""
    n = float(mask_B_T.sum().item())

    def mmean(x_B_T: Tensor) -> float:
        return float((x_B_T.float() * mask_B_T).sum().item() / max(n, 1.0))

    return {
        "num_tokens": n,
        "clip_frac": mmean(clipped_loss_B_T > unclipped_loss_B_T),
        "ratio_mean": mmean(ratio_B_T),
        "is_weight_mean": mmean(corr.w_B_T),
        "is_weight_sq_mean": mmean(corr.w_B_T * corr.w_B_T),
        "is_capped_frac": mmean(corr.over_B_T),
        "kl": mmean(kl_B_T),
        "logp_mean": mmean(logprobs_B_T),
        "behav_logp_diff": mmean(corr.policy_B_T - behav_B_T),
    }


def policy_loss(
    logprobs_B_T: Tensor,
    behav_logprobs_B_T: Tensor,
    advantages_B: Tensor,
    loss_mask_B_T: Tensor,
    cfg: LossConfig,
    prox_logprobs_B_T: Tensor | None = None,
    ref_logprobs_B_T: Tensor | None = None,
    num_tokens_global: float | None = None,
    num_seqs_global: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (to minimise) and its metrics.

    ``num_tokens_global`` (token_mean) / ``num_seqs_global`` (seq_mean, counting only sequences with at
    least one masked token) replace the local normaliser, so data-parallel ranks can each return
    ``local sum / global count`` and the sum of their losses equals the single-rank loss.
    Metrics are means over the local masked tokens, plus ``num_tokens`` (the local masked count) so a
    caller can combine them across micro-batches and ranks. With sequence ratios every token carries its
    sequence's ratio, so ``ratio_mean`` and ``clip_frac`` weight each sequence by its loss tokens
    (``clip_frac``: the share of loss tokens whose sequence was clipped).
    """
    mask_B_T = loss_mask_B_T.to(logprobs_B_T.dtype)
    adv_B_1 = _advantages(advantages_B, logprobs_B_T.dtype, cfg)
    behav_B_T = behav_logprobs_B_T.to(logprobs_B_T.dtype)
    corr = _correction(logprobs_B_T, behav_B_T, prox_logprobs_B_T, mask_B_T, cfg)
    ratio_B_T = torch.exp(_log_ratio(logprobs_B_T, corr.base_B_T, mask_B_T, cfg))
    unclipped_loss_B_T, clipped_loss_B_T = _surrogate(ratio_B_T, adv_B_1, cfg)
    per_token_B_T = torch.maximum(unclipped_loss_B_T, clipped_loss_B_T) * corr.w_B_T
    per_token_B_T, kl_B_T = _add_kl(per_token_B_T, logprobs_B_T, ref_logprobs_B_T, mask_B_T, cfg)
    loss = _aggregate(per_token_B_T, mask_B_T, cfg, num_tokens_global, num_seqs_global)
    return loss, _metrics(logprobs_B_T, behav_B_T, mask_B_T, corr, ratio_B_T, unclipped_loss_B_T, clipped_loss_B_T,
                          kl_B_T)
