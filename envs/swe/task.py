"""SWE-bench task rows: validation and loading.

A row has the SWE-bench fields ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``,
``patch`` (the reference fix), ``test_patch`` (the hidden tests), ``FAIL_TO_PASS`` and ``PASS_TO_PASS``
(test ids; JSON-encoded strings, as in the published datasets, are accepted). Optional: ``image`` (a Docker
image holding the repository at ``base_commit``), ``test_cmd`` and ``log_parser`` (the test runner of the
repository, when it is not pytest: SWE-Gym/SWE-smith style), ``split``; other fields are kept as metadata.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentrl.environment.tasks import TaskSourceError
from agentrl.envs.swe.logparse import LOG_PARSERS, LogParserError
from agentrl.envs.swe.patches import parse_patch, touched_paths

TEST_FILES = "{test_files}"
"""Placeholder of ``test_cmd``: the shell-quoted files that the test patch adds or changes (not the ones it
deletes), sorted."""
TEST_IDS = "{test_ids}"
"""Placeholder of ``test_cmd``: the shell-quoted FAIL_TO_PASS and PASS_TO_PASS ids."""


class SweTask(BaseModel):
    """One SWE-bench row."""

    model_config = ConfigDict(extra="allow")

    instance_id: str = Field(min_length=1)
    """Unique id, e.g. ``owner__repo-123``."""
    repo: str = Field(min_length=1)
    """``owner/name``; for bundled tasks the name of a directory under ``envs/swe/repos/``."""
    base_commit: str
    """The commit the agent starts from (bundled tasks: the id of the single commit the agent sees)."""
    problem_statement: str = Field(min_length=1)
    """The issue text the agent is given."""
    patch: str
    """Reference fix (a unified diff of non-test files)."""
    test_patch: str
    """Diff that adds the hidden tests; applied only at grading, in a fresh sandbox."""
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    """Tests that fail before the fix and must pass after it (pytest node ids by default; with a
    ``log_parser``, the ids that parser reads from the test output)."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that pass before the fix and must still pass."""
    image: str | None = None
    """Docker image with the repository at ``base_commit`` (SWE-bench/SWE-Gym); None: a bundled repository."""
    test_cmd: str | None = None
    """Shell command that runs the hidden tests at grading, in the repository directory, e.g.
    ``./tests/runtests.py --verbosity 2 --parallel 1 {test_files}`` (Django) or ``bin/test -C --verbose
    {test_files}`` (SymPy). ``{test_files}`` and ``{test_ids}`` are replaced by the shell-quoted files of the
    test patch and the listed test ids. Its output (stdout and stderr) is read by ``log_parser``. None: pytest
    (``SweConfig.python -m pytest``) on the files of the listed node ids, read by the grading plugin."""
    log_parser: str = "pytest"
    """How ``test_cmd``'s output is read: ``pytest`` (``-rA`` or ``-v`` lines), ``unittest`` (``-v`` lines;
    ``django`` is the same), ``sympy``, or a name added with ``logparse.register_log_parser``. Without a
    ``test_cmd`` only ``pytest`` is allowed."""
    split: str | None = None
    """``train`` or ``test`` for bundled tasks; None: in every split."""

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v

    @field_validator("log_parser")
    @classmethod
    def _known_parser(cls, v: str) -> str:
        if v not in LOG_PARSERS:
            raise LogParserError(f"unknown log parser {v!r}; known: {sorted(LOG_PARSERS)}")
        return v

    @field_validator("test_cmd")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise TaskSourceError("test_cmd is empty (leave it out for pytest)")
        return v

    @model_validator(mode="after")
    def _parser_needs_command(self) -> SweTask:
        if self.test_cmd is None and self.log_parser != "pytest":
            raise TaskSourceError(f"log_parser {self.log_parser!r} needs a test_cmd (without one, pytest runs the tests)")
        return self

    @field_validator("patch", "test_patch")
    @classmethod
    def _parses(cls, v: str) -> str:
        if v.strip() and not parse_patch(v):
            raise TaskSourceError("not a unified diff (no file headers)")
        return v

    @property
    def test_paths(self) -> set[str]:
        """Files the test patch touches (hidden from the agent, protected at grading)."""
        return touched_paths(self.test_patch)

    @property
    def test_ids(self) -> list[str]:
        """FAIL_TO_PASS then PASS_TO_PASS."""
        return [*self.FAIL_TO_PASS, *self.PASS_TO_PASS]

    def test_command(self) -> str | None:
        """``test_cmd`` with its placeholders filled in (None: the default pytest run)."""
        if self.test_cmd is None:
            return None
        kept = sorted({fp.new_path for fp in parse_patch(self.test_patch) if fp.new_path})
        files = " ".join(shlex.quote(f) for f in kept)
        ids = " ".join(shlex.quote(t) for t in self.test_ids)
        return self.test_cmd.replace(TEST_FILES, files).replace(TEST_IDS, ids)


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL task file, each validated as a `SweTask` and given an ``id`` (its instance_id)."""
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            SweTask.model_validate(row)
        except ValueError as e:
            raise TaskSourceError(f"{path}:{lineno}: not a valid SWE task: {e}") from e
        row.setdefault("id", row["instance_id"])
        rows.append(row)
    return rows
