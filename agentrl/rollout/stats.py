"""Summaries of a batch of trajectories: rewards, turns, tool-call errors, stop reasons (plain Python)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrl.core.types import Trajectory


@dataclass
class BatchStats:
    """What a batch of rollouts looked like (for metrics)."""

    num_episodes: int = 0
    """Episodes: an agent program's episode counts once however many rows it recorded (see ``num_rows``)."""
    num_rows: int = 0
    """Token rows (trajectories): one per episode of agentrl's own loop; one or more per black-box episode
    (an agent that rewrites its history, or ``n > 1`` choices, records several)."""
    num_failed: int = 0
    """Failed episodes."""
    num_trained: int = 0
    num_zero_advantage: int = 0
    age_capped_tokens: int = 0
    """Loss tokens masked out for their age (older than ``pipeline.max_token_age``): generated, not trained."""
    reward_mean: float = 0.0
    success: float = 0.0
    model_tokens: int = 0
    total_tokens: int = 0
    turns_mean: float = 0.0
    malformed_tool_calls: int = 0
    stop_reasons: dict[str, int] = field(default_factory=dict)
    routing_coverage: float | None = None
    """MoE runs: the fraction of fed positions (all tokens but each episode's last) whose expert routing the
    engine returned; None when no episode carries routing."""
    sampling_mask_coverage: float | None = None
    """Truncated sampling: the fraction of model tokens with a recorded kept set that cut something; None when
    no row carries sampling masks."""
    mask_bytes_per_token: float | None = None
    """Truncated sampling: stored mask bytes (counts included) per token of the rows that carry masks."""

    def as_metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.__dict__.items() if k != "stop_reasons" and v is not None}
        out.update({f"stop_{k}": float(v) for k, v in self.stop_reasons.items()})
        return out


def metric_means(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """``metric_<name>``: the mean of each per-episode metric (e.g. partial credit) over the episodes that
    report it."""
    sums: dict[str, list[float]] = {}
    for t in trajs:
        for k, v in t.metrics.items():
            sums.setdefault(k, []).append(v)
    return {f"metric_{k}": sum(v) / len(v) for k, v in sorted(sums.items())}


def error_lines(trajs: Sequence[Trajectory], limit: int = 5) -> list[str]:
    """The distinct first lines of the failed episodes' errors (at most ``limit``, sorted): why they failed,
    beside ``num_failed``."""
    return sorted({(t.error or "").splitlines()[0] if t.error else "" for t in trajs if t.failed})[:limit]


def episodes_of(trajs: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """The rows of each episode, in first-seen order (rows share their ``episode_id``; a row without one is an
    episode of its own)."""
    by_id: dict[str, list[Trajectory]] = {}
    out: list[list[Trajectory]] = []
    for t in trajs:
        if not t.episode_id:
            out.append([t])
        elif t.episode_id in by_id:
            by_id[t.episode_id].append(t)
        else:
            by_id[t.episode_id] = rows = [t]
            out.append(rows)
    return out


def rollout_stats(trajs: list[Trajectory]) -> BatchStats:
    """Summary statistics of a list of rows: rewards, success (reward >= 1), failures and turns per episode
    (its rows share one reward), tokens per row."""
    episodes = episodes_of(trajs)
    n = max(len(episodes), 1)
    return BatchStats(
        num_episodes=len(episodes),
        num_rows=len(trajs),
        num_failed=sum(any(t.failed for t in e) for e in episodes),
        reward_mean=sum(e[0].reward for e in episodes) / n,
        success=sum(e[0].reward >= 1.0 for e in episodes) / n,
        model_tokens=sum(t.num_model_tokens for t in trajs),
        total_tokens=sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajs),
        turns_mean=sum(t.num_turns for t in trajs) / n,
        malformed_tool_calls=sum(t.num_malformed_tool_calls for t in trajs),
        stop_reasons=dict(Counter(t.stop_reason.value for t in trajs)),
        routing_coverage=_routing_coverage(trajs),
        **_mask_stats(trajs),
    )


def summarize(trajs: list[Trajectory]) -> dict[str, Any]:
    """An evaluation's summary of ``trajs``: success rate, mean reward, stop reasons, the mean of every
    episode metric, and why failed episodes failed (``errors``)."""
    out: dict[str, Any] = {k: v for k, v in rollout_stats(trajs).as_metrics().items() if not k.startswith("num_zero")}
    out.update(metric_means(trajs))
    out["errors"] = error_lines(trajs)
    return out


def _routing_coverage(trajs: list[Trajectory]) -> float | None:
    routed = [t for t in trajs if t.routing is not None]
    if not routed:
        return None
    fed = sum(max(len(t.prompt_ids) + len(t.completion_ids) - 1, 0) for t in routed)
    return sum(t.routing.n for t in routed if t.routing is not None) / max(fed, 1)


def _mask_stats(trajs: list[Trajectory]) -> dict[str, float]:
    masked = [t for t in trajs if t.sampling_mask is not None]
    if not masked:
        return {}
    model = sum(t.num_model_tokens for t in trajs)
    covered = sum(1 for t in masked if t.sampling_mask is not None
                  for c, m in zip(t.sampling_mask.counts, t.loss_mask, strict=False) if m and c)
    tokens = sum(len(t.completion_ids) for t in masked)
    stored = sum(t.sampling_mask.bytes_per_token() * t.sampling_mask.n for t in masked if t.sampling_mask is not None)
    return {"sampling_mask_coverage": covered / max(model, 1), "mask_bytes_per_token": stored / max(tokens, 1)}
