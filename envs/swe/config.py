"""Configuration of the SWE environment (a class attribute of `SweEnv`; subclass to change it)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from agentrl.sandbox import SandboxConfig

REPO_DIR = "/workspace/repo"
"""Where the agent's repository lies inside its sandbox (also the working directory of ``bash``)."""
GRADE_DIR = "/workspace/.agentrl"
"""Grader files (pytest plugin, patches, results) in the grading sandbox, next to the repository."""


class SweConfig(BaseModel):
    """Sandboxes, limits and grading of `SweEnv` episodes."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    tasks_file: Path | None = None
    """JSONL file of SWE-bench rows used by ``tasks()``; None: the bundled tasks. (``--tasks FILE`` on the
    command line works too, for any environment.)"""
    image: str = ""
    """Sandbox image for tasks without an ``image`` field; "" means the offline-built agentrl image
    (Debian, python3, pytest, git), which the bundled tasks need."""
    image_repo_dir: str = "/testbed"
    """For tasks that name their own ``image`` (SWE-bench/SWE-Gym style): where the repository lies in
    that image. Its files, without ``.git``, are copied into the workspace at the start of an episode."""
    python: str = "python3"
    """Interpreter that runs pytest at grading, e.g. ``/opt/miniconda3/envs/testbed/bin/python`` for
    SWE-bench images."""
    pool_size: int = Field(2, ge=0, le=64)
    """Warm sandboxes of the default image kept ready by the run's pool."""
    image_pool_size: int = Field(1, ge=0, le=16)
    """Warm sandboxes kept per task image (tasks with an ``image`` field), for the images of the next tasks."""
    image_pool_images: int = Field(2, ge=0, le=64)
    """Task images kept warm at once: the first ones of the upcoming tasks, in the run's order (then the
    most recently used). At most ``image_pool_size * image_pool_images`` idle task-image sandboxes exist."""
    max_sandboxes: int = Field(8, ge=1, le=512)
    """Sandboxes in use at once across the run (an episode holds one at a time: the agent's, then the
    grader's)."""
    bash_timeout_s: float = Field(30.0, gt=0, le=3600)
    """Time limit of one ``bash`` command (its processes are killed when it runs out)."""
    test_timeout_s: float = Field(120.0, gt=0, le=7200)
    """Time limit of the hidden test run at grading."""
    max_output_chars: int = Field(4000, ge=200, le=1_000_000)
    """Bound on the text of one tool observation (head and tail kept)."""
    max_view_lines: int = Field(200, ge=10, le=100_000)
    """Most lines ``view_file`` shows at once."""
    max_patch_bytes: int = Field(1 << 20, ge=1024, le=64 << 20)
    """Agent diffs larger than this are not graded (reward 0)."""
    sandbox: SandboxConfig = Field(default_factory=lambda: SandboxConfig(mem_mb=1024, lifetime_s=3600))
    """Container settings of every sandbox (network off, read-only root, limits); ``image`` and ``owner``
    are filled in by the environment."""
