"""Test outcomes: from the grading plugin's raw phase records to pass/fail per test id, and the score."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PASSING = frozenset({"passed", "xfailed"})
"""Statuses that count as a pass (as in SWE-bench: an expected failure counts)."""


def phase_status(phases: dict[str, Any]) -> str:
    """``passed``, ``failed``, ``error`` (setup/teardown failed), ``xfailed`` or ``skipped`` for one test's
    phase records (``{"setup": "passed", "call": "failed", ...}``)."""
    if phases.get("setup") == "failed" or phases.get("teardown") == "failed" or phases.get("collect") == "failed":
        return "error"
    call = phases.get("call")
    if call == "failed":
        return "failed"
    if phases.get("xfail"):
        return "xfailed" if call in (None, "skipped") else "passed"
    if call == "passed":
        return "passed"
    return "skipped"


def statuses(raw: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Status of every test id in the plugin's output."""
    return {nodeid: phase_status(phases) for nodeid, phases in raw.items()}


@dataclass(frozen=True)
class Score:
    """How the listed tests did."""

    fail_to_pass: dict[str, bool]
    pass_to_pass: dict[str, bool]

    @property
    def resolved(self) -> bool:
        """Every FAIL_TO_PASS and PASS_TO_PASS test passes (the reward is 1 exactly then)."""
        return all(self.fail_to_pass.values()) and all(self.pass_to_pass.values())

    @property
    def partial_credit(self) -> float:
        """Fraction of all listed tests that pass."""
        values = [*self.fail_to_pass.values(), *self.pass_to_pass.values()]
        return sum(values) / len(values) if values else 0.0

    def metrics(self) -> dict[str, float]:
        """Scalars for the trajectory's metrics (never the reward)."""
        f2p, p2p = self.fail_to_pass, self.pass_to_pass
        return {
            "partial_credit": self.partial_credit,
            "fail_to_pass_frac": sum(f2p.values()) / len(f2p) if f2p else 1.0,
            "pass_to_pass_frac": sum(p2p.values()) / len(p2p) if p2p else 1.0,
        }


def score(status: dict[str, str], fail_to_pass: list[str], pass_to_pass: list[str]) -> Score:
    """Score the listed tests; a test missing from ``status`` (not collected, file broken) fails."""
    return Score(
        {t: status.get(t) in PASSING for t in fail_to_pass},
        {t: status.get(t) in PASSING for t in pass_to_pass},
    )


def files_of(test_ids: list[str]) -> list[str]:
    """The files of pytest node ids (``tests/test_a.py::test_x[1]`` -> ``tests/test_a.py``), sorted."""
    return sorted({t.split("::", 1)[0] for t in test_ids})
