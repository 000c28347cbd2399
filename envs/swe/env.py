"""`SweEnv`: fix a bug in a Python repository inside a Docker sandbox; graded by hidden tests.

An episode: the agent gets an issue report and a repository at ``/workspace/repo`` (one git commit, no
hidden tests), works with ``bash``, ``view_file`` and ``edit_file``, and calls ``submit``. Its ``git diff``
is then graded in a fresh sandbox (see `agentrl.envs.swe.grading`): reward 1 when every FAIL_TO_PASS and
PASS_TO_PASS test passes, else 0; the fraction of passing tests is recorded as ``partial_credit``.
"""

from __future__ import annotations

import functools
import logging
import posixpath
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from agentrl.core.types import Message
from agentrl.environment.base import Environment, Task, ToolError, tool
from agentrl.environment.tasks import TaskSourceError
from agentrl.envs.swe.config import REPO_DIR, SweConfig
from agentrl.envs.swe.grading import GradeResult, extract_patch, grade, prepare_agent_repo
from agentrl.envs.swe.patches import TextNotFound, TextNotUnique, patch_to_edits, replace_unique
from agentrl.envs.swe.repo import REPOS_DIR, bundled_dir
from agentrl.envs.swe.sandboxes import SandboxRun
from agentrl.envs.swe.task import SweTask, load_jsonl
from agentrl.envs.swe.text import TextViewError, exec_observation, numbered, truncate_middle, view_range
from agentrl.sandbox import BadSandboxRequest, DockerSandbox, SandboxFileNotFound, SandboxTooLarge

log = logging.getLogger(__name__)

BUNDLED_TASKS = Path(__file__).resolve().parent / "data" / "tasks.jsonl"
"""The bundled tasks (built by ``python -m agentrl.envs.swe.build_tasks``)."""
SPLITS = ("train", "test", "all")


@functools.cache
def _rows(path: Path) -> tuple[dict[str, Any], ...]:
    return tuple(load_jsonl(path))


class SweEnv(Environment):
    """Repository bug fixing with sandboxed tools and hidden-test grading (SWE-bench task format)."""

    name: ClassVar[str] = "swe"
    system_prompt: ClassVar[str | None] = (
        "You fix bugs in Python repositories. Use the tools to explore and edit the code, then call submit."
    )
    max_turns: ClassVar[int] = 12
    agent_time_limit_s: ClassVar[float] = 300.0
    wall_time_limit_s: ClassVar[float] = 1800.0
    reward_timeout_s: ClassVar[float] = 600.0  # grading: a fresh sandbox and the hidden tests (test_timeout_s)
    tool_timeout_s: ClassVar[float] = 90.0
    max_tokens_per_turn: ClassVar[int] = 384
    task_fields: ClassVar[tuple[str, ...]] = tuple(
        name for name, field in SweTask.model_fields.items() if field.is_required())
    """The required fields of `SweTask` (instance_id, repo, base_commit, problem_statement, patch,
    test_patch, FAIL_TO_PASS)."""
    config: ClassVar[SweConfig] = SweConfig()
    """Sandboxes, limits and grading; subclass to change (``config = SweConfig(...)``)."""

    _run: ClassVar[SandboxRun | None] = None

    def __init__(self) -> None:
        super().__init__()
        self.spec: SweTask | None = None
        self.sandbox: DockerSandbox | None = None
        self.base_sha = ""
        self.model_patch = ""
        """The agent's diff against the base commit (set by ``reward``)."""
        self.result: GradeResult | None = None
        """What grading found (set by ``reward``)."""
        self._runner: SandboxRun | None = None
        self._standalone = False

    # ----- tasks ---------------------------------------------------------------------------------
    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """Rows of ``config.tasks_file`` (default: the bundled tasks) in ``split``: "train", "test" or
        "all". Rows without a ``split`` field belong to every split."""
        if split not in SPLITS:
            raise TaskSourceError(f"unknown split {split!r}; expected one of {SPLITS}")
        rows = _rows(Path(cls.config.tasks_file or BUNDLED_TASKS))
        return [dict(r) for r in rows if split == "all" or r.get("split") in (None, split)]

    @classmethod
    def check_tasks(cls, tasks: Sequence[Task]) -> None:
        """Refuse, before anything starts, tasks that cannot run here: rows that are not valid `SweTask`s,
        rows without an ``image`` whose ``repo`` is not a bundled repository, and rows whose ``image`` is not
        in the Docker engine of ``config.sandbox`` (each distinct image is looked up once). Nothing is
        fetched or pulled."""
        unbundled: list[SweTask] = []
        images: dict[str, list[str]] = {}
        for task in tasks:
            try:
                spec = SweTask.model_validate(task)
            except ValidationError as e:
                problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'row'}: {err['msg']}"
                                     for err in e.errors(include_url=False))
                name = task.get("instance_id", task.get("id"))
                raise TaskSourceError(f"task {name!r} is not a valid SWE task: {problems}") from None
            if spec.image:
                images.setdefault(spec.image, []).append(spec.instance_id)
            elif bundled_dir(spec.repo) is None:
                unbundled.append(spec)
        if unbundled:
            first, bundled = unbundled[0], sorted(p.name for p in REPOS_DIR.iterdir() if p.is_dir())
            more = f" (and {len(unbundled) - 1} more tasks like it)" if len(unbundled) > 1 else ""
            raise TaskSourceError(
                f"task {first.instance_id!r}{more} names no `image`, and its repo {first.repo!r} is not a bundled "
                f"repository ({', '.join(bundled)}, under {REPOS_DIR}). Nothing is fetched or pulled here: build "
                "or pull a Docker image that holds the repository at base_commit with its dependencies (for "
                "SWE-bench, the harness's instance image) and set the row's `image` to it, or point `repo` at a "
                "bundled repository")
        if images:
            cls._check_images(images)

    @classmethod
    def _check_images(cls, images: dict[str, list[str]]) -> None:
        """Raise unless every image (-> the instance ids naming it) is in the local Docker engine."""
        from agentrl.sandbox import SandboxUnavailable
        from agentrl.sandbox._engine import docker_host, make_client

        host = cls.config.sandbox.docker_host
        image, ids = next(iter(images.items()))
        try:
            client = make_client(host, timeout=30)
        except SandboxUnavailable as e:
            raise TaskSourceError(
                f"tasks name Docker images (e.g. {image!r}, task {ids[0]!r}), but no Docker engine can be reached "
                f"to check that they are here: {e}") from None
        import docker.errors

        missing: list[tuple[str, list[str]]] = []
        try:
            for image, ids in images.items():
                try:
                    client.images.get(image)
                except docker.errors.ImageNotFound:
                    missing.append((image, ids))
                except Exception as e:
                    text = str(e).strip().splitlines()
                    raise TaskSourceError(f"the Docker engine at {docker_host(host)} could not look up image "
                                          f"{image!r} (task {ids[0]!r}): {text[0] if text else type(e).__name__}"
                                          ) from None
        finally:
            client.close()
        if missing:
            shown = ", ".join(f"{img!r} (task {ids[0]!r}{f' and {len(ids) - 1} more' if len(ids) > 1 else ''})"
                              for img, ids in missing[:5])
            more = f", and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise TaskSourceError(
                f"{len(missing)} task image(s) are not in the Docker engine at {docker_host(host)}: {shown}{more}. "
                "Nothing is pulled here: pull or build each image into this engine (docker pull IMAGE; for "
                "SWE-bench, build its instance images with the harness) and keep the row's `image` naming it, or "
                "drop `image` and point `repo` at a bundled repository")

    @classmethod
    def reference_solution(cls, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """The task's reference ``patch`` as ``edit_file`` calls (one per hunk), then ``submit``."""
        calls: list[tuple[str, dict[str, Any]]] = []
        for e in patch_to_edits(SweTask.model_validate(task).patch):
            if e.delete:
                calls.append(("bash", {"command": f"rm -f -- '{e.path}'"}))
            else:
                calls.append(("edit_file", {"path": e.path, "old_str": e.old_str, "new_str": e.new_str}))
        return [*calls, ("submit", {})]

    # ----- run lifecycle -------------------------------------------------------------------------
    @classmethod
    async def setup_run(cls, run_id: str) -> None:
        """Remove orphaned sandboxes of dead runs and start this run's warm pool."""
        if cls.__dict__.get("_run") is not None:
            await cls.teardown_run()
        runner = SandboxRun(cls.config, run_id)
        await runner.start()
        cls._run = runner

    @classmethod
    def upcoming(cls, tasks: Sequence[Task]) -> None:
        """Warm the images of these tasks (two sandboxes each: the agent's and the grader's), in order."""
        runner = cls.__dict__.get("_run")
        if runner is not None:
            images = [t.get("image") for t in tasks if isinstance(t, dict)]
            runner.plan([i for i in images if isinstance(i, str) and i for _ in range(2)])

    @classmethod
    async def teardown_run(cls) -> None:
        """Close the pool and remove every sandbox of this run."""
        runner, cls._run = cls.__dict__.get("_run"), None
        if runner is not None:
            await runner.teardown()

    # ----- episode -------------------------------------------------------------------------------
    async def reset(self, task: Task) -> str:
        self.spec = spec = SweTask.model_validate(task)
        self._runner = type(self)._run
        if self._runner is None:  # no set-up run (a bare run_episode): cold sandboxes, removed in close()
            self._runner, self._standalone = SandboxRun(self.config, "swe-standalone", pooled=False), True
        self.sandbox = await self._runner.acquire(spec.image)
        self.base_sha = await prepare_agent_repo(self.sandbox, spec, self.config)
        return (
            f"{spec.problem_statement.strip()}\n\n"
            f"The repository is at {REPO_DIR} (the working directory of bash). Find the cause of this issue "
            "and fix it in the source code. The project's tests are not included; hidden tests will check "
            "your fix. Call submit when you are done."
        )

    def _path(self, path: str) -> str:
        full = posixpath.normpath(posixpath.join(REPO_DIR, path))
        if not full.startswith("/workspace/"):
            raise ToolError(f"{path}: only files under {REPO_DIR} can be viewed or edited")
        return full

    def _box(self) -> DockerSandbox:
        if self.sandbox is None:
            raise ToolError("the sandbox is gone (the episode is over)")
        return self.sandbox

    async def _read_text(self, full: str) -> str:
        try:
            data = await self._box().read_file(full)
        except SandboxFileNotFound as e:
            raise ToolError(f"cannot read {full}: {str(e).split(': ', 1)[-1]}") from None
        except SandboxTooLarge as e:
            raise ToolError(str(e)) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ToolError(f"{full} is not a UTF-8 text file") from None

    @tool
    async def bash(self, command: str) -> str:
        """Run a shell command in the repository and return its output (long output is shortened).

        Args:
            command: the command, run with sh in the repository directory.
        """
        cfg = self.config
        r = await self._box().exec(command, timeout=cfg.bash_timeout_s, workdir=REPO_DIR)
        return exec_observation(r.output, r.exit_code, r.timed_out, cfg.bash_timeout_s, cfg.max_output_chars)

    @tool
    async def view_file(self, path: str, start_line: int = 1, end_line: int | None = None) -> str:
        """Show numbered lines of a file.

        Args:
            path: file path, relative to the repository.
            start_line: first line to show (1-based).
            end_line: last line to show (inclusive); omit for the end of the file.
        """
        full = self._path(path)
        content = await self._read_text(full)
        try:
            text, first, last = view_range(content, start_line, end_line, self.config.max_view_lines)
        except TextViewError as e:
            raise ToolError(f"{path}: {e}") from None
        total = len(content.splitlines())
        more = f"\n[lines {first}-{last} of {total}; ask for start_line={last + 1} to see more]" if last < total else ""
        return truncate_middle(text, self.config.max_output_chars) + more

    @tool
    async def edit_file(self, path: str, old_str: str, new_str: str) -> str:
        """Replace the exact text old_str by new_str in a file; old_str must occur exactly once. With an
        empty old_str a new file is created.

        Args:
            path: file path, relative to the repository.
            old_str: the exact text to replace (whitespace included).
            new_str: the replacement text.
        """
        full = self._path(path)
        box = self._box()
        if old_str == "":
            exists = await box.exec(f"test -e {shlex.quote(full)}", timeout=10)
            if exists.exit_code == 0:
                raise ToolError(f"{path} already exists; give the exact text to replace as old_str")
            await self._write(full, new_str)
            return f"Created {path} ({len(new_str.splitlines())} lines)."
        content = await self._read_text(full)
        try:
            updated, line = replace_unique(content, old_str, new_str)
        except TextNotFound:
            raise ToolError(f"old_str was not found in {path}; it must match the file exactly, "
                            "whitespace and indentation included (view the file first)") from None
        except TextNotUnique as e:
            lines = e.args[0] if e.args and isinstance(e.args[0], list) else []
            raise ToolError(f"old_str occurs {len(lines)} times in {path} (lines {', '.join(map(str, lines))}); "
                            "include more surrounding lines to make it unique") from None
        await self._write(full, updated)
        new_lines = updated.splitlines()
        first = max(line - 3, 1)
        last = min(line + new_str.count("\n") + 3, len(new_lines))
        snippet = numbered(new_lines[first - 1 : last], first)
        return truncate_middle(f"Edited {path}. Lines {first}-{last} now read:\n{snippet}", self.config.max_output_chars)

    async def _write(self, full: str, content: str) -> None:
        try:
            await self._box().write_file(full, content)
        except (SandboxTooLarge, BadSandboxRequest) as e:
            raise ToolError(str(e)) from None

    @tool
    def submit(self) -> str:
        """Submit your changes for grading and end the episode."""
        self.finish()
        return "Submitted; your changes will now be tested."

    async def reward(self, messages: list[Message]) -> dict[str, float]:
        """Grade the agent's diff in a fresh sandbox: 1.0 when all listed tests pass, else 0.0."""
        assert self.spec is not None and self._runner is not None
        extracted = await extract_patch(self._box(), self.base_sha, self.config)
        self.model_patch = extracted.patch
        await self._release_agent_sandbox()  # before taking another: an episode never holds two
        if extracted.error:
            log.info("%s: no gradable diff: %s", self.spec.instance_id, extracted.error)
        grader = await self._runner.acquire(self.spec.image)
        try:
            self.result = await grade(grader, self.spec, "" if extracted.error else extracted.patch, self.config)
        finally:
            await self._runner.release(grader)
        diff_lines = sum(1 for line in self.model_patch.splitlines()
                         if line[:1] in "+-" and not line.startswith(("+++", "---")))
        return {"reward": self.result.reward, **self.result.metrics(), "patch_lines": float(diff_lines),
                "patch_extracted": float(extracted.error is None)}

    async def _release_agent_sandbox(self) -> None:
        sb, self.sandbox = self.sandbox, None
        if sb is not None and self._runner is not None:
            await self._runner.release(sb)

    async def close(self) -> None:
        await self._release_agent_sandbox()
        if self._standalone and self._runner is not None:
            await self._runner.teardown()
