"""From trajectories to trainer samples: group advantages, masks and per-token behaviour data."""

from __future__ import annotations

import math
from collections.abc import Sequence

from agentrl.core.errors import AgentRLError
from agentrl.core.types import TrainSample, Trajectory
from agentrl.core.versions import past_age_cap
from agentrl.rollout.stats import BatchStats, episodes_of, rollout_stats


class AdvantageInputError(AgentRLError, ValueError):
    """``group_advantages`` was given a different number of group ids than rewards."""

    code = "orchestrator.advantage_inputs"


def group_advantages(
    rewards: Sequence[float], group_ids: Sequence[object], normalize_std: bool, eps: float = 1e-6
) -> list[float]:
    """GRPO advantages: each reward minus its group's mean, optionally divided by (group std + eps).

    The standard deviation is the unbiased one (n - 1); a singleton group has std 0. A group whose rewards
    are all equal gets advantage 0 exactly. Plain Python: the orchestrator side never imports torch.
    """
    if len(group_ids) != len(rewards):
        raise AdvantageInputError(f"{len(group_ids)} group ids for {len(rewards)} rewards")
    members: dict[object, list[int]] = {}
    for i, g in enumerate(group_ids):
        members.setdefault(g, []).append(i)
    adv = [0.0] * len(rewards)
    for idx in members.values():
        r = [float(rewards[i]) for i in idx]
        if all(x == r[0] for x in r):
            continue
        mean = math.fsum(r) / len(r)
        scale = 1.0
        if normalize_std:
            std = math.sqrt(math.fsum((x - mean) ** 2 for x in r) / (len(r) - 1)) if len(r) > 1 else 0.0
            scale = std + eps
        for i, x in zip(idx, r, strict=True):
            adv[i] = (x - mean) / scale
    return adv


def carries_signal(group: list[Trajectory], *, keep_failed: bool = False) -> bool:
    """Whether a group gives the loss any gradient: the rewards of its trained episodes (failed ones left
    out unless ``keep_failed``, as :func:`to_samples` leaves them out) are not all equal."""
    members = [t for t in group if (keep_failed or not t.failed) and t.completion_ids]
    return len({float(rows[0].reward) for rows in episodes_of(members)}) > 1


def to_samples(
    groups: list[list[Trajectory]], *, normalize_std: bool = True, keep_failed: bool = False,
    age_cap: tuple[int, int] | None = None,
) -> tuple[list[TrainSample], BatchStats]:
    """Trainer samples for a batch of GRPO groups, and the batch's statistics.

    Failed episodes (env or inference errors) are left out of the group unless ``keep_failed``.
    Samples whose advantage is 0 (groups where every rollout scored the same) carry no policy gradient
    and are dropped. ``age_cap``: (the policy version trained, ``pipeline.max_token_age``): loss tokens older
    than the cap are masked out and counted (``stats.age_capped_tokens``); a sample left with no loss token is
    dropped.
    """
    flat = [t for g in groups for t in g]
    stats = rollout_stats(flat)
    members = [t for t in flat if (keep_failed or not t.failed) and t.completion_ids]
    samples: list[TrainSample] = []
    if members:
        # one advantage per episode (its rows share it), so an episode of several rows weighs as one
        episodes = episodes_of(members)
        advs_E = group_advantages([float(e[0].reward) for e in episodes], [e[0].group_id for e in episodes],
                                  normalize_std)
        adv_of = {id(t): adv for rows, adv in zip(episodes, advs_E, strict=True) for t in rows}
        for traj in members:
            adv = adv_of[id(traj)]
            if abs(adv) < 1e-8:
                stats.num_zero_advantage += 1
                continue
            sample = sample_of(traj, float(adv))
            if age_cap is not None:
                stats.age_capped_tokens += cap_token_age(sample, *age_cap)
                if not any(sample.loss_mask):
                    continue
            samples.append(sample)
    stats.num_trained = len(samples)
    return samples, stats


def cap_token_age(sample: TrainSample, trainer_version: int, max_age: int) -> int:
    """Mask ``sample``'s loss tokens generated more than ``max_age`` versions before ``trainer_version``
    (:func:`~agentrl.core.versions.past_age_cap`); returns how many were masked."""
    masked = 0
    for i, (v, m) in enumerate(zip(sample.versions, sample.loss_mask, strict=True)):
        if m and v >= 0 and past_age_cap(trainer_version, v, max_age):
            sample.loss_mask[i] = 0
            masked += 1
    return masked


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
        routing=traj.routing,
        sampling_mask=None if traj.sampling_mask is None else traj.sampling_mask.shifted(p),
    )
