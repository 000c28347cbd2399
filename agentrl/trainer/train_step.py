"""One ``train`` request on one FSDP2 rank: micro-batched forward/backward, global normalisation, step.

Each minibatch is dealt to the ranks by compute cost (:func:`agentrl.trainer.packing.balance`), and each
rank's share is packed into rows of at most ``micro_batch_tokens`` tokens (or, with packing off, padded
micro-batches under the same budget). Every rank runs the same number of forward/backward passes (ranks
with fewer micro-batches run zero-loss dummy ones), because each FSDP2 forward and backward is a collective.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from agentrl.config.trainer import TrainerConfig
from agentrl.core.types import TrainSample
from agentrl.core.versions import staleness_stats, token_staleness
from agentrl.trainer.batch import collate, micro_batches, split_minibatches
from agentrl.trainer.errors import BatchError
from agentrl.trainer.head import fusable, logprob_head
from agentrl.trainer.loss import policy_loss, token_logprobs
from agentrl.trainer.packing import (
    attention_len,
    balance,
    collate_packed,
    pack,
    pack_shared,
    packed_token_logprobs,
    sequence_cost,
    shares_prefix,
    strided,
)
from agentrl.trainer.schedule import lr_at

MEAN_METRICS = (
    "clip_frac",
    "ratio_mean",
    "is_weight_mean",
    "is_weight_sq_mean",
    "is_capped_frac",
    "kl",
    "logp_mean",
    "behav_logp_diff",
)

Plan = list[list[TrainSample] | None]


def _predicting_loss(batch: dict[str, Tensor], shape: torch.Size) -> Tensor:
    """The forward's positions (``shape``: the packed ``1 x P`` row or the padded ``B x T`` batch) whose next
    token is a loss token: the positions whose output the loss reads."""
    mask_B_T = batch["loss_mask_B_T"].bool()
    scored = torch.zeros(shape, dtype=torch.bool, device=mask_B_T.device)
    if "input_ids_1_P" in batch:
        scored[0, batch["unpack_B_T"][mask_B_T] - 1] = True
    else:
        scored[:, :-1] = mask_B_T[:, 1:]
    return scored


log = logging.getLogger("agentrl.trainer")


def _as_sample(s: TrainSample | dict[str, Any]) -> TrainSample:
    return s if isinstance(s, TrainSample) else TrainSample(**s)


class TrainStep:
    """Runs ``train`` requests against a sharded model and its optimizer, counting optimizer steps.

    The policy version is not the trainer's: each request says which version it trains
    (``policy_version``, owned by the orchestrator), and staleness is measured against it.
    """

    def __init__(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, cfg: TrainerConfig, device: torch.device,
        replay: Any = None,
    ) -> None:
        self.model = model
        self.replay = replay
        """MoE routing replay (:class:`agentrl.moe.replay.RoutingReplay`), or None for a dense model."""
        self.optimizer = optimizer
        self.cfg = cfg
        self.device = device
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.optimizer_step = 0
        """Optimizer steps taken (``ppo_epochs × num_minibatches`` per ``train``); not a policy version."""
        self.pad_id = 0
        self._dummy = TrainSample([self.pad_id] * 2, [0, 0], [0.0, 0.0], 0.0, [-1, -1])
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.attention_len = attention_len(getattr(base, "config", None))
        self.fused_head = cfg.logprob_chunk_tokens > 0 and fusable(model)
        """Score tokens through :class:`agentrl.trainer.head.LogprobHead` (no logits tensor)."""
        self.share_prefix = shares_prefix(cfg, getattr(base, "config", None))
        """Samples that open on the same prompt hold it once in a packed row (``trainer.share_prefix``)."""
        """Length at which a token's attention costs as much as its dense layers (rank balancing)."""

    def _all_reduce(
        self, values: Sequence[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
    ) -> list[float]:
        t = torch.tensor(list(values), dtype=torch.float64, device=self.device)
        if self.world > 1:
            dist.all_reduce(t, op=op)
        return t.tolist()

    def _mine(self, samples: Sequence[TrainSample]) -> list[int]:
        """Indices of this rank's share of ``samples``: balanced by compute cost, or ``rank::world``."""
        if not self.cfg.balance_ranks:
            return strided(len(samples), self.world)[self.rank]
        costs = [sequence_cost(len(s.input_ids), self.attention_len) for s in samples]
        return balance(costs, self.world)[self.rank]

    def _groups(self, local: Sequence[TrainSample]) -> list[list[int]]:
        """``local`` grouped into micro-batches under the token budget: packed rows (samples that open on the
        same prompt holding it once, with sharing), or padded batches."""
        if self.share_prefix:
            return pack_shared(local, self.cfg.micro_batch_tokens)
        lengths = [len(s.input_ids) for s in local]
        if self.cfg.packing:
            return pack(lengths, self.cfg.micro_batch_tokens)
        return micro_batches(lengths, self.cfg.micro_batch_tokens)

    def _plan(self, local: list[TrainSample]) -> Plan:
        """This rank's micro-batches, padded with ``None`` (dummy) to the largest count of any rank."""
        groups = self._groups(local)
        n = int(self._all_reduce([len(groups)], op=dist.ReduceOp.MAX)[0])
        return [[local[i] for i in g] for g in groups] + [None] * (n - len(groups))

    def _batch(self, group: list[TrainSample] | None) -> dict[str, Tensor]:
        samples = group if group is not None else [self._dummy]
        if self.cfg.packing:
            batch = collate_packed(samples, self.pad_id, share=self.share_prefix)
        else:
            batch = collate(samples, self.pad_id)
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def _logprobs(self, batch: dict[str, Tensor], adapter: bool = True, every: bool = False) -> Tensor:
        """Per-token logprobs in the padded ``B x T`` layout, whether the forward ran packed or padded. With the
        fused head and not ``every``, only the loss tokens are scored (0 elsewhere); the plain logits path and
        ``every`` score every token."""
        packed = "input_ids_1_P" in batch
        ctx = contextlib.nullcontext() if adapter else self.model.disable_adapter()
        if self.replay is not None:  # stays set through this forward's backward (checkpoint recompute)
            self.replay.set(batch.get("routing_1_P_L_K" if packed else "routing_B_T_L_K"))
        ids = batch["input_ids_1_P"] if packed else batch["input_ids_B_T"]
        temps = batch["temperatures_P"][None] if packed else batch["temperatures_B"][:, None].expand_as(ids)
        kept_M_V = batch.get("kept_M_V")  # the engine's kept sets where sampling was truncated
        kept_rows = batch.get("kept_row_P")[None] if packed and kept_M_V is not None else batch.get("kept_row_B_T")
        fused = contextlib.nullcontext()
        if self.fused_head:  # the model returns log p(next token) per position, never the logits
            next_ids = torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
            next_temps = torch.cat([temps[:, 1:], torch.ones_like(temps[:, :1])], dim=1)
            next_kept = None if kept_rows is None else torch.cat(
                [kept_rows[:, 1:], torch.full_like(kept_rows[:, :1], -1)], dim=1)
            fused = logprob_head(self.model, next_ids, 1.0 / next_temps, self.cfg.logprob_chunk_tokens,
                                 next_kept, kept_M_V, None if every else _predicting_loss(batch, ids.shape))
        with ctx, fused:
            if packed:  # no attention mask: restarting position ids make it block-diagonal
                cu = batch["cu_seq_lens_S1"]
                longest = int((cu[1:] - cu[:-1]).max())
                shared = {"prefix_layout_S_4": batch["prefix_layout_S_4"]} if "prefix_layout_S_4" in batch else {}
                out = self.model(input_ids=ids, position_ids=batch["position_ids_1_P"],
                                 cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=longest, max_length_k=longest,
                                 use_cache=False, **shared)
            else:
                out = self.model(input_ids=ids, attention_mask=batch["attention_mask_B_T"], use_cache=False)
        if self.fused_head:  # position t holds log p(token t+1): shift right, nothing at position 0
            logp = torch.cat([torch.zeros_like(out.logits[:, :1, 0]), out.logits[:, :-1, 0]], dim=1)
            if not packed:
                return logp * batch["attention_mask_B_T"]
            logp_P = logp[0].index_fill(0, batch["starts_S"], 0.0)  # each sample's first token
        elif not packed:
            return token_logprobs(out.logits, ids, batch["temperatures_B"], kept_rows, kept_M_V)
        else:
            logp_P = packed_token_logprobs(out.logits[0], ids[0], batch["temperatures_P"], batch["starts_S"],
                                           kept_row_P=None if kept_rows is None else kept_rows[0], kept_M_V=kept_M_V)
        return logp_P[batch["unpack_B_T"]] * batch["attention_mask_B_T"]

    @torch.no_grad()
    def _precompute(self, plans: list[Plan], adapter: bool) -> list[list[Tensor]]:
        """No-grad logprobs of every micro-batch (dropout off), before any update."""
        self.model.eval()
        try:
            return [[self._logprobs(self._batch(g), adapter=adapter) for g in plan] for plan in plans]
        finally:
            self.model.train()

    def _clip_grads(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    @torch.no_grad()
    def score(self, samples: Sequence[TrainSample | dict[str, Any]]) -> list[list[float]]:
        """The current policy's logprob of every token of every sample (at its temperature; 0 at position
        0), in sample order. No update; dropout off. Collective: every rank runs as many forwards."""
        batch_samples = [_as_sample(s) for s in samples]
        local_idx = self._mine(batch_samples)
        local = [batch_samples[i] for i in local_idx]
        groups = self._groups(local)
        n = int(self._all_reduce([len(groups)], op=dist.ReduceOp.MAX)[0])
        mine: dict[int, list[float]] = {}
        self.model.eval()
        try:
            for k in range(n):
                group = groups[k] if k < len(groups) else None
                logp_B_T = self._logprobs(self._batch(None if group is None else [local[i] for i in group]),
                                          every=True)
                for b, i in enumerate(group or []):
                    mine[local_idx[i]] = logp_B_T[b, : len(local[i].input_ids)].cpu().tolist()
        finally:
            self.model.train()
        if self.world > 1:
            parts: list[Any] = [None] * self.world
            dist.all_gather_object(parts, mine)
            for part in parts:
                mine.update(part)
        return [mine[i] for i in range(len(batch_samples))]

    def train(self, samples: Sequence[TrainSample | dict[str, Any]], policy_version: int) -> dict[str, Any]:
        """Run ``ppo_epochs x num_minibatches`` optimizer steps on the batch of policy ``policy_version``;
        returns global metrics."""
        t0 = time.perf_counter()
        batch_samples = self._request_samples(samples)
        minibatches = split_minibatches(batch_samples, self.cfg.num_minibatches)
        local = [[mb[i] for i in self._mine(mb)] for mb in minibatches]
        plans = [self._plan(mb) for mb in local]
        counts = self._loss_counts(local)
        log.info(
            "train: %d samples, local micro-batches %s (dummies %s)",
            len(batch_samples), [len(p) for p in plans], [sum(g is None for g in p) for p in plans],
        )  # fmt: skip
        prox, ref = self._fixed_logprobs(plans, n_updates=self.cfg.ppo_epochs * len(minibatches))
        if self.replay is not None:
            self.replay.reset_stats()
        sums, grad_norms, lr = self._updates(plans, counts, prox, ref)
        if self.replay is not None:
            self._add_routing_sums(sums)
        out = self._metrics(self._over_ranks(sums), grad_norms, lr, counts, batch_samples, policy_version)
        out["time_s"] = time.perf_counter() - t0
        return out

    @staticmethod
    def _request_samples(samples: Sequence[TrainSample | dict[str, Any]]) -> list[TrainSample]:
        """A ``train`` request's samples; a :class:`BatchError` for an empty batch or one without loss tokens."""
        batch_samples = [_as_sample(s) for s in samples]
        if not batch_samples:
            raise BatchError("train: empty batch")
        if sum(s.num_loss_tokens for s in batch_samples) == 0:
            raise BatchError("train: the batch has no loss tokens")
        return batch_samples

    def _loss_counts(self, local: list[list[TrainSample]]) -> list[list[float]]:
        """Per minibatch, its loss tokens and its sequences with loss tokens over all ranks (the loss's
        normalisers), from each rank's share ``local``."""
        return [
            self._all_reduce([sum(s.num_loss_tokens for s in mb), sum(s.num_loss_tokens > 0 for s in mb)])
            for mb in local
        ]

    def _fixed_logprobs(self, plans: list[Plan], n_updates: int) -> tuple[list[list[Tensor]] | None,
                                                                           list[list[Tensor]] | None]:
        """The logprobs that hold still through the request's ``n_updates`` updates: the proximal policy's
        (for a correction mode) and the reference model's (for a KL term); None where the loss needs none."""
        lcfg = self.cfg.loss
        # With a single update the proximal policy *is* the current one: skip the extra forward.
        prox = self._precompute(plans, True) if lcfg.is_correction != "none" and n_updates > 1 else None
        ref = self._precompute(plans, False) if lcfg.kl_coef > 0 else None
        return prox, ref

    def _updates(self, plans: list[Plan], counts: list[list[float]], prox: list[list[Tensor]] | None,
                 ref: list[list[Tensor]] | None) -> tuple[dict[str, float], list[float], float]:
        """``ppo_epochs`` passes over the minibatches, one optimizer step per minibatch with loss tokens: the
        metrics summed over the micro-batches, each step's gradient norm, and the last learning rate."""
        sums = dict.fromkeys((*MEAN_METRICS, "num_tokens", "loss"), 0.0)
        grad_norms: list[float] = []
        lr = lr_at(self.optimizer_step, self.cfg)
        for _ in range(self.cfg.ppo_epochs):
            for k, plan in enumerate(plans):
                n_tok, n_seq = counts[k]
                if n_tok == 0:
                    continue
                for j, group in enumerate(plan):
                    self._accumulate(group, n_tok, n_seq, None if prox is None else prox[k][j],
                                     None if ref is None else ref[k][j], sums)
                grad_norm, lr = self._optimizer_update()
                grad_norms.append(grad_norm)
        return sums, grad_norms, lr

    def _accumulate(self, group: list[TrainSample] | None, n_tok: float, n_seq: float, prox_B_T: Tensor | None,
                    ref_B_T: Tensor | None, sums: dict[str, float]) -> None:
        """One micro-batch's forward and backward (its gradients add to the step's), its loss and metrics
        added to ``sums``."""
        batch = self._batch(group)
        logp = self._logprobs(batch)
        loss, m = policy_loss(
            logp,
            batch["behav_logprobs_B_T"],
            batch["advantages_B"],
            batch["loss_mask_B_T"],
            self.cfg.loss,
            prox_logprobs_B_T=prox_B_T,
            ref_logprobs_B_T=ref_B_T,
            num_tokens_global=n_tok,
            num_seqs_global=n_seq,
        )
        # FSDP2 averages gradients over ranks; each rank's loss is already a share of the
        # global mean, so scale up to make the reduction a sum.
        (loss * self.world).backward()
        sums["loss"] += float(loss.detach())
        sums["num_tokens"] += m["num_tokens"]
        for key in MEAN_METRICS:
            sums[key] += m[key] * m["num_tokens"]

    def _optimizer_update(self) -> tuple[float, float]:
        """One optimizer step on the accumulated gradients (clipped, at the schedule's rate): the gradient norm
        and the rate."""
        grad_norm = self._clip_grads()
        lr = lr_at(self.optimizer_step, self.cfg)
        for param_group in self.optimizer.param_groups:  # a group's rate is a share of the schedule's
            param_group["lr"] = lr * param_group.get("lr_scale", 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.optimizer_step += 1
        return grad_norm, lr

    def _add_routing_sums(self, sums: dict[str, float]) -> None:
        """Add the MoE routing replay's counts of this request to ``sums`` (and drop its held routing)."""
        self.replay.clear()
        rs = self.replay.stats()
        sums["routing_decisions"] = float(rs["routing_decisions"])
        sums["routing_mismatches"] = float(rs["routing_decisions"]) * float(rs["routing_mismatch_frac"])
        sums["routing_replayed"] = float(rs["routing_decisions"]) * float(rs["routing_replayed_frac"])

    def _over_ranks(self, sums: dict[str, float]) -> dict[str, float]:
        """``sums`` summed over every rank."""
        keys = list(sums)
        return dict(zip(keys, self._all_reduce([sums[k] for k in keys]), strict=True))

    def _metrics(self, total: dict[str, float], grad_norms: list[float], lr: float, counts: list[list[float]],
                 batch_samples: list[TrainSample], policy_version: int) -> dict[str, Any]:
        """A ``train`` request's metrics, from the sums over every rank ``total`` and the step's own record."""
        n_steps = len(grad_norms)
        out: dict[str, Any] = {k: total[k] / max(total["num_tokens"], 1.0) for k in MEAN_METRICS}
        # The behaviour weights' effective sample size, as a share of the loss tokens: (Σw)² / (n Σw²).
        out["is_ess_frac"] = out["is_weight_mean"] ** 2 / out["is_weight_sq_mean"] if out["is_weight_sq_mean"] else 1.0
        out.update(
            loss=total["loss"] / max(n_steps, 1),
            grad_norm=float(np.mean(grad_norms)) if grad_norms else 0.0,
            lr=lr,
            num_tokens=int(sum(c[0] for c in counts)),
            num_samples=len(batch_samples),
            num_steps=n_steps,
            optimizer_step=self.optimizer_step,
            policy_version=policy_version,
            **self._staleness(batch_samples, policy_version),
        )
        if "routing_decisions" in total:  # MoE: how far the trainer's own routing is from the engine's
            decisions = max(total["routing_decisions"], 1.0)
            out.update(routing_mismatch_frac=total["routing_mismatches"] / decisions,
                       routing_replayed_frac=total["routing_replayed"] / decisions)
        return out

    @staticmethod
    def _staleness(samples: list[TrainSample], version: int) -> dict[str, float]:
        """How many policy versions behind ``version`` (the policy being trained) the loss tokens were
        generated (:func:`agentrl.core.versions.token_staleness`); every epoch and minibatch of one request trains
        the same policy version."""
        lags = [lag for s in samples for lag in token_staleness(version, s.versions, s.loss_mask)]
        hist = Counter(lags)
        return {**{k: float(v) for k, v in staleness_stats(lags).items()},
                **{f"token_age_{age}_frac": n / len(lags) for age, n in sorted(hist.items())}}
