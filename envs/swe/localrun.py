"""Run a repository tree's tests on this machine, for the task builder (no sandbox: the trees are ours).

The results come from the same pytest plugin the grader uses in the sandbox. Issue probes (reproduction
scripts) run the same way, as plain subprocesses in a temporary copy of the tree.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from agentrl.envs.swe.grading import PLUGIN_MODULE, PLUGIN_SOURCE
from agentrl.envs.swe.results import statuses

_ENV = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


def write_tree(root: Path, files: dict[str, str]) -> None:
    """Write ``files`` (relative path -> text) under ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def _env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHON", "COV_"))}
    return env | _ENV | extra


def run_tests(files: dict[str, str], timeout: float = 60.0) -> dict[str, str] | None:
    """Status of every test under ``tests/`` of the tree ``files``; None when the run hangs or crashes."""
    with tempfile.TemporaryDirectory(prefix="agentrl-swe-build-") as tmp:
        repo, grade = Path(tmp) / "repo", Path(tmp) / "grade"
        write_tree(repo, files)
        grade.mkdir()
        shutil.copy(PLUGIN_SOURCE, grade / f"{PLUGIN_MODULE}.py")
        out = grade / "results.json"
        cmd = [sys.executable, "-m", "pytest", "-p", PLUGIN_MODULE, "-p", "no:cacheprovider", "-q", "tests"]
        env = _env({"PYTHONPATH": str(grade), "AGENTRL_GRADE_OUT": str(out)})
        try:
            subprocess.run(cmd, cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return None
        with contextlib.suppress(OSError, ValueError):
            return statuses(json.loads(out.read_text()))
        return None


def run_script(files: dict[str, str], script: str, timeout: float = 30.0) -> str:
    """stdout+stderr of ``script`` run by a fresh interpreter in a directory holding ``files``."""
    with tempfile.TemporaryDirectory(prefix="agentrl-swe-probe-") as tmp:
        write_tree(Path(tmp), files)
        (Path(tmp) / "agentrl_probe.py").write_text(script)
        r = subprocess.run([sys.executable, "agentrl_probe.py"], cwd=tmp, env=_env({}), capture_output=True,
                           text=True, timeout=timeout, check=False)
        return r.stdout + r.stderr
