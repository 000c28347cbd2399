"""Bundled repositories: their clean sources, the buggy base tree an episode starts from, and a host
directory holding that tree for upload into a sandbox.

The base tree of a bundled task is the repository's clean source with the task's ``patch`` undone,
without its ``tests/`` directory and without any file the ``test_patch`` touches: the agent never sees
the hidden tests, and the fix is nowhere in what it gets.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from pathlib import Path

from agentrl.core.errors import EnvError
from agentrl.envs.swe.gitobj import tree_id
from agentrl.envs.swe.patches import apply_patch
from agentrl.envs.swe.task import SweTask

REPOS_DIR = Path(__file__).resolve().parent / "repos"
"""Clean sources of the bundled repositories, one directory each."""
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".git", ".ruff_cache"}
HIDDEN_DIRS = ("tests/",)
"""Directories of a bundled repository that the agent never sees (the hidden tests live there)."""


class NoBundledRepo(EnvError, FileNotFoundError):
    """A task without an image of its own names a repository that is not bundled."""

    code = "env.swe.no_bundled_repo"


def bundled_dir(repo: str) -> Path | None:
    """The bundled repository for ``repo`` (``owner/name`` or ``name``), or None."""
    path = REPOS_DIR / repo.rsplit("/", 1)[-1]
    return path if path.is_dir() else None


def read_tree(root: Path) -> dict[str, str]:
    """Text files under ``root`` (relative POSIX path -> content), caches skipped."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = Path(dirpath) / name
            out[path.relative_to(root).as_posix()] = path.read_text()
    return out


@functools.lru_cache(maxsize=8)
def clean_tree(repo: str) -> dict[str, str]:
    """The clean (fixed) sources of a bundled repository."""
    path = bundled_dir(repo)
    if path is None:
        raise NoBundledRepo(f"no bundled repository {repo!r} under {REPOS_DIR}")
    return read_tree(path)


def strip_hidden(files: dict[str, str], test_paths: set[str]) -> dict[str, str]:
    """``files`` without the hidden test directories and the test patch's files."""
    return {p: c for p, c in files.items() if not p.startswith(HIDDEN_DIRS) and p not in test_paths}


def base_tree(task: SweTask) -> dict[str, str]:
    """What the agent starts from: clean sources, fix undone, hidden tests removed."""
    return strip_hidden(apply_patch(clean_tree(task.repo), task.patch, reverse=True), task.test_paths)


def as_bytes(files: dict[str, str]) -> dict[str, bytes]:
    return {p: c.encode() for p, c in files.items()}


def materialize(files: dict[str, str]) -> Path:
    """A host directory holding exactly ``files`` (content-addressed by their git tree id, reused across
    episodes and processes; written atomically)."""
    root = Path(tempfile.gettempdir()) / f"agentrl-swe-{os.getuid()}"
    target = root / tree_id(as_bytes(files))
    if target.is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        for rel, content in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            path.chmod(0o644)
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:  # another process won the race: its copy is identical
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
