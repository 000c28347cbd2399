"""OpenEnv and MCP clients, unchanged, against a real ``agentrl serve-env`` process: the stock
``openenv-core`` clients (``GenericEnvClient``, ``MCPToolClient`` in both modes) and the ``mcp`` SDK's
client run calc episodes through the capability URL the server prints; without it they are refused;
malformed messages get error replies; a dropped WebSocket releases its session; limits, TTL and
idempotency hold as on ``/v1``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentrl.tools.bench.env_server import ServerProcess
from tests.conftest import require

pytestmark = pytest.mark.integration

openenv_client = pytest.importorskip("openenv.core.generic_client", reason="openenv-core is a test dependency")
mcp = pytest.importorskip("mcp", reason="mcp is a test dependency")
GenericEnvClient = openenv_client.GenericEnvClient


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    with ServerProcess(["calc"], log_path=log) as s:
        require(bool(s.openenv_url), f"the server printed no 'openenv: <url>' line:\n{s.log_tail()}")
        yield s


@pytest.fixture(scope="module")
def tasks() -> list[dict[str, Any]]:
    from agentrl.envs.calc import CalcEnv

    return [dict(t) for t in CalcEnv.tasks("test")[:3]]


def _turn(expression: str, cid: str = "call_1") -> dict[str, Any]:
    return {"content": "", "tool_calls": [{"id": cid, "type": "function", "function": {
        "name": "calculate", "arguments": json.dumps({"expression": expression})}}]}


async def _sessions(server: ServerProcess) -> int:
    async with httpx.AsyncClient(timeout=5) as http:
        return (await http.get(server.url + "/health")).json()["sessions"]


async def _wait_sessions(server: ServerProcess, n: int, timeout_s: float = 10) -> int:
    """Open sessions on the server, once it has ``n`` or after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.1)):
        if await _sessions(server) == n:
            break
        await asyncio.sleep(0.1)
    return await _sessions(server)


async def test_generic_env_client_runs_whole_calc_episodes(server: ServerProcess, tasks: list[dict]) -> None:
    async with GenericEnvClient(base_url=server.openenv_url) as env:
        for task in tasks:  # several episodes on one connection: each reset opens the next
            r = await env.reset(task_id=task["id"], split="test")
            assert not r.done and r.reward is None
            assert r.observation["task_id"] == task["id"]
            assert r.observation["messages"][-1]["content"] == task["question"]
            assert [t["function"]["name"] for t in r.observation["tools"]] == ["calculate"]
            r = await env.step(_turn(task["expression"]))
            assert not r.done
            assert r.observation["messages"] == [{"role": "tool", "tool_call_id": "call_1", "name": "calculate",
                                                  "content": str(task["answer"])}]
            state = await env.state()
            assert state["step_count"] == 1 and state["turn"] == 1 and state["task_id"] == task["id"]
            r = await env.step({"content": f"The answer is {task['answer']}."})
            assert r.done and r.reward == 1.0
            assert r.observation["stop_reason"] == "completed"
            assert await _sessions(server) == 1  # the previous episode's session was closed by the reset
        # a wrong answer scores 0, and the episode is over: another step is an error reply, not a crash
        await env.reset(task_id=tasks[0]["id"], split="test")
        r = await env.step({"content": "The answer is -1."})
        assert r.done and r.reward == 0.0
        with pytest.raises(RuntimeError, match=r"episode is over.*SESSION_ERROR"):
            await env.step({"content": "again"})
    assert await _wait_sessions(server, 0) == 0  # close released the session


async def test_seed_picks_a_task_deterministically(server: ServerProcess) -> None:
    async with GenericEnvClient(base_url=server.openenv_url) as env:
        a = (await env.reset(seed=7)).observation["task_id"]
        b = (await env.reset(seed=7)).observation["task_id"]
        c = (await env.reset(seed=8, split="test")).observation["task_id"]
    assert a == b and a.startswith("calc-train-") and c.startswith("calc-test-")


async def test_refused_without_the_capability(server: ServerProcess) -> None:
    forged = server.openenv_url[:-4] + ("0000" if not server.openenv_url.endswith("0000") else "1111")
    for base in (server.url, forged, server.url + "/openenv/default", server.url + "/openenv/x.y"):
        with pytest.raises(ConnectionError):
            async with GenericEnvClient(base_url=base, connect_timeout_s=5) as env:
                await env.reset()
    async with httpx.AsyncClient(timeout=10) as http:
        for route in ("/reset", "/mcp"):
            r = await http.post(forged + route, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert r.status_code == 401, r.text
        assert (await http.get(forged + "/health")).status_code == 401
        assert (await http.get(server.openenv_url + "/health")).json() == {"status": "healthy"}
        # minting a capability for another client needs the bearer token; it is a different, valid URL
        assert (await http.post(server.url + "/v1/openenv/clients", json={"client": "bob"})).status_code == 401
        r = await http.post(server.url + "/v1/openenv/clients", json={"client": "bob"},
                            headers={"Authorization": f"Bearer {server.token}"})
        bob = r.json()["url"]
        assert "/openenv/bob." in bob and bob != server.openenv_url
        assert (await http.get(bob + "/health")).status_code == 200
    assert await _sessions(server) == 0


async def test_malformed_messages_get_error_replies(server: ServerProcess) -> None:
    from websockets.asyncio.client import connect

    ws_url = server.openenv_url.replace("http://", "ws://") + "/ws"
    bad: list[tuple[Any, str]] = [
        ("not json", "INVALID_JSON"),
        ("[1, 2]", "VALIDATION_ERROR"),
        (json.dumps({"type": "nope"}), "UNKNOWN_TYPE"),
        (json.dumps({"type": "step", "data": _turn("1+1")}), "SESSION_ERROR"),  # before any reset
        (json.dumps({"type": "reset", "data": {"task_id": "no-such-task"}}), "SESSION_ERROR"),
        (json.dumps({"type": "reset", "data": {"seed": "x"}}), "VALIDATION_ERROR"),
        (json.dumps({"type": "reset", "data": [1]}), "VALIDATION_ERROR"),
        (b"\xff\xfe", "INVALID_JSON"),
    ]
    async with connect(ws_url) as ws:
        for raw, code in bad:
            await ws.send(raw)
            reply = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert reply["type"] == "error" and reply["data"]["code"] == code, (raw, reply)
        await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(await ws.recv())["type"] == "observation"
        for action, code in [({"foo": 1}, "VALIDATION_ERROR"), ("text", "VALIDATION_ERROR"),
                             ({"tool_calls": "x"}, "VALIDATION_ERROR"),
                             ({"type": "call_tool"}, "VALIDATION_ERROR")]:
            await ws.send(json.dumps({"type": "step", "data": action}))
            reply = json.loads(await ws.recv())
            assert reply["type"] == "error" and reply["data"]["code"] == code, (action, reply)
        # failures of the tools themselves are data: an observation, the episode goes on
        await ws.send(json.dumps({"type": "step", "data": _turn("1/0")}))
        reply = json.loads(await ws.recv())
        assert reply["type"] == "observation", reply
        assert reply["data"]["observation"]["observations"][0]["error"] == "tool_error"
        assert reply["data"]["done"] is False
    assert await _wait_sessions(server, 0) == 0


async def test_dropped_websocket_releases_its_session(server: ServerProcess) -> None:
    from websockets.asyncio.client import connect

    ws_url = server.openenv_url.replace("http://", "ws://") + "/ws"
    ws = await connect(ws_url)
    await ws.send(json.dumps({"type": "reset", "data": {"seed": 2}}))
    assert json.loads(await ws.recv())["type"] == "observation"
    await ws.send(json.dumps({"type": "step", "data": _turn("2+2")}))
    assert json.loads(await ws.recv())["type"] == "observation"
    assert await _sessions(server) == 1
    ws.transport.abort()  # no close frame: the connection just drops mid-episode
    assert await _wait_sessions(server, 0) == 0


async def test_mcp_tool_client_both_modes(server: ServerProcess, tasks: list[dict]) -> None:
    from openenv.core.mcp_client import MCPToolClient

    task = tasks[0]
    async with MCPToolClient(base_url=server.openenv_url) as env:  # over /ws, step-based
        await env.reset(task_id=task["id"], split="test")
        assert [t.name for t in await env.list_tools()] == ["calculate"]
        assert await env.call_tool("calculate", expression=task["expression"]) == str(task["answer"])
        with pytest.raises(RuntimeError, match="tool_not_found"):
            await env.call_tool("no_such_tool")
    prod = MCPToolClient(base_url=server.openenv_url)
    prod.use_production_mode = True  # over HTTP /mcp with openenv/session/create
    async with prod:
        tools = await prod.list_tools()
        assert [t.name for t in tools] == ["calculate"] and tools[0].input_schema["required"] == ["expression"]
        assert await prod.call_tool("calculate", expression="6 * 7") == "42"
        assert await _sessions(server) == 1
    assert await _wait_sessions(server, 0) == 0  # close sent openenv/session/close


async def test_mcp_sdk_client(server: ServerProcess, tasks: list[dict]) -> None:
    async with mcp.Client(server.openenv_url + "/mcp") as client:
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == ["calculate"]
        assert listed.tools[0].input_schema["properties"]["expression"]["type"] == "string"
        r = await client.call_tool("calculate", {"expression": "7 * 6"})
        assert not r.is_error and r.content[0].text == "42"
        r = await client.call_tool("calculate", {"expression": "7 /"})
        assert r.is_error and r.content[0].text.startswith("Error")
        assert await _sessions(server) == 1
    assert await _wait_sessions(server, 0) == 0  # the client's DELETE closed it


async def test_http_routes_are_sessionful_and_idempotent(server: ServerProcess, tasks: list[dict]) -> None:
    base, task = server.openenv_url, tasks[1]
    async with httpx.AsyncClient(timeout=20) as http:
        schema = (await http.get(base + "/schema")).json()
        assert set(schema) == {"action", "observation", "state"}
        assert (await http.get(base + "/metadata")).json()["name"] == "calc"
        r = (await http.post(base + "/reset", json={"task_id": task["id"], "split": "test"})).json()
        sid = r["observation"]["session_id"]
        step = {"session_id": sid, "request_id": "r-1", "action": _turn(task["expression"])}
        first = (await http.post(base + "/step", json=step)).json()
        again = (await http.post(base + "/step", json=step)).json()  # a retry: the tool does not run twice
        assert first == again
        assert (await http.get(base + "/state", params={"session_id": sid})).json()["step_count"] == 1
        assert (await http.post(base + "/step", json={"action": _turn("1+1")})).status_code == 422
        bad = await http.post(base + "/step", json={"session_id": sid, "action": {"tool_calls": 3}})
        assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
        done = (await http.post(base + "/step", json={"session_id": sid, "action": {
            "content": f"It is {task['answer']}."}})).json()
        assert done["done"] and done["reward"] == 1.0
        assert (await http.post(base + "/close", json={"session_id": sid})).json()["closed"]
        assert (await http.get(base + "/state", params={"session_id": sid})).status_code == 404


async def test_limits_and_ttl_hold(tmp_path: Path) -> None:
    extra = ["--max-sessions", "1", "--session-ttl", "1"]
    with ServerProcess(["calc"], extra=extra, log_path=tmp_path / "server.log") as s:
        async with GenericEnvClient(base_url=s.openenv_url) as a, GenericEnvClient(base_url=s.openenv_url) as b:
            await a.reset(seed=1)
            with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
                await b.reset(seed=1)
            await asyncio.sleep(3)  # idle past the TTL: the reaper closes it
            with pytest.raises(RuntimeError, match=r"unknown session.*SESSION_ERROR"):
                await a.step(_turn("1+1"))
            await b.reset(seed=1)  # the slot is free again
        assert s.stop() == 0, s.log_tail()


async def test_agentrl_consumes_its_own_server_through_openenv(server: ServerProcess, tasks: list[dict]) -> None:
    """Both ways at once: the agent loop runs calc episodes on ``--env openenv:<capability URL>``; the
    tool calls go over OpenEnv's WebSocket, and the final answer (a turn) is scored by the server."""
    from agentrl.environment.registry import load_env
    from agentrl.rollout.scripted import run_scripted, tool_call_text

    cls = await asyncio.to_thread(load_env, f"openenv:{server.openenv_url}")
    assert cls.accepts_turns and [t["function"]["name"] for t in cls.tool_schemas()] == ["calculate"]
    by_id = {t["id"]: t for t in tasks}

    class Script:
        name = "script"

        def __init__(self, right: bool) -> None:
            self.right = right

        def turns(self, env_cls: Any, task: dict[str, Any]) -> list[str]:
            t = by_id[task["task_id"]]
            answer = t["answer"] if self.right else -1
            return [tool_call_text("calculate", {"expression": t["expression"]}), f"The answer is {answer}."]

    episodes = [{"id": f"ep-{i}", "task_id": t["id"], "split": "test"} for i, t in enumerate(tasks)]
    for right in (True, False):
        trajs = await run_scripted(cls, episodes, Script(right))
        assert [t.reward for t in trajs] == [1.0 if right else 0.0] * len(tasks), [t.error for t in trajs]
        assert not any(t.failed for t in trajs)
        tool_msgs = [[m.content for m in t.messages if m.role == "tool"] for t in trajs]
        assert tool_msgs == [[str(t["answer"])] for t in tasks]
    assert await _wait_sessions(server, 0) == 0
