"""The training-time limit: a step starts only if the longest of the recent steps would still end inside it."""

import pytest

from agentrl.orchestrator.budget import ClockSettingError, TrainingClock


def test_no_limit_never_stops() -> None:
    clock = TrainingClock(None)
    clock.step_done(10_000.0)
    assert clock.why_stop(1e9) is None


def test_the_first_step_starts_whenever_time_is_left() -> None:
    assert TrainingClock(60.0).why_stop(59.0) is None
    assert "is reached" in TrainingClock(60.0).why_stop(60.0)


def test_a_step_that_would_end_past_the_limit_is_not_started() -> None:
    clock = TrainingClock(45 * 60.0)
    ends = [116.0 * i for i in range(1, 24)]  # 23 steps of 116 s end at 44.5 min: a 24th would end at 46.4
    for end in ends:
        assert clock.why_stop(end - 116.0) is None
        clock.step_done(end)
    assert clock.expected_step_s() == pytest.approx(116.0)
    why = clock.why_stop(ends[-1])
    assert why is not None and "would end past" in why and "45.0 min" in why
    # had the last step been short, one more would fit
    clock = TrainingClock(45 * 60.0)
    clock.step_done(2500.0)
    clock.step_done(2530.0)
    assert clock.why_stop(2530.0) is not None  # the longest of the last three (2,500 s) is the estimate
    for end in (2560.0, 2590.0, 2620.0):
        clock.step_done(end)
    assert clock.expected_step_s() == pytest.approx(30.0) and clock.why_stop(2620.0) is None


def test_the_estimate_is_the_longest_recent_step_so_growing_steps_are_not_underestimated() -> None:
    clock = TrainingClock(1000.0, lookback=3, elapsed_s=100.0)
    for end in (200.0, 250.0, 400.0, 450.0):  # steps of 100, 50, 150, 50 s
        clock.step_done(end)
    assert clock.expected_step_s() == pytest.approx(150.0)
    assert clock.why_stop(849.0) is None and clock.why_stop(851.0) is not None


@pytest.mark.parametrize(("limit", "lookback"), [(0.0, 3), (-1.0, 3), (10.0, 0)])
def test_bad_settings_are_refused(limit: float, lookback: int) -> None:
    with pytest.raises(ClockSettingError):
        TrainingClock(limit, lookback=lookback)
