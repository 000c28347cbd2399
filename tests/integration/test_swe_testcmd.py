"""Tasks graded by their own test runner on a real Docker engine: a bundled task re-written for unittest
(``python3 -m unittest -v``) and for a custom runner script with SymPy-style output. The reference fix must
score 1 and doing nothing 0, exactly as with the default pytest run."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from agentrl.environment.base import run_scope
from agentrl.envs.swe import SweEnv
from agentrl.envs.swe.patches import make_patch
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted
from tests.integration.test_swe import containers_of, swe_image  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration

BASE = next(t for t in SweEnv.tasks("all") if t["instance_id"] == "agentrl__durations-1")

UNITTEST_TESTS = '''import datetime
import unittest

from durations import is_leap_year, week_number


class WeekNumberTests(unittest.TestCase):
    def test_week_number(self):
        """Week 1 contains January 1st."""
        D = datetime.date
        self.assertEqual([week_number(D(2024, 1, 1)), week_number(D(2024, 1, 8)), week_number(D(2023, 1, 2))],
                         [1, 2, 2])

    def test_leap_years(self):
        self.assertEqual([is_leap_year(y) for y in (1900, 2000, 2023, 2024)], [False, True, False, True])
'''

RUNNER = '''"""Runs every test_* function of the given files; prints one `name ok|F|E` line per test."""
import importlib.util
import sys

sys.path.insert(0, ".")
failed = False
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("checks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in sorted(n for n in vars(mod) if n.startswith("test_")):
        try:
            getattr(mod, name)()
            print(name, "ok")
        except AssertionError:
            print(name, "F")
            failed = True
        except Exception:
            print(name, "E")
            failed = True
sys.exit(1 if failed else 0)
'''

CHECKS = '''import datetime

from durations import days_in_month, week_number


def test_week_number():
    assert week_number(datetime.date(2023, 1, 2)) == 2


def test_days_in_month():
    assert days_in_month(2024, 2) == 29
'''


def _unittest_task() -> dict[str, Any]:
    return {**BASE, "instance_id": "durations-unittest", "id": "durations-unittest",
            "test_patch": make_patch({}, {"tests/test_weeks_unittest.py": UNITTEST_TESTS}),
            "test_cmd": "python3 -m unittest -v {test_files}", "log_parser": "unittest",
            # the Python >= 3.11 id form and the older one: both name the test
            "FAIL_TO_PASS": ["test_week_number (tests.test_weeks_unittest.WeekNumberTests.test_week_number)"],
            "PASS_TO_PASS": ["test_leap_years (tests.test_weeks_unittest.WeekNumberTests)"]}


def _runner_task() -> dict[str, Any]:
    return {**BASE, "instance_id": "durations-runner", "id": "durations-runner",
            "test_patch": make_patch({}, {"tests/run_checks.py": RUNNER, "tests/checks_weeks.py": CHECKS}),
            "test_cmd": "python3 tests/run_checks.py tests/checks_weeks.py", "log_parser": "sympy",
            "FAIL_TO_PASS": ["test_week_number"], "PASS_TO_PASS": ["test_days_in_month"]}


async def test_non_pytest_runners_grade_oracle_1_and_null_0(swe_image: str) -> None:  # noqa: F811
    tasks = [_unittest_task(), _runner_task()]
    async with run_scope(SweEnv, f"test-testcmd-{uuid.uuid4().hex[:6]}"):
        owner = SweEnv._run.owner  # type: ignore[union-attr]
        oracle = await run_scripted(SweEnv, tasks, OraclePolicy(), max_concurrency=2)
        null = await run_scripted(SweEnv, tasks, NullPolicy(), max_concurrency=2)
    for t in oracle:
        assert t.reward == 1.0 and not t.failed and t.metrics["partial_credit"] == 1.0, (t.task_id, t.error, t.metrics)
    for t in null:
        assert t.reward == 0.0 and not t.failed, (t.task_id, t.error)
        assert t.metrics["fail_to_pass_frac"] == 0.0 and t.metrics["pass_to_pass_frac"] == 1.0, (t.task_id, t.metrics)
    assert containers_of(owner) == []


async def test_a_runner_whose_output_has_no_results_scores_0_with_a_reason(swe_image: str) -> None:  # noqa: F811
    task = {**_runner_task(), "test_cmd": "echo 'nothing to see'", "instance_id": "durations-silent"}
    env = SweEnv()
    await env.reset(task)
    try:
        for name, args in SweEnv.reference_solution(task)[:-1]:
            await env.call_tool(name, args)
        result = await env.reward([])
    finally:
        await env.close()
    assert result["reward"] == 0.0 and result["patch_applied"] == 1.0
    assert env.result is not None and env.result.error == "the sympy log parser found no test results"
    assert "nothing to see" in env.result.output
