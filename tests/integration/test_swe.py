"""The SWE environment on a real Docker engine: oracle/null on every bundled task, tool errors, tamper-proof
grading in a fresh sandbox, a history without the fix, and no container left behind (also after kill -9)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl.core.types import StopReason
from agentrl.environment.base import ToolError, run_scope
from agentrl.envs.swe import SweConfig, SweEnv
from agentrl.envs.swe.gitobj import blob_id
from agentrl.envs.swe.repo import clean_tree
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted
from agentrl.sandbox import build_image, engine_reachable, gc
from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.long]
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def swe_image() -> str:
    ok, why = engine_reachable()
    require(ok, f"no Docker engine reachable ({why}); run `eval \"$(sandbox/provision.sh)\"`")
    return build_image()


def _docker() -> Any:
    import docker

    return docker.from_env(timeout=30)


def containers_of(owner: str) -> list[dict[str, Any]]:
    return _docker().api.containers(all=True, filters={"label": f"agentrl.owner={owner}"})


class SmallSwe(SweEnv):
    """Tight limits, to reach the timeout and truncation paths quickly."""

    config: ClassVar[SweConfig] = SweConfig(bash_timeout_s=2, max_output_chars=400, pool_size=1, max_sandboxes=4)
    _run = None


def task_by_id(instance_id: str) -> dict[str, Any]:
    return next(t for t in SweEnv.tasks("all") if t["instance_id"] == instance_id)


TASK = SweEnv.tasks("all")[0]


async def test_oracle_solves_and_null_fails_every_bundled_task(swe_image: str) -> None:
    tasks = SweEnv.tasks("all")
    t0 = time.perf_counter()
    async with run_scope(SweEnv, f"test-oracle-{uuid.uuid4().hex[:6]}"):
        owner = SweEnv._run.owner  # type: ignore[union-attr]
        oracle = await run_scripted(SweEnv, tasks, OraclePolicy(), max_concurrency=4)
        null = await run_scripted(SweEnv, tasks, NullPolicy(), max_concurrency=4)
    wall = time.perf_counter() - t0
    bad = [(t.task_id, t.reward, t.stop_reason, (t.error or "")[:300]) for t in oracle if t.reward != 1.0 or t.failed]
    assert not bad, f"oracle failed on: {bad}"
    assert all(t.metrics["partial_credit"] == 1.0 and t.metrics["patch_applied"] == 1.0 for t in oracle)
    assert all(t.reward == 0.0 and not t.failed and t.metrics["fail_to_pass_frac"] == 0.0 for t in null), [
        (t.task_id, t.reward, t.error) for t in null if t.reward or t.failed]
    assert all(t.metrics["pass_to_pass_frac"] == 1.0 and t.metrics["patch_lines"] == 0 for t in null)
    assert containers_of(owner) == [], "the run's sandboxes must be gone after the eval"
    print(f"oracle+null on {len(tasks)} tasks: {wall:.1f}s")


async def test_swe_bench_rows_from_a_saved_dataset(swe_image: str, tmp_path: Path) -> None:
    """Bundled tasks in SWE-bench's published shape (test ids as JSON strings, its extra columns, no ``split``
    field), saved as a DatasetDict: `agentrl eval --tasks DIR --tasks-split test` solves them with the oracle;
    a row of a repository that is neither bundled nor in an image here is refused before anything starts."""
    import datasets

    from agentrl.config.run import load_config
    from agentrl.environment.tasks import TaskSourceError
    from agentrl.rollout.scripted import run_scripted_eval

    def published(t: dict[str, Any]) -> dict[str, Any]:
        row = {k: v for k, v in t.items() if k not in ("split", "id")}
        row.update(FAIL_TO_PASS=json.dumps(t["FAIL_TO_PASS"]), PASS_TO_PASS=json.dumps(t["PASS_TO_PASS"]),
                   hints_text="", created_at="2024-01-01T00:00:00Z", version="1.0",
                   environment_setup_commit=t["base_commit"])
        return row

    rows = [published(t) for t in SweEnv.tasks("test")[:2]]
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(tmp_path / "swe-bench")
    cfg = load_config(None, {"env": "swe", "eval_tasks": str(tmp_path / "swe-bench"), "eval_tasks_split": "test"})
    result = await run_scripted_eval(cfg, "oracle", n=2)
    assert result["num_tasks"] == 2 and result["success"] == 1.0, result
    foreign = {**rows[0], "instance_id": "django__django-11099", "repo": "django/django"}
    datasets.Dataset.from_list([foreign]).save_to_disk(tmp_path / "foreign")
    cfg = load_config(None, {"env": "swe", "eval_tasks": str(tmp_path / "foreign")})
    with pytest.raises(TaskSourceError, match=r"django__django-11099.*not a bundled repository.*Nothing is fetched"):
        await run_scripted_eval(cfg, "oracle", n=1)


async def test_tool_errors_and_limits(swe_image: str) -> None:
    env = SmallSwe()
    await env.reset(TASK)
    owner = env._runner.owner  # type: ignore[union-attr]
    try:
        call = env.call_tool
        path = TASK["bug_files"][0]
        with pytest.raises(ToolError, match="old_str was not found"):
            await call("edit_file", {"path": path, "old_str": "this text is not in the file", "new_str": "x"})
        await call("bash", {"command": "printf 'x = 1\\ny = 2\\nx = 1\\n' > dup.py"})
        with pytest.raises(ToolError, match=r"occurs 2 times in dup.py \(lines 1, 3\)"):
            await call("edit_file", {"path": "dup.py", "old_str": "x = 1", "new_str": "x = 3"})
        out = await call("edit_file", {"path": "dup.py", "old_str": "y = 2\nx = 1", "new_str": "y = 5\nx = 1"})
        assert "Edited dup.py" in out and "   2\ty = 5" in out
        assert await call("view_file", {"path": "dup.py"}) == "   1\tx = 1\n   2\ty = 5\n   3\tx = 1"
        with pytest.raises(ToolError, match=r"start_line 99 is past the end of the file \(3 lines\)"):
            await call("view_file", {"path": "dup.py", "start_line": 99})
        with pytest.raises(ToolError, match="before start_line"):
            await call("view_file", {"path": "dup.py", "start_line": 3, "end_line": 2})
        with pytest.raises(ToolError, match="cannot read"):
            await call("view_file", {"path": "missing.py"})
        with pytest.raises(ToolError, match="only files under"):
            await call("view_file", {"path": "/etc/passwd"})
        assert "Created new/mod.py" in await call("edit_file", {"path": "new/mod.py", "old_str": "", "new_str": "a\n"})
        with pytest.raises(ToolError, match="already exists"):
            await call("edit_file", {"path": "new/mod.py", "old_str": "", "new_str": "b\n"})
        assert (await call("bash", {"command": "echo hi; exit 3"})) == "hi\n[exit code 3]"
        t0 = time.monotonic()
        out = await call("bash", {"command": "echo start; sleep 30"})
        assert "start" in out and "[timed out after 2s" in out and time.monotonic() - t0 < 15
        out = await call("bash", {"command": "seq 1 100000"})
        assert out.startswith("1\n2\n") and "characters omitted" in out and len(out) < 600
        assert (await call("bash", {"command": "pwd; ls"})).split()[:1] == ["/workspace/repo"]
    finally:
        await env.close()
    assert containers_of(owner) == []


async def _episode(env_cls: type[SweEnv], task: dict[str, Any], actions: list[tuple[str, dict[str, Any]]]
                   ) -> tuple[dict[str, float], SweEnv]:
    env = env_cls()
    await env.reset(task)
    try:
        for name, args in actions:
            await env.call_tool(name, args)
        return await env.reward([]), env
    finally:
        await env.close()


TAMPER = [
    ("bash", {"command": "mkdir -p tests && printf '%s\\n' 'import pytest' "
              "'@pytest.hookimpl(hookwrapper=True)' 'def pytest_runtest_makereport(item, call):' "
              "'    outcome = yield' '    outcome.get_result().outcome = \"passed\"' > conftest.py"}),
    ("bash", {"command": "cp conftest.py tests/conftest.py && printf '[pytest]\\naddopts = -p no:python\\n' > pytest.ini"}),
    ("bash", {"command": "printf 'def test_ok():\\n    pass\\n' > tests/test_fake.py && echo 'import os' > sitecustomize.py"}),
]


async def test_grading_ignores_tampering_in_the_agents_sandbox(swe_image: str) -> None:
    task = TASK
    tamper = [*TAMPER, *(  # also write the hidden test files, with tests that pass
        ("bash", {"command": f"mkdir -p {os.path.dirname(f)} && echo 'def test_x(): pass' > {f}"})
        for f in sorted({t.split("::")[0] for t in task["FAIL_TO_PASS"]}))]
    result, env = await _episode(SweEnv, task, tamper)
    assert result["reward"] == 0.0 and result["fail_to_pass_frac"] == 0.0 and result["patch_applied"] == 1.0
    dropped = set(env.result.dropped)  # type: ignore[union-attr]
    assert {"conftest.py", "tests/conftest.py", "pytest.ini", "tests/test_fake.py", "sitecustomize.py"} <= dropped
    assert "conftest.py" in env.model_patch  # it was in the agent's diff, and ignored
    # Tampering plus the real fix: the fix counts, the tampering still does not.
    result, env = await _episode(SweEnv, task, tamper + SweEnv.reference_solution(task)[:-1])
    assert result["reward"] == 1.0 and result["dropped_files"] >= 5
    # A fix whose git history was destroyed cannot be graded: reward 0, recorded, not an error.
    result, env = await _episode(SweEnv, task, [*SweEnv.reference_solution(task)[:-1], ("bash", {"command": "rm -rf .git"})])
    assert result["reward"] == 0.0 and result["patch_extracted"] == 0.0


async def test_agent_repository_has_one_commit_and_no_fix(swe_image: str) -> None:
    task = next(t for t in SweEnv.tasks("all") if t["difficulty"] == "hard")
    env = SweEnv()
    await env.reset(task)
    try:
        sb = env.sandbox
        assert sb is not None

        async def sh(cmd: str) -> str:
            r = await sb.exec(cmd, workdir="/workspace/repo")
            assert r.exit_code == 0, r.output
            return r.output

        assert (await sh("git rev-list --all")).split() == [task["base_commit"]] == [env.base_sha]
        assert (await sh("git reflog | wc -l")).strip() == "1"
        objects = set((await sh("git rev-list --all --objects | cut -d' ' -f1")).split())
        stored = set((await sh("find .git/objects -type f | awk -F/ '{print $(NF-1)$NF}'")).split())
        assert stored == objects, "the repository holds objects that no commit reaches"
        clean = clean_tree(task["repo"])
        for path in task["bug_files"]:  # the fixed files exist nowhere in git, the buggy ones do
            fixed = blob_id(clean[path].encode())
            assert fixed not in objects
            r = await sb.exec(f"git cat-file -e {fixed}", workdir="/workspace/repo")
            assert r.exit_code != 0
        status = await sh("git status --porcelain; ls; find . -name 'test*' -not -path './.git/*'")
        assert "tests" not in status.split() and "test_" not in status
    finally:
        await env.close()


async def test_pooled_episode_leaves_only_the_warm_pool(swe_image: str) -> None:
    async with run_scope(SmallSwe, f"test-pool-{uuid.uuid4().hex[:6]}"):
        runner = SmallSwe._run
        assert runner is not None
        await runner.pool.wait_ready(120)  # type: ignore[union-attr]
        [traj] = await run_scripted(SmallSwe, [TASK], OraclePolicy())
        assert traj.reward == 1.0
        await runner.pool.wait_ready(120)  # type: ignore[union-attr]
        ids = {c["Id"] for c in containers_of(runner.owner)}
        assert ids == {sb.id for sb in runner.pool._warm}  # type: ignore[union-attr]
    assert containers_of(runner.owner) == []


class Crashy(SmallSwe):
    """Its container dies right after the repository is set up (a crashed sandbox)."""

    _run = None

    async def reset(self, task: dict[str, Any]) -> str:
        prompt = await super().reset(task)
        _docker().api.kill(self.sandbox.id)  # type: ignore[union-attr]
        return prompt


async def test_crashed_sandbox_is_a_failed_rollout(swe_image: str) -> None:
    async with run_scope(Crashy, f"test-crash-{uuid.uuid4().hex[:6]}"):
        owner = Crashy._run.owner  # type: ignore[union-attr]
        [traj] = await run_scripted(Crashy, [TASK], NullPolicy())
    assert traj.failed and traj.stop_reason == StopReason.ENV_ERROR and "SandboxError" in (traj.error or "")
    assert containers_of(owner) == []


DRIVER = """
import asyncio, sys
from agentrl.environment.base import run_scope
from agentrl.envs.swe import SweEnv
from agentrl.core.utils.lifeline import warden_pid

async def main():
    await SweEnv.setup_run(sys.argv[1])
    env = SweEnv()
    await env.reset(SweEnv.tasks("all")[0])
    await SweEnv._run.pool.wait_ready(120)
    print("READY", SweEnv._run.owner, warden_pid(), flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_kill_dash_9_of_a_driver_and_its_warden_then_next_start_cleans_up(swe_image: str) -> None:
    """The second line: with the warden killed as well (it would remove them within seconds), the next
    start removes a dead driver's containers."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", DRIVER, f"test-kill9-{uuid.uuid4().hex[:6]}",
                                                stdout=asyncio.subprocess.PIPE, cwd=REPO_ROOT)
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 180)).decode()  # type: ignore[union-attr]
        assert line.startswith("READY"), line
        owner, warden = line.split()[1], int(line.split()[2])
        assert len(containers_of(owner)) >= 2  # the episode's sandbox and the warm pool
        os.kill(warden, signal.SIGKILL)
    finally:
        proc.kill()  # SIGKILL: no cleanup code runs in the driver
        await proc.wait()
    assert containers_of(owner), "containers outlive a killed driver (until cleanup)"
    async with run_scope(SmallSwe, f"test-after-kill9-{uuid.uuid4().hex[:6]}"):  # the next start
        removed = SmallSwe._run.orphans_removed  # type: ignore[union-attr]
    assert containers_of(owner) == []
    assert len(removed) >= 2 and gc(owner=owner, all_dead=False, expired=False) == []


def test_cli_eval_policy_oracle_and_null(swe_image: str, tmp_path: Path) -> None:
    tasks = tmp_path / "two.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in SweEnv.tasks("all")[:2]))
    for policy, success in (("oracle", 1.0), ("null", 0.0)):
        r = subprocess.run([sys.executable, "-m", "agentrl.cli", "eval", "--env", "swe", "--policy", policy,
                            "--tasks", str(tasks)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["success"] == success and out["num_tasks"] == 2 and out["num_failed"] == 0
        assert out["policy"] == policy and "metric_partial_credit" in out


async def test_sigterm_of_an_eval_removes_its_sandboxes(swe_image: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "agentrl.cli", "eval", "--env", "swe", "--policy", "oracle",
        "--tasks", str(REPO_ROOT / "envs/swe/data/tasks.jsonl"), cwd=REPO_ROOT,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)

    def mine() -> list[dict[str, Any]]:
        return _docker().api.containers(all=True, filters={"label": f"agentrl.pid={proc.pid}"})

    try:
        for _ in range(400):  # until the pool and some episodes are running
            if len(mine()) >= 3:
                break
            await asyncio.sleep(0.3)
        assert len(mine()) >= 3
        proc.terminate()
        _, err = await asyncio.wait_for(proc.communicate(), 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert mine() == [], "SIGTERM must leave no sandbox behind"
