"""From trajectories to trainer samples: advantages per group, failed and zero-advantage episodes left out."""

from __future__ import annotations

import pytest

from agentrl.core.types import StopReason, Trajectory
from agentrl.orchestrator.samples import to_samples


def traj(gid: str, reward: float, stop: StopReason = StopReason.COMPLETED) -> Trajectory:
    return Trajectory(task_id=gid, env="t", group_id=gid, prompt_ids=[1, 2], completion_ids=[3, 4, 5],
                      loss_mask=[1, 0, 1], logprobs=[-0.1, 0.0, -0.3], versions=[2, -1, 2],
                      reward=reward, stop_reason=stop)


def test_to_samples_advantages_and_alignment() -> None:
    groups = [[traj("a", 1.0), traj("a", 0.0)], [traj("b", 1.0), traj("b", 1.0)]]
    samples, stats = to_samples(groups, normalize_std=False)
    assert [s.advantage for s in samples] == [0.5, -0.5]
    s = samples[0]
    assert s.input_ids == [1, 2, 3, 4, 5]
    assert s.loss_mask == [0, 0, 1, 0, 1]
    assert s.behav_logprobs == pytest.approx([0.0, 0.0, -0.1, 0.0, -0.3])
    assert s.versions == [-1, -1, 2, -1, 2]
    assert (stats.num_episodes, stats.num_trained, stats.num_zero_advantage) == (4, 2, 2)
    assert stats.success == 0.75 and stats.reward_mean == 0.75


def test_failed_episodes_are_counted_not_trained() -> None:
    groups = [[traj("a", 1.0), traj("a", 0.0), traj("a", 0.0, StopReason.ENV_ERROR)]]
    samples, stats = to_samples(groups, normalize_std=False)
    assert stats.num_failed == 1 and stats.stop_reasons == {"completed": 2, "env_error": 1}
    assert [s.advantage for s in samples] == [0.5, -0.5]
    samples, _ = to_samples(groups, normalize_std=False, keep_failed=True)
    assert [round(s.advantage, 4) for s in samples] == [0.6667, -0.3333, -0.3333]


def test_rows_of_one_episode_share_one_advantage() -> None:
    """A black-box episode of several rows weighs as one episode in its group's statistics."""
    from agentrl.core.types import Trajectory
    from agentrl.orchestrator.samples import to_samples

    def row(ep: str, reward: float) -> Trajectory:
        return Trajectory(task_id="t", env="e", group_id="g", episode_id=ep, prompt_ids=[1], completion_ids=[2],
                          loss_mask=[1], logprobs=[-0.1], versions=[0], reward=reward, num_turns=1)

    samples, stats = to_samples([[row("a", 1.0), row("a", 1.0), row("a", 1.0), row("b", 0.0)]], normalize_std=False)
    assert [s.advantage for s in samples] == [0.5, 0.5, 0.5, -0.5]  # rows as episodes would give 0.25 / -0.75
    # the metrics count episodes and rows apart: success is per episode (rows would give 0.75)
    assert (stats.num_episodes, stats.num_rows, stats.success, stats.reward_mean) == (2, 4, 0.5, 0.5)
    assert stats.turns_mean == 2.0 and stats.num_trained == 4, "turns: the calls of each episode, over its rows"


def test_a_group_carries_signal_when_its_trained_rewards_differ() -> None:
    from agentrl.orchestrator.samples import carries_signal

    assert carries_signal([traj("a", 1.0), traj("a", 0.0)])
    assert not carries_signal([traj("a", 1.0), traj("a", 1.0)])
    assert not carries_signal([traj("a", 0.0), traj("a", 0.0)])
    # a failed episode is not trained, so its reward does not count, unless failed episodes are kept
    mixed_by_failure = [traj("a", 1.0), traj("a", 0.0, StopReason.ENV_ERROR)]
    assert not carries_signal(mixed_by_failure) and carries_signal(mixed_by_failure, keep_failed=True)
    # agreement with to_samples: no signal is exactly no trained sample
    for group in ([traj("b", 1.0), traj("b", 1.0)], [traj("c", 0.5), traj("c", 0.0)], mixed_by_failure):
        assert carries_signal(group) == bool(to_samples([group])[0])


def test_tokens_past_the_age_cap_are_masked_and_counted_never_trained() -> None:
    """A partial rollout's tokens from versions 1 and 3, trained at version 5 with the cap at 3: the version-1
    token (age 4) leaves the loss, and is counted; a row left with no loss token is not sent at all."""
    old, mixed = traj("a", 1.0), traj("a", 0.0)
    old.versions, mixed.versions = [1, -1, 1], [1, -1, 3]
    samples, stats = to_samples([[old, mixed]], normalize_std=False, age_cap=(5, 3))
    assert [s.loss_mask for s in samples] == [[0, 0, 0, 0, 1]]
    assert samples[0].versions == [-1, -1, 1, -1, 3]
    assert stats.age_capped_tokens == 3 and stats.num_trained == 1
    assert old.loss_mask == [1, 0, 1]  # the trajectory itself keeps its record
    kept, stats = to_samples([[old, mixed]], normalize_std=False, age_cap=(5, 4))
    assert stats.age_capped_tokens == 0 and len(kept) == 2
