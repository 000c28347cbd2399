"""Which changes of the agent reach grading: never tests, test configuration or files the test patch owns.

The agent's diff is split per file and every block touching a protected path is dropped before the diff
is applied in the fresh grading sandbox. A conftest.py that forces tests to pass, an edited or deleted
test file, or a pytest.ini that deselects tests therefore has no effect on the reward.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from agentrl.envs.swe.patches import FilePatch, parse_patch

CONFIG_NAMES = frozenset({
    "conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "noxfile.py",
    "sitecustomize.py", "usercustomize.py", ".pytest_cache",
})  # fmt: skip
"""File names whose changes could alter how tests are collected or run."""
TEST_DIRS = frozenset({"test", "tests"})
"""Directory names whose contents are test code."""


def is_protected(path: str, owned: Iterable[str] = ()) -> bool:
    """Whether a change to ``path`` (relative to the repository root) is ignored at grading: test code,
    test configuration, interpreter start-up hooks, paths in ``owned`` (the test patch's files), symlink
    tricks, and anything that is not a plain relative path inside the repository."""
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == "." or norm.startswith("../") or norm == "..":
        return True
    parts = norm.split("/")
    name = parts[-1]
    if ".git" in parts or name in CONFIG_NAMES or name.endswith(".pth"):
        return True
    if (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py") or name == "tests.py":
        return True
    if any(p in TEST_DIRS for p in parts[:-1]):
        return True
    return norm in {posixpath.normpath(p) for p in owned}


def _symlink(fp: FilePatch) -> bool:
    return any(line.endswith("120000") for line in fp.mode_lines)


def filter_patch(patch: str, owned: Iterable[str] = ()) -> tuple[str, list[str]]:
    """``patch`` without the blocks that touch protected paths or create symlinks; also returns the
    dropped paths (sorted)."""
    owned = list(owned)
    kept: list[str] = []
    dropped: set[str] = set()
    for fp in parse_patch(patch):
        if _symlink(fp) or any(is_protected(p, owned) for p in fp.paths):
            dropped |= fp.paths or {"?"}
        else:
            kept.append(fp.text if fp.text.endswith("\n") else fp.text + "\n")
    return "".join(kept), sorted(dropped)
