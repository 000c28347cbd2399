"""From trajectories to trainer samples: group advantages, masks and per-token behaviour data."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from agentrl.trainer.batch import TrainSample
from agentrl.types import Trajectory


@dataclass
class BatchStats:
    """What a batch of rollouts looked like (for metrics)."""

    num_episodes: int = 0
    num_failed: int = 0
    num_trained: int = 0
    num_zero_advantage: int = 0
    reward_mean: float = 0.0
    success: float = 0.0
    model_tokens: int = 0
    total_tokens: int = 0
    turns_mean: float = 0.0
    malformed_tool_calls: int = 0
    stop_reasons: dict[str, int] = field(default_factory=dict)

    def as_metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in self.__dict__.items() if k != "stop_reasons"}
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


def rollout_stats(trajs: list[Trajectory]) -> BatchStats:
    """Summary statistics of a list of episodes (success means reward >= 1)."""
    n = max(len(trajs), 1)
    return BatchStats(
        num_episodes=len(trajs),
        num_failed=sum(t.failed for t in trajs),
        reward_mean=sum(t.reward for t in trajs) / n,
        success=sum(t.reward >= 1.0 for t in trajs) / n,
        model_tokens=sum(t.num_model_tokens for t in trajs),
        total_tokens=sum(len(t.prompt_ids) + len(t.completion_ids) for t in trajs),
        turns_mean=sum(t.num_turns for t in trajs) / n,
        malformed_tool_calls=sum(t.num_malformed_tool_calls for t in trajs),
        stop_reasons=dict(Counter(t.stop_reason.value for t in trajs)),
    )


def to_samples(
    groups: list[list[Trajectory]], *, normalize_std: bool = True, keep_failed: bool = False
) -> tuple[list[TrainSample], BatchStats]:
    """Trainer samples for a batch of GRPO groups, and the batch's statistics.

    Failed episodes (env or inference errors) are left out of the group unless ``keep_failed``.
    Samples whose advantage is 0 (groups where every rollout scored the same) carry no policy gradient
    and are dropped.
    """
    import torch

    from agentrl.loss import group_advantages

    flat = [t for g in groups for t in g]
    stats = rollout_stats(flat)
    members = [t for t in flat if (keep_failed or not t.failed) and t.completion_ids]
    samples: list[TrainSample] = []
    if members:
        # one advantage per episode (its rows share it), so an episode of several rows weighs as one
        keys = [t.episode_id or f"#{i}" for i, t in enumerate(members)]
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            first.setdefault(k, i)
        rewards_E = torch.tensor([members[i].reward for i in first.values()], dtype=torch.float32)
        advs_E = group_advantages(rewards_E, [members[i].group_id for i in first.values()], normalize_std).tolist()
        adv_of = dict(zip(first, advs_E, strict=True))
        advs = [adv_of[k] for k in keys]
        for traj, adv in zip(members, advs, strict=True):
            if abs(adv) < 1e-8:
                stats.num_zero_advantage += 1
                continue
            samples.append(sample_of(traj, float(adv)))
    stats.num_trained = len(samples)
    return samples, stats


def sample_of(traj: Trajectory, advantage: float, temperature: float | None = None) -> TrainSample:
    """The trainer sample of one trajectory: prompt and completion aligned per position (prompt positions
    masked out), scored at ``temperature`` (default: the one the trajectory was sampled at)."""
    traj.check()
    p = len(traj.prompt_ids)
    return TrainSample(
        input_ids=traj.prompt_ids + traj.completion_ids,
        loss_mask=[0] * p + traj.loss_mask,
        behav_logprobs=[0.0] * p + traj.logprobs,
        advantage=advantage,
        versions=[-1] * p + traj.versions,
        temperature=traj.temperature if temperature is None else temperature,
    )
