"""Log parsers for tasks graded by their own test command (``SweTask.test_cmd``): test output -> status per
test id.

A status is one of ``passed``, ``failed``, ``error``, ``skipped``, ``xfailed`` (see `results.PASSING`). A
task's ``FAIL_TO_PASS``/``PASS_TO_PASS`` ids must be written the way its parser names tests:

- ``pytest``: pytest's ``-rA`` summary (``PASSED tests/test_a.py::test_x``) or ``-v`` lines
  (``tests/test_a.py::test_x PASSED``); ids are node ids.
- ``unittest`` (also Django's ``runtests.py``, which prints the same): verbose lines
  ``test_x (pkg.module.Class.test_x) ... ok``; ids as printed, ``test_x (pkg.module.Class.test_x)``. The
  Python < 3.11 form ``test_x (pkg.module.Class)`` names the same test, so rows made with either match.
- ``sympy`` (SymPy's ``bin/test``, or any runner that prints one ``name status`` line per test): lines
  ``test_x ok`` / ``F`` / ``E`` / ``f`` (expected failure) / ``X`` (unexpected pass) / ``s`` (skipped);
  ids are the names.

More parsers can be added with `register_log_parser` (Python code of the user, never named by a row).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agentrl.core.errors import EnvError


class LogParserError(EnvError, ValueError):
    """A log parser name is not allowed, or names no registered parser."""

    code = "env.swe.log_parser"


LogParser = Callable[[str], dict[str, str]]
"""Test output (stdout and stderr) -> status per test id."""

_PYTEST_STATUS = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error", "SKIPPED": "skipped",
                  "XFAIL": "xfailed", "XPASS": "passed"}
_PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+::\S+?)(?: - .*)?$")
_PYTEST_VERBOSE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def parse_pytest(log: str) -> dict[str, str]:
    """pytest ``-rA`` summary lines or ``-v`` progress lines (a later line wins: the summary comes last)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        line = line.rstrip()
        if m := _PYTEST_SUMMARY.match(line):
            out[m.group(2)] = _PYTEST_STATUS[m.group(1)]
        elif m := _PYTEST_VERBOSE.match(line):
            out[m.group(1)] = _PYTEST_STATUS[m.group(2)]
    return out


_UNITTEST_NAME = re.compile(r"^(\w+) \(([\w.]+)\)")
_UNITTEST_RESULT = re.compile(r" \.\.\. (ok|FAIL|ERROR|skipped\b.*|expected failure|unexpected success)$")
_UNITTEST_STATUS = {"ok": "passed", "FAIL": "failed", "ERROR": "error", "expected failure": "xfailed",
                    "unexpected success": "failed"}


def parse_unittest(log: str) -> dict[str, str]:
    """unittest's verbose lines (``-v``; Django's ``runtests.py --verbosity 2``). A test with a docstring
    prints its name on one line and ``docstring ... ok`` on the next; both forms are read."""
    out: dict[str, str] = {}
    pending = ""  # the last "test_x (a.B)" line that had no result on it
    for line in log.splitlines():
        line = line.rstrip()
        name = _UNITTEST_NAME.match(line)
        result = _UNITTEST_RESULT.search(line)
        if name and not result:
            pending = f"{name.group(1)} ({name.group(2)})"
            continue
        if not result:
            continue
        test = f"{name.group(1)} ({name.group(2)})" if name else pending
        pending = ""
        if not test:
            continue
        word = result.group(1)
        status = "skipped" if word.startswith("skipped") else _UNITTEST_STATUS[word]
        out[test] = status
        short, dotted = test.split(" (", 1)
        dotted = dotted[:-1]
        if dotted.endswith("." + short):  # Python >= 3.11 names; also record the older form
            out.setdefault(f"{short} ({dotted[: -len(short) - 1]})", status)
    return out


_SYMPY_LINE = re.compile(r"^(test_\w+) (ok|F|E|f|X|s|Skipped)\b")
_SYMPY_STATUS = {"ok": "passed", "F": "failed", "E": "error", "f": "xfailed", "X": "passed", "s": "skipped",
                 "Skipped": "skipped"}


def parse_sympy(log: str) -> dict[str, str]:
    """One ``test_name status`` line per test (SymPy's ``bin/test`` style)."""
    out: dict[str, str] = {}
    for line in log.splitlines():
        if m := _SYMPY_LINE.match(line.strip()):
            out[m.group(1)] = _SYMPY_STATUS[m.group(2)]
    return out


LOG_PARSERS: dict[str, LogParser] = {"pytest": parse_pytest, "unittest": parse_unittest, "django": parse_unittest,
                                     "sympy": parse_sympy}
"""Parsers by the name a task row gives in ``log_parser``."""


def register_log_parser(name: str, parser: LogParser) -> None:
    """Make ``parser`` available to task rows as ``log_parser: name`` (before the rows are loaded)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise LogParserError(f"log parser name {name!r}: use letters, digits, '_', '.', '-'")
    LOG_PARSERS[name] = parser


def parse_log(name: str, log: str) -> dict[str, str]:
    """Statuses of the tests in ``log``, read by the parser called ``name``."""
    try:
        parser = LOG_PARSERS[name]
    except KeyError:
        raise LogParserError(f"unknown log parser {name!r}; known: {sorted(LOG_PARSERS)}") from None
    return parser(log)
