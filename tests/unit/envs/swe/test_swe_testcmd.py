"""Per-task test commands: log parsers (on the real output of unittest and pytest, run here on the host),
the ``test_cmd``/``log_parser`` fields of task rows, and placeholder filling."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from agentrl.envs.swe import SweEnv, SweTask
from agentrl.envs.swe.logparse import LOG_PARSERS, parse_log, register_log_parser

UNITTEST_FILE = '''
import unittest

class T(unittest.TestCase):
    def test_ok(self):
        pass

    def test_fail(self):
        self.assertEqual(1, 2)

    def test_error(self):
        raise RuntimeError("boom")

    def test_doc(self):
        """A docstring puts the result on the next line."""

    @unittest.skip("not today")
    def test_skip(self):
        pass

    @unittest.expectedFailure
    def test_xfail(self):
        self.assertEqual(1, 2)

    @unittest.expectedFailure
    def test_xpass(self):
        pass
'''


def _run(tmp_path: Path, *argv: str) -> str:
    r = subprocess.run([sys.executable, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    return r.stdout + r.stderr


def test_unittest_parser_reads_real_verbose_output(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "test_mod.py").write_text(UNITTEST_FILE)
    found = parse_log("unittest", _run(tmp_path, "-m", "unittest", "-v", "pkg/test_mod.py"))
    want = {"test_ok": "passed", "test_fail": "failed", "test_error": "error", "test_doc": "passed",
            "test_skip": "skipped", "test_xfail": "xfailed", "test_xpass": "failed"}
    for name, status in want.items():  # the Python < 3.11 form of the id names the same test
        assert found[f"{name} (pkg.test_mod.T)"] == status, (name, found)
        if sys.version_info >= (3, 11):
            assert found[f"{name} (pkg.test_mod.T.{name})"] == status
    assert parse_log("django", "test_a (app.tests.X) ... ok\n") == {"test_a (app.tests.X)": "passed"}


def test_pytest_parser_reads_real_summary_and_verbose_output(tmp_path: Path) -> None:
    (tmp_path / "test_p.py").write_text(
        "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    assert 0\n\n"
        "@pytest.mark.parametrize('x', [1, 2])\ndef test_c(x):\n    assert x == 1\n\n"
        "@pytest.mark.xfail\ndef test_d():\n    assert 0\n")
    want = {"test_p.py::test_a": "passed", "test_p.py::test_b": "failed", "test_p.py::test_c[1]": "passed",
            "test_p.py::test_c[2]": "failed", "test_p.py::test_d": "xfailed"}
    for flags in (["-rA", "-q"], ["-v"]):
        log = _run(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", *flags, "test_p.py")
        assert parse_log("pytest", log) == want, log


def test_sympy_parser() -> None:
    log = ("============ test process starts ============\nsympy/core/tests/test_basic.py[3] \n"
           "test_a ok\ntest_b F\ntest_c E\ntest_d f\ntest_e X\ntest_f s\n________ failures ________\n")
    assert parse_log("sympy", log) == {"test_a": "passed", "test_b": "failed", "test_c": "error",
                                       "test_d": "xfailed", "test_e": "passed", "test_f": "skipped"}


def _row(**kw: object) -> dict[str, object]:
    row = dict(SweEnv.tasks("all")[0])
    row.update(kw)
    return row


def test_task_test_cmd_fields() -> None:
    assert SweTask.model_validate(_row()).test_command() is None  # pytest by default
    with pytest.raises(ValidationError, match="unknown log parser 'nose'"):
        SweTask.model_validate(_row(test_cmd="nosetests", log_parser="nose"))
    with pytest.raises(ValidationError, match="log_parser 'unittest' needs a test_cmd"):
        SweTask.model_validate(_row(log_parser="unittest"))
    with pytest.raises(ValidationError, match="test_cmd is empty"):
        SweTask.model_validate(_row(test_cmd="  "))
    task = SweTask.model_validate(_row(test_cmd="python3 -m unittest -v {test_files} # {test_ids}",
                                       log_parser="unittest", FAIL_TO_PASS=["test_x (a.B)"], PASS_TO_PASS=[]))
    assert task.test_command() == "python3 -m unittest -v tests/test_calendar.py # 'test_x (a.B)'"


def test_register_log_parser() -> None:
    register_log_parser("tap-lite", lambda log: {line[3:]: "passed" for line in log.splitlines()
                                                 if line.startswith("ok ")})
    try:
        assert SweTask.model_validate(_row(test_cmd="./t", log_parser="tap-lite")).log_parser == "tap-lite"
        assert parse_log("tap-lite", "ok one\nnot ok two\n") == {"one": "passed"}
    finally:
        del LOG_PARSERS["tap-lite"]
    with pytest.raises(ValueError, match="use letters"):
        register_log_parser("a b", lambda log: {})
