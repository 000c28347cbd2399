"""SWE-bench task rows: validation and loading.

A row has the SWE-bench fields ``instance_id``, ``repo``, ``base_commit``, ``problem_statement``,
``patch`` (the reference fix), ``test_patch`` (the hidden tests), ``FAIL_TO_PASS`` and ``PASS_TO_PASS``
(pytest node ids; JSON-encoded strings, as in the published datasets, are accepted). Optional: ``image``
(a Docker image holding the repository at ``base_commit``), ``split``; other fields are kept as metadata.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentrl.envs.swe.patches import parse_patch, touched_paths


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
    """Tests that fail before the fix and must pass after it."""
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    """Tests that pass before the fix and must still pass."""
    image: str | None = None
    """Docker image with the repository at ``base_commit`` (SWE-bench/SWE-Gym); None: a bundled repository."""
    split: str | None = None
    """``train`` or ``test`` for bundled tasks; None: in every split."""

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_list(cls, v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v

    @field_validator("patch", "test_patch")
    @classmethod
    def _parses(cls, v: str) -> str:
        if v.strip() and not parse_patch(v):
            raise ValueError("not a unified diff (no file headers)")
        return v

    @property
    def test_paths(self) -> set[str]:
        """Files the test patch touches (hidden from the agent, protected at grading)."""
        return touched_paths(self.test_patch)

    @property
    def test_ids(self) -> list[str]:
        """FAIL_TO_PASS then PASS_TO_PASS."""
        return [*self.FAIL_TO_PASS, *self.PASS_TO_PASS]


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
            raise ValueError(f"{path}:{lineno}: not a valid SWE task: {e}") from e
        row.setdefault("id", row["instance_id"])
        rows.append(row)
    return rows
