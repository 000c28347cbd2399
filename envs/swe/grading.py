"""Repository set-up in a sandbox, patch extraction from the agent's sandbox, and grading in a fresh one.

Grading never trusts the agent's sandbox: only the agent's ``git diff`` against the base commit leaves
it, protected paths (tests, test configuration, the test patch's files) are removed from that diff
(`protect.filter_patch`), and the rest is applied to a fresh copy of the base tree in a NEW sandbox,
followed by the test patch. Then pytest runs the test files of FAIL_TO_PASS and PASS_TO_PASS, and a
small plugin records every test's outcome; or, for a task with its own ``test_cmd``, that command runs and
the task's log parser (`agentrl.envs.swe.logparse`) reads its output.
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

from agentrl.envs.swe import gitobj
from agentrl.envs.swe.config import GRADE_DIR, REPO_DIR, SweConfig
from agentrl.envs.swe.logparse import parse_log
from agentrl.envs.swe.protect import filter_patch
from agentrl.envs.swe.repo import base_tree, materialize
from agentrl.envs.swe.results import Score, files_of, score, statuses
from agentrl.envs.swe.task import SweTask
from agentrl.sandbox import DockerSandbox, ExecResult, SandboxError, SandboxFileNotFound, SandboxTooLarge

PLUGIN_SOURCE = Path(__file__).with_name("grade_plugin.py")
PLUGIN_MODULE = "agentrl_grade_plugin"
_GIT = "git -c core.quotepath=off -c core.autocrlf=false -c advice.detachedHead=false"


class RepoSetupError(SandboxError):
    """The repository could not be put into the sandbox as the task describes."""

    code = "env.swe.repo_setup"


async def _run(sb: DockerSandbox, cmd: str, timeout: float, what: str, env: dict[str, str] | None = None,
               workdir: str = "/workspace") -> str:
    r = await sb.exec(cmd, timeout=timeout, workdir=workdir, env=env)
    if not r.ok:
        raise RepoSetupError(f"{what} failed (exit {r.exit_code}, timed out: {r.timed_out}): {r.output[-1500:]}")
    return r.output


async def put_base_tree(sb: DockerSandbox, task: SweTask, config: SweConfig) -> None:
    """Place the base tree at REPO_DIR (no ``.git``): uploaded for bundled tasks, copied from the task
    image's repository (``config.image_repo_dir``) otherwise."""
    if task.image:
        src = shlex.quote(config.image_repo_dir.rstrip("/") or "/")
        await _run(sb, f"mkdir -p {REPO_DIR} && tar -C {src} --exclude=./.git -cf - . | tar -C {REPO_DIR} -xf -",
                   300, "copying the repository out of the image")
    else:
        await sb.upload(materialize(base_tree(task)), REPO_DIR)


async def prepare_agent_repo(sb: DockerSandbox, task: SweTask, config: SweConfig) -> str:
    """The agent's repository: the base tree as the single commit of a fresh git history (so no object
    of the fix exists in it). Returns that commit's id; for bundled tasks it must equal ``base_commit``."""
    await put_base_tree(sb, task, config)
    out = await _run(
        sb, f'{_GIT} init -q -b main . && {_GIT} add -A . && {_GIT} commit -q --no-verify -m '
            f'"{gitobj.BASE_MESSAGE}" && {_GIT} rev-parse HEAD',
        60, "creating the base commit", env=gitobj.commit_env(), workdir=REPO_DIR)
    sha = out.strip().splitlines()[-1] if out.strip() else ""
    if not task.image and sha != task.base_commit:
        raise RepoSetupError(f"base commit of {task.instance_id} is {sha}, the task says {task.base_commit}: "
                             "the bundled sources changed since the task file was built")
    return sha


@dataclass
class Extracted:
    """The agent's changes as a diff against the base commit."""

    patch: str = ""
    error: str | None = None
    """Why no diff could be taken (the agent broke its git repository, the diff is too large, ...)."""


async def extract_patch(sb: DockerSandbox, base_sha: str, config: SweConfig) -> Extracted:
    """``git diff`` of everything in the agent's repository (new files included) against ``base_sha``."""
    out = f"/tmp/agentrl-{base_sha[:12]}.diff"
    cmd = (f"{_GIT} add -A . >/dev/null 2>&1; {_GIT} diff --cached --binary --no-color --no-ext-diff "
           f"--no-textconv --no-renames {shlex.quote(base_sha)} -- . > {out} && wc -c < {out}")
    r = await sb.exec(cmd, timeout=60, workdir=REPO_DIR, env={"GIT_CONFIG_NOSYSTEM": "1",
                                                              "GIT_CONFIG_GLOBAL": "/dev/null"})
    if not r.ok:
        alive = await sb.exec("true", timeout=10)  # raises SandboxError when the container is gone
        if not alive.ok:
            raise SandboxError(f"the agent's sandbox {sb.id[:12]} stopped responding (exit {alive.exit_code})")
        return Extracted(error=f"git diff failed (exit {r.exit_code}): {r.output[-300:]}")
    try:
        size = int(r.output.split()[-1])
    except (ValueError, IndexError):
        return Extracted(error=f"unexpected git diff output: {r.output[-300:]}")
    if size > config.max_patch_bytes:
        return Extracted(error=f"the diff has {size} bytes, more than max_patch_bytes={config.max_patch_bytes}")
    data = await sb.read_file(out) if size else b""
    return Extracted(patch=data.decode("utf-8", "replace"))


@dataclass
class GradeResult:
    """What grading found."""

    score: Score
    applied: bool
    """Whether the (filtered) agent patch applied to the base tree."""
    dropped: list[str] = field(default_factory=list)
    """Protected paths whose changes were ignored."""
    timed_out: bool = False
    """The test run hit ``test_timeout_s``."""
    error: str | None = None
    output: str = ""
    """The tail of the test run's output (for humans)."""
    seconds: float = 0.0

    @property
    def reward(self) -> float:
        """1.0 when every listed test passes, else 0.0."""
        return 1.0 if self.applied and self.score.resolved else 0.0

    def metrics(self) -> dict[str, float]:
        return {**self.score.metrics(), "patch_applied": float(self.applied),
                "dropped_files": float(len(self.dropped)), "tests_timed_out": float(self.timed_out),
                "grading_s": self.seconds}


def _failed(task: SweTask) -> Score:
    return score({}, task.FAIL_TO_PASS, task.PASS_TO_PASS)


async def grade(sb: DockerSandbox, task: SweTask, agent_patch: str, config: SweConfig) -> GradeResult:
    """Grade ``agent_patch`` in ``sb``, a FRESH sandbox (see module docstring)."""
    t0 = time.perf_counter()
    patch, dropped = filter_patch(agent_patch, task.test_paths)
    await put_base_tree(sb, task, config)
    await sb.write_file(f"{GRADE_DIR}/tests.diff", task.test_patch)
    if patch.strip():
        await sb.write_file(f"{GRADE_DIR}/agent.diff", patch)
        r = await sb.exec(f"{_GIT} apply --whitespace=nowarn {GRADE_DIR}/agent.diff", timeout=60, workdir=REPO_DIR)
        if not r.ok:
            return GradeResult(_failed(task), applied=False, dropped=dropped, output=r.output[-2000:],
                               error="the agent's patch does not apply", seconds=time.perf_counter() - t0)
    if task.test_patch.strip():
        await _run(sb, f"{_GIT} apply --whitespace=nowarn {GRADE_DIR}/tests.diff", 60, "applying the test patch",
                   workdir=REPO_DIR)
    command = task.test_command()
    if command is None:
        status, r, error = await _run_pytest(sb, task, config)
    else:
        status, r, error = await _run_test_cmd(sb, task, command, config)
    return GradeResult(score(status, task.FAIL_TO_PASS, task.PASS_TO_PASS), applied=True, dropped=dropped,
                       timed_out=r.timed_out, output=r.output[-2000:], seconds=time.perf_counter() - t0,
                       error=error)


async def _run_pytest(sb: DockerSandbox, task: SweTask, config: SweConfig) -> tuple[dict[str, str], ExecResult,
                                                                                       str | None]:
    """The default run: pytest on the test files of the listed node ids, outcomes recorded by the plugin."""
    await sb.write_file(f"{GRADE_DIR}/{PLUGIN_MODULE}.py", PLUGIN_SOURCE.read_bytes())
    results = f"{GRADE_DIR}/results.json"
    files = " ".join(shlex.quote(f) for f in files_of(task.test_ids))
    cmd = (f"{shlex.quote(config.python)} -m pytest -p {PLUGIN_MODULE} -p no:cacheprovider -q --tb=short "
           f"{files}")
    env = {"PYTHONPATH": GRADE_DIR, "AGENTRL_GRADE_OUT": results, "PYTHONDONTWRITEBYTECODE": "1"}
    r = await sb.exec(cmd, timeout=config.test_timeout_s, workdir=REPO_DIR, env=env)
    try:
        raw = json.loads(await sb.read_file(results))
    except (SandboxFileNotFound, SandboxTooLarge, ValueError):  # ValueError: not JSON
        raw = {}
    return statuses(raw), r, None if raw else "the test run produced no results"


async def _run_test_cmd(sb: DockerSandbox, task: SweTask, command: str, config: SweConfig
                        ) -> tuple[dict[str, str], ExecResult, str | None]:
    """The task's own test command; its whole output goes to a log file (not the bounded exec output), which
    the task's log parser reads."""
    log_path = f"{GRADE_DIR}/test.log"
    r = await sb.exec(f"( {command}\n) > {log_path} 2>&1", timeout=config.test_timeout_s, workdir=REPO_DIR,
                      env={"PYTHONDONTWRITEBYTECODE": "1"})
    try:
        log = (await sb.read_file(log_path)).decode("utf-8", "replace")
    except SandboxFileNotFound:
        return {}, r, "the test command wrote no log"
    except SandboxTooLarge:
        return {}, r, f"the test log is larger than max_file_bytes={sb.config.max_file_bytes}"
    r = ExecResult(r.exit_code, log[-4000:] + r.output[-1000:], r.timed_out, r.duration, r.truncated, r.oom_killed)
    found = parse_log(task.log_parser, log)
    return found, r, None if found else f"the {task.log_parser} log parser found no test results"
