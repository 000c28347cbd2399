"""Shared test policy: integration tests skip locally when a service is missing, and fail on CI."""

from __future__ import annotations

import os

import pytest

from agentrl.core.utils.threads import short_spin
from agentrl.sandbox._util import HOST_ENV

ON_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
"""This process's pytest-xdist worker (``gw0``, ``gw1``, ...); empty when the session runs in one process."""

# vLLM's CPU build binds an engine's threads to core 0 unless told otherwise: the engines of two workers
# would share that core while the other idles. Each worker's engines compute on a core of their own.
if WORKER.startswith("gw") and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(int(WORKER[2:]) % (os.cpu_count() or 1))

# The suite loads the cores well past their count (two workers, their engines and trainers, the model's build):
# the short OpenMP spin that agentrl gives its own children goes to every process of the session.
short_spin(os.environ)

# Each worker is a host of its own for the sandboxes' driver identity: a worker's start-up sweep of dead drivers'
# containers must not remove those a test on another worker has just orphaned on purpose (by killing their
# driver) and is about to inspect.
if WORKER.startswith("gw") and HOST_ENV not in os.environ:
    import socket

    os.environ[HOST_ENV] = f"{socket.gethostname()}-{WORKER}"

# The suite never reaches an outside host: the trackers and the Hugging Face hub run offline, analytics off
# (set before any test imports them; child processes such as vLLM servers inherit it).
os.environ.update({
    "WANDB_MODE": "offline", "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1", "GRADIO_ANALYTICS_ENABLED": "False", "DO_NOT_TRACK": "1",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
})


def pytest_configure(config: pytest.Config) -> None:
    """Trackio's local store, which it reads once at import: a directory of this session's."""
    import tempfile

    config._agentrl_trackio_dir = tempfile.mkdtemp(prefix="agentrl-tests-trackio-")  # type: ignore[attr-defined]
    os.environ["TRACKIO_DIR"] = config._agentrl_trackio_dir  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    shutil.rmtree(getattr(config, "_agentrl_trackio_dir", ""), ignore_errors=True)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files marked ``long`` run first, so that none ends the session alone; otherwise files keep their order
    (a stable sort; run with xdist's ``--no-loadscope-reorder``)."""
    _unique_node_ids(items)
    long = {item.path for item in items if item.get_closest_marker("long") is not None}
    items.sort(key=lambda item: item.path not in long)


_FILE_SECONDS: dict[str, float] = {}
_WORKER_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Time by test file and by worker (setup, call and teardown; on the xdist controller, each worker's
    reports), for the summary: what the suite's time is spent on, and how evenly the workers share it."""
    path = report.nodeid.split("::")[0]
    _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration
    gateway = getattr(getattr(report, "node", None), "gateway", None)
    worker = getattr(gateway, "id", WORKER or "main")
    _WORKER_SECONDS[worker] = _WORKER_SECONDS.get(worker, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _FILE_SECONDS or terminalreporter.config.getoption("durations", None) is None:
        return
    terminalreporter.write_sep("=", "time by test file (top 25) and by worker")
    top = sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:25]
    for path, seconds in top:
        terminalreporter.write_line(f"{seconds:8.1f}s  {path}")
    terminalreporter.write_line("  ".join(f"{w}: {s:.0f}s" for w, s in sorted(_WORKER_SECONDS.items())))


def _unique_node_ids(items: list[pytest.Item]) -> None:
    """Give items that share a node id one of their own, from their name: schemathesis names each operation's
    test ``test_x[GET /path]`` but gives them all the node id ``...::test_x``, and xdist, which schedules by
    node id, would run only the first of them."""
    from collections import Counter

    seen = Counter(item.nodeid for item in items)
    for item in items:
        if seen[item.nodeid] > 1 and item.parent is not None:
            if hasattr(item.parent, "id"):  # pytest 9: the node id is derived from a structured id
                item._id = item.parent.id.child(item.name)  # type: ignore[attr-defined]
            else:
                item._nodeid = f"{item.parent.nodeid}::{item.name}"
    left = [nodeid for nodeid, n in Counter(item.nodeid for item in items).items() if n > 1]
    if left:
        raise pytest.UsageError(f"tests share node ids (xdist would run only one of each): {left[:5]}")


def require(ok: bool, reason: str) -> None:
    """Skip (locally) or fail (on CI, where every service must be present) unless ``ok``."""
    if ok:
        return
    if ON_CI:
        pytest.fail(f"required service missing on CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_tokenizer_model(tmp_path_factory: pytest.TempPathFactory):
    """A random tiny model directory with tokenizer (no warm-up): for tests that need a valid directory."""
    from tests.fixtures_model import build_random_tiny_model

    return build_random_tiny_model(tmp_path_factory.mktemp("random-tiny"))


@pytest.fixture(autouse=True)
def _fresh_probe_counters() -> None:
    """The test environment ``Probe`` counts calls per task id in class-level counters; a test starts
    with them empty, so that what it reads does not depend on which tests ran before it on its worker
    (a session opened without a task draws one at random, which an earlier test may have counted)."""
    import sys

    helpers = sys.modules.get("tests.env_server_helpers")
    if helpers is not None:
        helpers.Probe.calls.clear()
        helpers.Probe.closed.clear()
