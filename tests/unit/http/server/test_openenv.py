"""The OpenEnv and MCP routes' contract, in process: capability checks, the reset/action/observation
mapping, error replies, failures as data, idempotency, MCP's handshake and sessions (the real-process
tests with stock clients are in tests/integration/test_openenv*.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from agentrl.http.server import create_app
from agentrl.http.server.capability import mint
from tests.env_server_helpers import AUTH, TOKEN, Probe, config

BASE = f"/openenv/{mint(TOKEN)}"


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(create_app(config(), TOKEN), raise_server_exceptions=False) as c:
        yield c


def _sessions(c: TestClient) -> int:
    return c.get("/health").json()["sessions"]


def _rpc(c: TestClient, method: str, params: dict[str, Any] | None = None, rid: Any = 1,
         headers: dict[str, str] | None = None) -> Any:
    return c.post(BASE + "/mcp", json={"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}},
                  headers=headers)


def test_capability_is_required_everywhere(client: TestClient) -> None:
    bad = "/openenv/" + mint("x" * 32)
    for method, path in [("get", "/health"), ("get", "/schema"), ("get", "/metadata"), ("get", "/state"),
                         ("post", "/reset"), ("post", "/step"), ("post", "/close"), ("post", "/mcp"),
                         ("get", "/mcp"), ("delete", "/mcp")]:
        r = getattr(client, method)(bad + path)
        assert r.status_code == 401 and r.json()["error"] == "unauthorized", (path, r.text)
    with pytest.raises(WebSocketDisconnect) as e, client.websocket_connect(bad + "/ws"):
        pass
    assert e.value.code == 1008
    assert client.get(BASE + "/health").json() == {"status": "healthy"}
    # the bearer token is not a capability, and the capability is not a bearer token
    assert client.get("/openenv/" + TOKEN + "/health").status_code == 401
    assert client.get("/v1/envs", headers={"Authorization": f"Bearer {mint(TOKEN)}"}).status_code == 401
    r = client.post("/v1/openenv/clients", json={"client": "bad/name"}, headers=AUTH)
    assert r.status_code == 422


def test_ws_episode_with_turns_and_mcp_actions(client: TestClient) -> None:
    with client.websocket_connect(BASE + "/ws") as ws:
        ws.send_json({"type": "step", "data": {"type": "list_tools"}})
        assert ws.receive_json()["data"]["code"] == "SESSION_ERROR"
        ws.send_json({"type": "reset", "data": {"env": "probe", "seed": 253}})
        obs = ws.receive_json()
        assert obs["type"] == "observation" and obs["data"]["done"] is False and obs["data"]["reward"] is None
        assert obs["data"]["observation"]["task_id"] == "train-3"  # 253 mod 250
        assert obs["data"]["observation"]["messages"][0] == {"role": "system", "content": "Probe the tools."}
        ws.send_json({"type": "step", "data": {"type": "list_tools"}})
        tools = ws.receive_json()["data"]["observation"]["tools"]
        assert {t["name"] for t in tools} == {"count", "sleep", "fail", "submit"} and "input_schema" in tools[0]
        ws.send_json({"type": "step", "data": {"content": "", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "count", "arguments": "{}"}}]}})
        r = ws.receive_json()["data"]
        assert r["observation"]["messages"][0]["content"] == "1" and r["observation"]["turn"] == 1
        ws.send_json({"type": "step", "data": {"type": "call_tool", "tool_name": "fail", "arguments": {"kind": "tool"},
                                               "count_turn": False}})
        r = ws.receive_json()["data"]["observation"]
        assert r["error"] is None and r["result"]["isError"] is True and "as requested" in r["result"]["data"]
        ws.send_json({"type": "step", "data": {"type": "call_tool", "tool_name": "count", "arguments": {"x": 1}}})
        r = ws.receive_json()["data"]["observation"]
        assert r["error"]["error_type"] == "invalid_args"
        ws.send_json({"type": "state"})
        state = ws.receive_json()
        assert state["type"] == "state" and state["data"]["step_count"] == 3 and state["data"]["turn"] == 2
        ws.send_json({"type": "step", "data": {"type": "call_tool", "tool_name": "submit",
                                               "arguments": {"answer": "42"}}})
        r = ws.receive_json()["data"]
        assert r["done"] is True and r["reward"] == 1.0 and r["observation"]["stop_reason"] == "completed"
        ws.send_json({"type": "close"})
        with pytest.raises(WebSocketDisconnect):
            ws.receive_json()
    assert _sessions(client) == 0


def test_env_failure_is_data_and_reset_failure_an_error(client: TestClient) -> None:
    with client.websocket_connect(BASE + "/ws") as ws:
        ws.send_json({"type": "reset", "data": {"env": "probe", "task": {"id": "boom", "fail_reset": True}}})
        err = ws.receive_json()["data"]
        assert err["code"] == "EXECUTION_ERROR" and err["error"] == "env_error"
        ws.send_json({"type": "reset", "data": {"env": "probe", "task": {"id": "crash"}}})
        ws.receive_json()
        ws.send_json({"type": "step", "data": {"type": "call_tool", "tool_name": "fail", "arguments": {"kind": "crash"}}})
        r = ws.receive_json()["data"]
        assert r["done"] is True and r["reward"] == 0.0 and r["observation"]["stop_reason"] == "env_error"
    assert Probe.closed["crash"] >= 1 and _sessions(client) == 0


def test_reset_replaces_the_previous_session(client: TestClient) -> None:
    with client.websocket_connect(BASE + "/ws") as ws:
        for i in range(3):
            ws.send_json({"type": "reset", "data": {"env": "probe", "task_id": f"test-{i}"}})
            assert ws.receive_json()["type"] == "observation"
            assert _sessions(client) == 1
    assert _sessions(client) == 0


def test_http_routes(client: TestClient) -> None:
    r = client.post(BASE + "/reset", json={"env": "probe", "task_id": "test-1", "split": "test"})
    sid = r.json()["observation"]["session_id"]
    body = {"session_id": sid, "request_id": "k1", "action": {"type": "call_tool", "tool_name": "count",
                                                               "arguments": {"tag": "idem"}}}
    first, again = client.post(BASE + "/step", json=body).json(), client.post(BASE + "/step", json=body).json()
    assert first == again and first["observation"]["result"]["data"] == "1"  # the tool ran once
    assert client.get(BASE + "/state", params={"session_id": sid}).json()["step_count"] == 1
    assert client.get(BASE + "/state").json() == {"episode_id": None, "step_count": 0}
    for bad in ["not json", "[1]", json.dumps({"session_id": sid, "action": {"foo": 1}})]:
        r = client.post(BASE + "/step", content=bad, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
    assert client.post(BASE + "/reset", content="[]").status_code == 422
    assert client.post(BASE + "/step", json={"session_id": "nope", "action": {"content": "x"}}).status_code == 404
    assert set(client.get(BASE + "/schema").json()) == {"action", "observation", "state"}
    assert client.get(BASE + "/metadata", params={"env": "probe"}).json()["name"] == "probe"
    assert client.post(BASE + "/close", json={"session_id": sid}).json() == {"session_id": sid, "closed": True}
    assert client.post(BASE + "/close", json={"session_id": sid}).status_code == 404
    metrics = client.get("/metrics", headers=AUTH).text  # routes are labelled by template: no capability
    assert 'route="/openenv/{capability}/step"' in metrics and mint(TOKEN) not in metrics


def test_mcp_handshake_sessions_and_errors(client: TestClient) -> None:
    assert _rpc(client, "server/discover").json()["error"]["code"] == -32601
    r = _rpc(client, "initialize", {"protocolVersion": "2025-06-18",
                                   "_meta": {"agentrl": {"env": "probe", "task_id": "test-2"}}})
    res, sid = r.json()["result"], r.headers["mcp-session-id"]
    assert res["protocolVersion"] == "2025-06-18" and res["instructions"].endswith("task test-2")
    hdr = {"Mcp-Session-Id": sid}
    assert client.post(BASE + "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
                       headers=hdr).status_code == 202
    names = {t["name"] for t in _rpc(client, "tools/list", headers=hdr).json()["result"]["tools"]}
    assert names == {"count", "sleep", "fail", "submit"}
    res = _rpc(client, "tools/call", {"name": "submit", "arguments": {"answer": "7"}}, headers=hdr).json()["result"]
    assert res["isError"] is False and res["_meta"]["agentrl"]["done"] is True
    assert res["_meta"]["agentrl"]["reward"] == 0.0
    err = _rpc(client, "tools/call", {"name": "count"}, headers=hdr).json()["error"]
    assert "episode is over" in err["message"] and err["data"]["error"] == "episode_over"
    assert client.delete(BASE + "/mcp", headers=hdr).status_code == 204
    assert _rpc(client, "tools/list", headers=hdr).status_code == 404  # the session is gone
    assert client.get(BASE + "/mcp").status_code == 405
    # OpenEnv's own session methods, and malformed requests
    sid2 = _rpc(client, "openenv/session/create", {"env": "probe"}).json()["result"]["session_id"]
    out = _rpc(client, "tools/call", {"name": "count", "arguments": {}, "session_id": sid2}).json()
    assert out["result"]["content"][0]["text"] == "1"
    assert _rpc(client, "openenv/session/close", {"session_id": sid2}).json()["result"]["closed"] is True
    assert _rpc(client, "openenv/session/close", {"session_id": sid2}).json()["error"]["code"] == -32602
    assert _rpc(client, "tools/call", {"name": "count"}).json()["error"]["code"] == -32602  # no session
    assert _rpc(client, "nope").json()["error"]["code"] == -32601
    r = client.post(BASE + "/mcp", content="{", headers={"Content-Type": "application/json"})
    assert r.json()["error"]["code"] == -32700
    assert client.post(BASE + "/mcp", json=[1]).json()["error"]["code"] == -32600
    assert _rpc(client, "initialize", {"_meta": "x", "protocolVersion": "1999"}).json()["result"][
        "protocolVersion"] == "2025-11-25"
    assert _rpc(client, "tools/list", {"session_id": "x" * 10}).json()["error"]["code"] == -32602


def test_session_limits_hold_for_openenv(client: TestClient) -> None:
    with TestClient(create_app(config(max_sessions=1), TOKEN), raise_server_exceptions=False) as c:
        with c.websocket_connect(BASE + "/ws") as a, c.websocket_connect(BASE + "/ws") as b:
            a.send_json({"type": "reset", "data": {"env": "probe"}})
            assert a.receive_json()["type"] == "observation"
            b.send_json({"type": "reset", "data": {"env": "probe"}})
            assert b.receive_json()["data"]["code"] == "CAPACITY_REACHED"
            assert _rpc(c, "initialize").json()["error"]["data"]["status"] == 429
