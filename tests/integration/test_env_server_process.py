"""The environment server as a real process: load on loopback (calc, and sandbox-backed sessions), and
``kill -9`` mid-session: clients get clear errors, the server's warden removes its containers, and the
next start removes those of a server whose warden died with it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import pytest

from agentrl.environment.remote import RemoteEnvError, RemoteEnvironment
from agentrl.tools.bench.env_server import ServerProcess, containers_of_pid, run_load
from tests.conftest import require
from tests.procs import command_line, descendants, start_time

pytestmark = pytest.mark.integration

SHELL = "agentrl.tools.bench.shell_env:ShellEnv"


@pytest.fixture(scope="module")
def sandbox_image() -> str:
    from agentrl.sandbox import build_image, engine_reachable

    ok, why = engine_reachable()
    require(ok, f'no Docker engine reachable ({why}); run `eval "$(sandbox/provision.sh)"`')
    return build_image()


def _limits(sessions: int) -> list[str]:
    return ["--max-sessions", str(2 * sessions), "--max-sessions-per-client", str(2 * sessions)]


async def test_load_64_calc_sessions_without_errors(tmp_path: Path) -> None:
    with ServerProcess(["calc"], extra=_limits(64), log_path=tmp_path / "server.log") as server:
        load = await run_load(server.url, server.token, env="calc", sessions=64, duration_s=10)
        exit_code = server.stop()
    summary = load.summary()
    print("env-server load (calc, 64 sessions, 10 s):", json.dumps(summary))
    assert summary["errors"] == 0, summary["error_samples"]
    assert summary["episodes"] >= 64 and summary["steps"] >= 3 * summary["episodes"]
    assert exit_code == 0, server.log_tail()


async def test_load_sandboxed_sessions_leave_no_container(sandbox_image: str, tmp_path: Path) -> None:
    with ServerProcess([SHELL], extra=_limits(16), log_path=tmp_path / "server.log") as server:
        load = await run_load(server.url, server.token, env="shell", sessions=16, duration_s=10)
        assert server.stop() == 0, server.log_tail()
    summary = load.summary()
    print("env-server load (sandboxed shell, 16 sessions, 10 s):", json.dumps(summary))
    assert summary["errors"] == 0, summary["error_samples"]
    assert summary["episodes"] >= 16
    assert containers_of_pid(server.pid) == [], "every session's sandbox must be removed"


async def test_kill_9_mid_session_gives_clear_errors(tmp_path: Path) -> None:
    first = ServerProcess(["calc"], log_path=tmp_path / "first.log").start()
    second = None
    try:
        remote = RemoteEnvironment.bind(first.url, first.token, env="calc", max_retries=1)
        env = remote()
        await env.reset(remote.tasks("test")[0])
        assert await env.call_tool("calculate", {"expression": "6 * 7"}) == "42"
        first.kill()
        with pytest.raises(
            RemoteEnvError,
            match=r"failed POST /v1/sessions/\w+/step after 2 attempts.*"
            r"is it running and reachable",
        ):
            await env.call_tool("calculate", {"expression": "1 + 1"})
        second = ServerProcess(["calc"], token=first.token, log_path=tmp_path / "second.log").start()
        stale = RemoteEnvironment(second.url, first.token, env="calc", max_retries=1)
        stale.session_id = env.session_id  # the old session, asked of the restarted server
        with pytest.raises(RemoteEnvError, match=r"HTTP 404: unknown session .*server restarted"):
            await stale.call_tool("calculate", {"expression": "1 + 1"})
        stale.session_id = None
        await env.close()  # the dead server: logged, not raised
    finally:
        first.kill()
        if second is not None:
            second.stop()


async def _two_sessions(server: ServerProcess) -> tuple[list, list[str]]:
    remote = RemoteEnvironment.bind(server.url, server.token, env="shell", max_retries=1)
    envs = [remote(), remote()]
    for env in envs:
        await env.reset(remote.tasks("test")[0])
        assert (await env.call_tool("run", {"command": "echo hi > a.txt && cat a.txt"})).endswith("hi\n")
    left = containers_of_pid(server.pid)
    assert len(left) == 2, "one sandbox per session"
    return envs, left


async def test_a_killed_servers_containers_go_with_it_or_at_the_next_start(sandbox_image: str, tmp_path: Path) -> None:
    """``kill -9`` of the server: its warden removes its containers within seconds. ``kill -9`` of its warden
    too (the second line): the containers stay, and the next start removes them."""
    first = ServerProcess([SHELL], log_path=tmp_path / "first.log").start()
    second = third = None
    try:
        envs, _ = await _two_sessions(first)
        first.kill()
        with pytest.raises(RemoteEnvError, match="is it running and reachable"):
            await envs[0].call_tool("run", {"command": "true"})
        t0 = time.monotonic()
        while containers_of_pid(first.pid):
            assert time.monotonic() - t0 < 10, "a killed server's containers outlived it by 10 s"
            await asyncio.sleep(0.2)

        second = ServerProcess([SHELL], log_path=tmp_path / "second.log").start()
        more, left = await _two_sessions(second)
        wardens = [p for p in descendants(second.pid) if "agentrl.core.utils.lifeline" in command_line(p)]
        assert len(wardens) == 1, [command_line(p) for p in descendants(second.pid)]
        os.kill(wardens[0], signal.SIGKILL)
        second.kill()
        assert sorted(containers_of_pid(second.pid)) == sorted(left), "with its warden dead, they stay"
        third = ServerProcess([SHELL], log_path=tmp_path / "third.log").start()
        assert containers_of_pid(second.pid) == [], "the next start must remove a dead server's containers"
        # A graceful stop with a session still open removes that session's sandbox too.
        other = RemoteEnvironment.bind(third.url, third.token, env="shell", max_retries=1)()
        await other.reset({"id": "x", "file": "x.txt", "content": "x"})
        assert len(containers_of_pid(third.pid)) == 1
        assert third.stop() == 0, third.log_tail()
        assert containers_of_pid(third.pid) == []
        for env in [*envs, *more, other]:
            await env.close()
    finally:
        for server in (first, second):
            if server is not None:
                server.kill()
        if third is not None:
            third.stop()


def test_a_sigkilled_owner_takes_its_env_server_with_it(tmp_path: Path) -> None:
    """A benchmark or test that started an env server and is SIGKILLed leaves no server behind."""
    import subprocess
    import sys

    code = ("import time; from agentrl.tools.bench.env_server import ServerProcess; "
            "s = ServerProcess(['calc']).start(); print(s.pid, flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    server_pid = started = None
    try:
        assert owner.stdout is not None
        server_pid = int(owner.stdout.readline())
        started = start_time(server_pid)
        assert started is not None
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        t0 = time.monotonic()
        while start_time(server_pid) == started:
            assert time.monotonic() - t0 < 15, f"the env server outlived its owner: {command_line(server_pid)}"
            time.sleep(0.2)
    finally:
        if owner.poll() is None:
            owner.kill()
        if server_pid is not None and started is not None and start_time(server_pid) == started:
            os.kill(server_pid, signal.SIGKILL)
