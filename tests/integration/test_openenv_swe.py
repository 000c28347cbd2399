"""swe, with its Docker sandboxes, served to stock OpenEnv and MCP clients by a real ``agentrl serve-env``:
whole episodes (the reference fix scores 1, no fix scores 0), and no container left after a WebSocket is
dropped mid-episode."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentrl.tools.bench.env_server import ServerProcess, containers_of_pid
from tests.conftest import require

pytestmark = pytest.mark.integration

openenv_client = pytest.importorskip("openenv.core.generic_client", reason="openenv-core is a test dependency")
mcp = pytest.importorskip("mcp", reason="mcp is a test dependency")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from agentrl.sandbox import build_image, engine_reachable

    ok, why = engine_reachable()
    require(ok, f'no Docker engine reachable ({why}); run `eval "$(sandbox/provision.sh)"`')
    build_image()
    log = tmp_path_factory.mktemp("openenv-swe") / "server.log"
    s = ServerProcess(["swe"], log_path=log).start(timeout_s=180)
    try:
        yield s
    finally:
        assert s.stop() == 0, s.log_tail()
        assert containers_of_pid(s.pid) == [], "every sandbox of the server must be removed"


@pytest.fixture(scope="module")
def task() -> dict[str, Any]:
    from agentrl.envs.swe import SweEnv

    return dict(SweEnv.tasks("test")[0])


def _turn(name: str, arguments: dict[str, Any], i: int) -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"id": f"call_{i}", "type": "function",
                                           "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _containers_with(server: ServerProcess, path: str) -> list[str]:
    """The server's sandbox containers holding the file ``path``."""
    import docker

    client = docker.from_env(timeout=30)
    try:
        return [cid for cid in containers_of_pid(server.pid)
                if client.containers.get(cid).exec_run(["test", "-e", path]).exit_code == 0]
    finally:
        client.close()


async def _sessions(server: ServerProcess) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        return (await http.get(server.url + "/health")).json()["sessions"]


async def test_generic_client_runs_swe_episodes(server: ServerProcess, task: dict[str, Any]) -> None:
    from agentrl.envs.swe import SweEnv

    async with openenv_client.GenericEnvClient(base_url=server.openenv_url, message_timeout_s=300) as env:
        r = await env.reset(task_id=task["id"], split="test")
        assert {t["function"]["name"] for t in r.observation["tools"]} >= {"bash", "edit_file", "submit"}
        r = await env.step(_turn("bash", {"command": "git status --short | wc -l"}, 0))
        assert r.observation["messages"][0]["content"].startswith("0\n") and not r.done
        for i, (name, args) in enumerate(SweEnv.reference_solution(task), start=1):
            r = await env.step(_turn(name, args, i))
        assert r.done and r.reward == 1.0, r.observation
        assert r.observation["stop_reason"] == "completed"
        # no fix: submit at once scores 0
        await env.reset(task_id=task["id"], split="test")
        r = await env.step(_turn("submit", {}, 0))
        assert r.done and r.reward == 0.0
    for _ in range(100):
        if await _sessions(server) == 0:
            break
        await asyncio.sleep(0.1)
    assert await _sessions(server) == 0


async def test_mcp_sdk_client_on_swe(server: ServerProcess) -> None:
    async with mcp.Client(server.openenv_url + "/mcp", read_timeout_seconds=300) as client:
        names = {t.name for t in (await client.list_tools()).tools}
        assert {"bash", "view_file", "edit_file", "submit"} <= names
        r = await client.call_tool("bash", {"command": "echo hi from the sandbox"})
        assert not r.is_error and "hi from the sandbox" in r.content[0].text
        r = await client.call_tool("view_file", {"path": "no/such/file.py"})
        assert r.is_error  # a tool failure is a result, the session goes on
        r = await client.call_tool("submit", {})
        assert r.meta["agentrl"]["done"] is True and r.meta["agentrl"]["reward"] == 0.0


async def test_dropped_websocket_leaves_no_container(server: ServerProcess, task: dict[str, Any]) -> None:
    from websockets.asyncio.client import connect

    ws = await connect(server.openenv_url.replace("http://", "ws://") + "/ws")
    await ws.send(json.dumps({"type": "reset", "data": {"task_id": task["id"], "split": "test"}}))
    assert json.loads(await asyncio.wait_for(ws.recv(), 300))["type"] == "observation"
    marker = f"/tmp/marker-{uuid.uuid4().hex}"
    await ws.send(json.dumps({"type": "step", "data": _turn("bash", {"command": f"touch {marker}; echo ok"}, 0)}))
    assert json.loads(await asyncio.wait_for(ws.recv(), 300))["type"] == "observation"
    mine = _containers_with(server, marker)
    assert len(mine) == 1, "the session's sandbox should be running"
    ws.transport.abort()  # no close frame: the connection just drops mid-episode
    for _ in range(300):
        if await _sessions(server) == 0 and mine[0] not in containers_of_pid(server.pid):
            break
        await asyncio.sleep(0.1)
    assert await _sessions(server) == 0
    assert mine[0] not in containers_of_pid(server.pid), "the dropped session's sandbox must be removed"
