"""A pytest plugin that writes every test's phase outcomes to a JSON file (``$AGENTRL_GRADE_OUT``).

It runs inside the grading sandbox (copied there as a plain module and loaded with ``-p``) and on the
host when the bundled tasks are built, so both read test results the same way. Standard library only.
"""

import json
import os

_results = {}


def pytest_runtest_logreport(report):
    entry = _results.setdefault(report.nodeid, {})
    entry[report.when] = report.outcome
    if getattr(report, "wasxfail", None) is not None:
        entry["xfail"] = True


def pytest_collectreport(report):
    if report.failed:
        _results.setdefault(report.nodeid or "<collection>", {})["collect"] = "failed"


def pytest_sessionfinish(session, exitstatus):
    path = os.environ.get("AGENTRL_GRADE_OUT")
    if path:
        with open(path, "w") as f:
            json.dump(_results, f, sort_keys=True)
