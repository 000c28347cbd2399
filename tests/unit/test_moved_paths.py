"""The regrouped tree keeps every old import path: each names the very module at its new place (one class per
concept, whichever path imported it), ``python -m`` included; and the top level stays small."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import agentrl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(agentrl.MOVED))
def test_an_old_path_is_the_module_at_its_new_one(old: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(agentrl.MOVED[old])


def test_submodules_and_names_through_old_paths_are_the_same_objects() -> None:
    from agentrl.core.errors import AgentRLError
    from agentrl.core.versions import PolicyVersion
    from agentrl.errors import AgentRLError as OldError
    from agentrl.http.server.app import create_app
    from agentrl.server.app import create_app as old_create_app
    from agentrl.versions import PolicyVersion as OldVersion

    assert (OldError, OldVersion, old_create_app) == (AgentRLError, PolicyVersion, create_app)
    old = importlib.import_module("agentrl.bench.shell_env")  # an env spec users write in configs
    assert old is importlib.import_module("agentrl.tools.bench.shell_env")
    assert old.__spec__.name == "agentrl.tools.bench.shell_env"  # the module keeps its own spec


def test_a_name_that_was_never_there_still_fails() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agentrl.bench.no_such_module")
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("agentrl.no_such_package")


def test_python_dash_m_runs_an_old_path() -> None:
    r = subprocess.run([sys.executable, "-m", "agentrl.bench.trainer_memory", "--help"], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_the_top_level_holds_at_most_16_entries() -> None:
    entries = sorted(p.name for p in (ROOT / "agentrl").iterdir()
                     if p.name != "__pycache__" and not p.name.startswith("."))
    assert len(entries) <= 16, entries
    for old in agentrl.MOVED:  # the old places are not on disk: the map is what keeps them
        rel = Path(*old.split(".")[1:])
        assert not (ROOT / "agentrl" / rel).exists() and not (ROOT / "agentrl" / rel.with_suffix(".py")).exists()
