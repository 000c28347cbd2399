"""GRPO group advantages on the orchestrator side (plain Python, no torch)."""

import statistics

import pytest

from agentrl.orchestrator.samples import group_advantages


def test_group_advantages_normalised() -> None:
    rewards = [1.0, 0.0, 3.0, 5.0, 2.0, 2.0, 7.0]
    groups = ["a", "b", "a", "b", "c", "c", "d"]
    adv = group_advantages(rewards, groups, normalize_std=True)
    sa, sb = statistics.stdev([1.0, 3.0]), statistics.stdev([0.0, 5.0])
    assert adv[0] == pytest.approx((1.0 - 2.0) / (sa + 1e-6)) and adv[2] == pytest.approx((3.0 - 2.0) / (sa + 1e-6))
    assert adv[1] == pytest.approx((0.0 - 2.5) / (sb + 1e-6)) and adv[3] == pytest.approx((5.0 - 2.5) / (sb + 1e-6))
    assert adv[4] == 0 and adv[5] == 0, "identical rewards give zero advantage"
    assert adv[6] == 0, "a singleton group gives zero advantage"


def test_group_advantages_centred_only() -> None:
    rewards = [1.0, 4.0, 0.5, 0.5, 10.0]
    adv = group_advantages(rewards, [7, 9, 7, 7, 9], normalize_std=False)
    assert adv == pytest.approx([1 / 3, -3.0, -1 / 6, -1 / 6, 3.0])
    assert abs(adv[0] + adv[2] + adv[3]) < 1e-12
    with pytest.raises(ValueError):
        group_advantages(rewards, ["a", "b"], normalize_std=True)
