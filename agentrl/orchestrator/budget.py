"""The training-time limit (``RunConfig.time_limit_min``): the training loop's own wall time, without
start-up and evaluations, and a step is started only if it is expected to end inside the limit.

Checking the elapsed time alone between steps lets the last step start just under the limit and end a whole
step past it (a lookup step on two cores is 2 minutes). The expected length of the next step is the longest
of the last few: steps grow as a policy's episodes grow, and a step shorter than the longest recent one is
the common case, so the limit is kept in all but a step far longer than any before it.
"""

from __future__ import annotations

from collections import deque

from agentrl.core.errors import AgentRLError


class ClockSettingError(AgentRLError, ValueError):
    """A training clock was asked for with a limit or a lookback that is not positive."""

    code = "orchestrator.budget.clock_setting"


class TrainingClock:
    """Training time spent and whether the next step fits in ``limit_s`` (``None``: no limit).

    :meth:`step_done` is given the training time at the end of each step (``elapsed_s``: the loop's wall time
    less evaluations); the step's length is the difference from the previous one."""

    def __init__(self, limit_s: float | None, lookback: int = 3, elapsed_s: float = 0.0) -> None:
        if limit_s is not None and limit_s <= 0:
            raise ClockSettingError(f"a training-time limit must be positive, not {limit_s}")
        if lookback < 1:
            raise ClockSettingError(f"lookback must be at least 1, not {lookback}")
        self.limit_s = limit_s
        self._last_end_s = elapsed_s
        self._recent: deque[float] = deque(maxlen=lookback)

    def step_done(self, elapsed_s: float) -> None:
        """A step ended at ``elapsed_s`` of training time."""
        self._recent.append(max(0.0, elapsed_s - self._last_end_s))
        self._last_end_s = elapsed_s

    def expected_step_s(self) -> float:
        """The next step's expected length: the longest of the recent ones (0 before the first)."""
        return max(self._recent, default=0.0)

    def why_stop(self, elapsed_s: float) -> str | None:
        """Why no step should start at ``elapsed_s`` of training time, or ``None`` if one fits."""
        if self.limit_s is None:
            return None
        if elapsed_s >= self.limit_s:
            return f"the training-time limit of {self.limit_s / 60:.1f} min is reached ({elapsed_s / 60:.1f} min)"
        expected = self.expected_step_s()
        if elapsed_s + expected > self.limit_s:
            return (f"the next step (about {expected:.0f} s, the longest of the last {len(self._recent)}) would end "
                    f"past the training-time limit of {self.limit_s / 60:.1f} min ({elapsed_s / 60:.1f} min spent)")
        return None
