"""Packaging (``setup.py``): the SWE tasks' small repositories install as package data of ``agentrl.envs.swe``,
every file of them (their Python sources and tests included), and none of their directories is a package;
the SWE environment finds them next to its own modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPOS = ROOT / "envs" / "swe" / "repos"
SETUP_ARGS = """
import json, runpy, sys, setuptools
captured = {}
setuptools.setup = lambda **kw: captured.update(kw)
runpy.run_path(sys.argv[1], run_name="__main__")
print(json.dumps({k: captured[k] for k in ("packages", "package_data")}))
"""


@pytest.fixture(scope="module")
def setup_args() -> dict[str, Any]:
    """What ``setup.py`` passes to ``setup()`` (nothing is built; in a process of its own, so that setuptools,
    which replaces distutils when imported, stays out of this one)."""
    out = subprocess.run([sys.executable, "-c", SETUP_ARGS, str(ROOT / "setup.py")], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_repositories_are_not_packages(setup_args: dict[str, Any]) -> None:
    packages = setup_args["packages"]
    assert {"agentrl", "agentrl.envs.swe", "agentrl.envs.swe.data", "agentrl.sandbox.recipe"} <= set(packages)
    assert not [p for p in packages if p.startswith("agentrl.envs.swe.repos")]


def test_every_file_of_the_repositories_is_package_data_of_the_swe_package(setup_args: dict[str, Any]) -> None:
    data = setup_args["package_data"]["agentrl.envs.swe"]
    on_disk = sorted(p.relative_to(REPOS.parent).as_posix() for p in REPOS.rglob("*") if p.is_file()
                     and not any(part == "__pycache__" or part.startswith(".") for part in p.relative_to(REPOS).parts)
                     and p.suffix not in (".pyc", ".pyo"))
    assert sorted(data) == on_disk
    assert "repos/durations/durations/parse.py" in data and "repos/durations/tests/test_parse.py" in data
    assert "repos/durations/pyproject.toml" in data


def test_the_swe_environment_finds_the_repositories_next_to_its_modules() -> None:
    import agentrl.envs.swe
    from agentrl.envs.swe.build_tasks import REPOS as NAMES
    from agentrl.envs.swe.repo import REPOS_DIR, bundled_dir

    assert REPOS_DIR == Path(agentrl.envs.swe.__file__).resolve().parent / "repos"
    assert all(bundled_dir(name) == REPOS_DIR / name for name in NAMES)
