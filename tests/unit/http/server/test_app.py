"""The environment server's contract: sessions, steps, rewards, idempotency, auth, limits and expiry."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from agentrl.http.server import ServerConfig, create_app
from agentrl.http.server.run import resolve_token
from tests.env_server_helpers import AUTH, TOKEN, Probe, config


def make_client(**kw: Any) -> TestClient:
    return TestClient(create_app(config(**kw), TOKEN), headers=AUTH, raise_server_exceptions=False)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c


def call(name: str, args: Any = None, cid: str | None = None, raw: str | None = None) -> dict[str, Any]:
    fn = {"name": name, "arguments": raw if raw is not None else json.dumps(args or {})}
    return {"id": cid or f"c-{uuid.uuid4().hex[:6]}", "type": "function", "function": fn}


def open_probe(c: TestClient, **task: Any) -> str:
    task.setdefault("id", f"t-{uuid.uuid4().hex[:8]}")
    r = c.post("/v1/sessions", json={"env": "probe", "task": task})
    assert r.status_code == 201, r.text
    return r.json()["session_id"]


def step(c: TestClient, sid: str, *calls: dict[str, Any], content: str = "", **extra: Any) -> httpx.Response:
    return c.post(f"/v1/sessions/{sid}/step", json={"content": content, "tool_calls": list(calls), **extra})


# ----- discovery ------------------------------------------------------------------------------------------
def test_envs_and_tasks(client: TestClient) -> None:
    envs = {e["name"]: e for e in client.get("/v1/envs").json()["envs"]}
    assert set(envs) == {"probe", "calc"}
    calc = envs["calc"]
    assert calc["max_turns"] == 4 and calc["accepts_task_payload"] is True
    assert [t["function"]["name"] for t in calc["tools"]] == ["calculate"]
    assert calc["description"].startswith("Arithmetic word problems")
    page = client.get("/v1/envs/probe/tasks", params={"split": "train", "offset": 240, "limit": 100}).json()
    assert (page["total"], page["offset"], len(page["tasks"])) == (250, 240, 10)
    assert client.get("/v1/envs/nope/tasks").status_code == 404
    r = client.get("/v1/envs/probe/tasks", params={"split": "valid"})
    assert r.status_code == 404 and "no split 'valid'" in r.json()["message"]
    assert client.get("/v1/envs/probe/tasks", params={"limit": 0}).status_code == 422


# ----- sessions and steps ---------------------------------------------------------------------------------
def test_calc_episode_by_task_id(client: TestClient) -> None:
    r = client.post("/v1/sessions", json={"env": "calc", "task_id": "calc-test-3"})
    assert r.status_code == 201
    s = r.json()
    assert [m["role"] for m in s["messages"]] == ["system", "user"] and s["task_id"] == "calc-test-3"
    assert s["tools"][0]["function"]["name"] == "calculate" and s["max_turns"] == 4
    task = next(
        t for t in client.get("/v1/envs/calc/tasks?split=test").json()["tasks"] if t["id"] == "calc-test-3"
    )
    r = step(client, s["session_id"], call("calculate", {"expression": task["expression"]}, cid="c1"))
    res = r.json()
    assert r.status_code == 200 and res["done"] is False and res["turn"] == 1
    tool_s = res["observations"][0].pop("tool_s")
    assert res["observations"] == [
        {"tool_call_id": "c1", "name": "calculate", "content": str(task["answer"]), "error": None}
    ]
    assert 0 <= tool_s < 1.0
    assert res["messages"] == [
        {"role": "tool", "tool_call_id": "c1", "name": "calculate", "content": str(task["answer"])}
    ]
    res = step(client, s["session_id"], content=f"The answer is {task['answer']}.").json()
    assert (res["done"], res["stop_reason"], res["reward"], res["metrics"]) == (
        True,
        "completed",
        1.0,
        {"used_tool": 1.0},
    )
    r = step(client, s["session_id"], content="again")
    assert r.status_code == 409 and r.json()["error"] == "episode_over"
    assert client.post(f"/v1/sessions/{s['session_id']}/reward").json()["reward"] == 1.0
    state = client.get(f"/v1/sessions/{s['session_id']}").json()
    assert (
        state["done"]
        and state["steps"] == 2
        and [m["role"] for m in state["messages"]][-3:] == ["assistant", "tool", "assistant"]
    )
    assert client.delete(f"/v1/sessions/{s['session_id']}").json() == {
        "session_id": s["session_id"],
        "closed": True,
    }
    assert client.delete(f"/v1/sessions/{s['session_id']}").status_code == 404
    assert client.get(f"/v1/sessions/{s['session_id']}").status_code == 404


def test_tool_failures_are_observations(client: TestClient) -> None:
    sid = open_probe(client)
    res = step(
        client,
        sid,
        call("fail", {"kind": "tool"}),
        call("nope"),
        call("count", {"bad": 1}),
        call("count", raw="{not json"),
        call("count", raw="[1]"),
        call("count", {"tag": "a"}),
    ).json()
    kinds = [o["error"] for o in res["observations"]]
    assert kinds == [
        "tool_error",
        "invalid_arguments",
        "invalid_arguments",
        "invalid_arguments",
        "invalid_arguments",
        None,
    ]
    texts = [o["content"] for o in res["observations"]]
    assert (
        texts[0] == "Error: as requested"
        and "unknown tool 'nope'" in texts[1]
        and "not valid JSON" in texts[3]
    )
    assert "must be a JSON object" in texts[4] and texts[5] == "1" and res["done"] is False


def test_environment_crash_ends_episode_without_http_error(client: TestClient) -> None:
    sid = open_probe(client)
    r = step(client, sid, call("fail", {"kind": "crash"}), call("count"))
    res = r.json()
    assert r.status_code == 200 and len(res["observations"]) == 1
    assert (
        res["observations"][0]["error"] == "env_error"
        and "RuntimeError: environment bug" in res["observations"][0]["content"]
    )
    assert (res["done"], res["stop_reason"], res["reward"]) == (True, "env_error", 0.0)
    assert "Traceback" not in r.text and "RuntimeError: environment bug" in res["error"]


def test_reset_and_reward_failures(client: TestClient) -> None:
    r = client.post("/v1/sessions", json={"env": "probe", "task": {"id": "boom", "fail_reset": True}})
    assert (
        r.status_code == 422 and r.json()["error"] == "env_error" and "reset exploded" in r.json()["message"]
    )
    assert Probe.closed["boom"] == 1, "a failed reset must still close the environment"
    r = client.post("/v1/sessions", json={"env": "calc", "task": {"id": "no-question"}})
    assert r.status_code == 422 and "KeyError" in r.json()["message"]
    sid = open_probe(client, fail_reward=True)
    res = step(client, sid, content="42").json()
    assert (res["done"], res["stop_reason"], res["reward"]) == (True, "env_error", 0.0)
    assert "reward exploded" in res["error"]


def test_turn_limit_finish_and_count_turn(client: TestClient) -> None:
    sid = open_probe(client)
    for i in range(1, 4):
        res = step(client, sid, call("count")).json()
        assert res["turn"] == i and res["done"] is (i == 3)
    assert res["stop_reason"] == "max_turns" and res["reward"] == 0.0
    sid = open_probe(client)
    for _ in range(5):  # one call per step, the client counts turns itself
        assert step(client, sid, call("count"), count_turn=False).json()["done"] is False
    res = step(client, sid, call("submit", {"answer": "42"}), call("count")).json()
    assert [o["name"] for o in res["observations"]] == ["submit"], "calls after finish() are not run"
    assert (res["done"], res["stop_reason"], res["reward"]) == (True, "completed", 1.0)


def test_reward_endpoint_ends_and_scores_once(client: TestClient) -> None:
    sid = open_probe(client)
    step(client, sid, call("count"))
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "42"}]
    r = client.post(f"/v1/sessions/{sid}/reward", json={"messages": msgs, "stop_reason": "max_tokens"})
    assert r.json() == {"reward": 1.0, "metrics": {"turns": 2.0}, "stop_reason": "max_tokens", "error": None}
    r = client.post(f"/v1/sessions/{sid}/reward", json={"messages": [{"role": "assistant", "content": "0"}]})
    assert r.json()["reward"] == 1.0, "the reward is computed once per session"
    assert (
        client.post(f"/v1/sessions/{sid}/reward", json={"messages": [{"role": "robot"}]}).status_code == 422
    )


def test_create_validation(client: TestClient) -> None:
    cases = [
        ({}, 422),
        ({"task_id": "train-0"}, 422),
        ({"env": "probe", "task_id": "x", "task": {}}, 422),
        ({"env": "probe", "task_id": "nope"}, 404),
        ({"env": "zzz", "task_id": "x"}, 404),
        ({"env": "probe", "task": {}, "split": "train"}, 422),
        ({"env": "probe", "task_id": "t", "extra": 1}, 422),
        ({"env": "probe", "task_id": "train-3", "split": "test"}, 404),
    ]
    for body, status in cases:
        r = client.post("/v1/sessions", json=body)
        assert r.status_code == status, (body, r.text)
        assert set(r.json()) == {"error", "message", "detail"}
    r = client.post("/v1/sessions", json={"env": "probe", "task_id": "test-2", "split": "test"})
    assert r.status_code == 201 and r.json()["task_id"] == "test-2"
    r = client.post("/v1/sessions", content=b"{nope", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["message"] == "the request body is not valid JSON"
    with make_client(allow_task_payload=False) as c:
        r = c.post("/v1/sessions", json={"env": "probe", "task": {"id": "x"}})
        assert r.status_code == 403 and "task_id" in r.json()["message"]


def test_single_env_server_needs_no_env_name() -> None:
    with TestClient(create_app(config(envs=["calc"]), TOKEN), headers=AUTH) as c:
        assert c.post("/v1/sessions", json={"task_id": "calc-train-1"}).status_code == 201


# ----- idempotency -----------------------------------------------------------------------------------------
def test_step_idempotency_key(client: TestClient) -> None:
    sid = open_probe(client, id="idem")
    body = {"tool_calls": [call("count", {"tag": "k"}, cid="c1")]}
    first = client.post(f"/v1/sessions/{sid}/step", json=body, headers={"Idempotency-Key": "k1"})
    again = client.post(f"/v1/sessions/{sid}/step", json=body, headers={"Idempotency-Key": "k1"})
    assert first.json() == again.json() and first.json()["observations"][0]["content"] == "1"
    assert Probe.calls["idem:k"] == 1, "a retried step must not run the tool again"
    other = client.post(f"/v1/sessions/{sid}/step", json=body, headers={"Idempotency-Key": "k2"})
    assert other.json()["observations"][0]["content"] == "2"
    r = client.post(
        f"/v1/sessions/{sid}/step", json={"content": "different"}, headers={"Idempotency-Key": "k1"}
    )
    assert r.status_code == 422 and "Idempotency-Key" in r.json()["message"]


async def test_concurrent_retries_run_a_tool_once() -> None:
    app = create_app(config(), TOKEN)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
            r = await c.post(
                "/v1/sessions",
                json={"env": "probe", "task": {"id": "conc"}},
                headers={"Idempotency-Key": "create-1"},
            )
            r2 = await c.post(
                "/v1/sessions",
                json={"env": "probe", "task": {"id": "conc"}},
                headers={"Idempotency-Key": "create-1"},
            )
            assert r.status_code == r2.status_code == 201 and r.json() == r2.json()
            assert len(app.state.manager.sessions) == 1
            sid = r.json()["session_id"]
            body = {"tool_calls": [call("sleep", {"seconds": 0.2}), call("count", {"tag": "c"})]}
            results = await asyncio.gather(
                *(
                    c.post(f"/v1/sessions/{sid}/step", json=body, headers={"Idempotency-Key": "same"})
                    for _ in range(5)
                )
            )
            assert len({res.text for res in results}) == 1 and Probe.calls["conc:c"] == 1


# ----- auth -------------------------------------------------------------------------------------------------
def test_auth_required() -> None:
    with TestClient(create_app(config(), TOKEN)) as c:
        assert c.get("/health").status_code == 200 and c.get("/openapi.json").status_code == 200
        for method, path in [
            ("GET", "/v1/envs"),
            ("POST", "/v1/sessions"),
            ("GET", "/metrics"),
            ("POST", "/v1/sessions/x/step"),
            ("DELETE", "/v1/sessions/x"),
            ("POST", "/v1/rollouts"),
        ]:
            r = c.request(method, path, json={})
            assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), (method, path)
            assert r.json()["error"] == "unauthorized"
        for bad in (
            "Bearer wrong-token-xxxxxxxxxxxx",
            "Basic dXNlcjpwYXNz",
            f"Bearer {TOKEN}x",
            "Bearer",
            "bearer  ",
        ):
            r = c.get("/v1/envs", headers={"Authorization": bad})
            assert r.status_code in (401, 403) and r.status_code < 500, bad
        assert c.get("/v1/envs", headers=AUTH).status_code == 200


def test_no_auth_only_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        assert ServerConfig(host=host, auth=False).auth is False
    for host in ("0.0.0.0", "10.1.2.3", "::", "example.org"):
        with pytest.raises(ValueError, match="only allowed on a loopback"):
            ServerConfig(host=host, auth=False)
    with TestClient(create_app(config(auth=False, token=None))) as c:
        assert c.get("/v1/envs").status_code == 200
    with pytest.raises(ValueError, match="no token"):
        create_app(config(token=None), None)
    monkeypatch.delenv("AGENTRL_ENV_TOKEN", raising=False)
    token, generated = resolve_token(ServerConfig())
    assert generated and len(token or "") >= 32
    monkeypatch.setenv("AGENTRL_ENV_TOKEN", "from-the-environment-123")
    assert resolve_token(ServerConfig()) == ("from-the-environment-123", False)
    assert resolve_token(ServerConfig(auth=False)) == (None, False)
    with pytest.raises(ValueError, match="at least 16"):
        ServerConfig(token="short")


# ----- limits -----------------------------------------------------------------------------------------------
def test_request_size_limit() -> None:
    with make_client(max_request_bytes=4096) as c:
        r = c.post("/v1/sessions", json={"env": "probe", "task": {"id": "big", "blob": "x" * 5000}})
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large"

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies to the streamed bytes
            yield b'{"env": "probe", "task": {"blob": "'
            for _ in range(10):
                yield b"y" * 1000
            yield b'"}}'

        r = c.post("/v1/sessions", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413


def test_session_limits() -> None:
    with make_client(max_sessions=3, max_sessions_per_client=2) as c:
        a, b = open_probe(c), open_probe(c)
        r = c.post("/v1/sessions", json={"env": "probe", "task": {"id": "third"}})
        assert (
            r.status_code == 429 and r.headers["retry-after"] == "1" and "per-client" in r.json()["message"]
        )
        c.delete(f"/v1/sessions/{a}")
        open_probe(c)
        assert c.get("/health").json()["sessions"] == 2
        assert b


def test_tool_call_and_step_limits() -> None:
    with make_client(max_tool_calls_per_step=2, max_steps_per_session=2) as c:
        sid = open_probe(c)
        r = step(c, sid, call("count"), call("count"), call("count"))
        assert r.status_code == 422 and "at most 2" in r.json()["message"]
        step(c, sid, call("count"), count_turn=False)
        step(c, sid, call("count"), count_turn=False)
        r = step(c, sid, call("count"), count_turn=False)
        assert r.status_code == 409 and "step limit" in r.json()["message"]


def test_step_time_limit() -> None:
    with make_client(step_timeout_s=0.3) as c:
        sid = open_probe(c)
        res = step(c, sid, call("sleep", {"seconds": 2}), call("count")).json()
        assert [o["error"] for o in res["observations"]] == ["timeout", "timeout"]
        assert (
            "timed out" in res["observations"][0]["content"]
            and "time limit" in res["observations"][1]["content"]
        )
        assert res["done"] is False
        assert step(c, sid, call("count")).json()["observations"][0]["error"] is None


async def test_idle_sessions_expire_and_shutdown_closes_the_rest() -> None:
    app = create_app(config(session_ttl_s=0.3, reap_interval_s=0.05), TOKEN)
    manager = app.state.manager
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=AUTH) as c:
            r = await c.post("/v1/sessions", json={"env": "probe", "task": {"id": "idle"}})
            sid = r.json()["session_id"]
            await asyncio.sleep(1.0)
            assert Probe.closed["idle"] == 1 and sid not in manager.sessions
            r = await c.post(f"/v1/sessions/{sid}/step", json={"content": "x"})
            assert r.status_code == 404 and "expired" in r.json()["message"]
            assert [t.get_name() for t in asyncio.all_tasks() if t.get_name() == "agentrl-env-session-reaper"]
            await c.post("/v1/sessions", json={"env": "probe", "task": {"id": "kept"}})
    assert Probe.closed["kept"] == 1, "shutdown must close open sessions"
    assert manager.admission.total == 0


async def test_run_hooks_bracket_the_server_lifetime() -> None:
    app = create_app(config(owner="srv-1"), TOKEN)
    Probe.runs.clear()
    async with app.router.lifespan_context(app):
        assert Probe.runs == ["setup:srv-1"]
    assert Probe.runs == ["setup:srv-1", "teardown"]


# ----- errors, metrics, spec ----------------------------------------------------------------------------------
def test_error_shape_and_metrics(client: TestClient) -> None:
    for r in (client.get("/nope"), client.put("/v1/envs"), client.get("/v1/sessions/" + "x" * 100)):
        assert 400 <= r.status_code < 500 and set(r.json()) == {"error", "message", "detail"}
    sid = open_probe(client)
    step(client, sid, call("count"))
    text = client.get("/metrics").text
    assert "# TYPE agentrl_env_step_seconds histogram" in text
    assert 'agentrl_env_tool_calls_total{env="probe",outcome="ok"} 1' in text
    assert (
        'agentrl_env_sessions_created_total{env="probe"} 1' in text and "agentrl_env_sessions_open 1" in text
    )
    assert 'route="/v1/sessions/{session_id}/step"' in text


def test_openapi_spec_documents_everything(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    paths = spec["paths"]
    assert {
        "/v1/envs",
        "/v1/envs/{env}/tasks",
        "/v1/sessions",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/step",
        "/v1/sessions/{session_id}/reward",
        "/v1/rollouts",
        "/health",
        "/metrics",
    } <= set(paths)
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    step_op = paths["/v1/sessions/{session_id}/step"]["post"]
    assert {"401", "404", "409", "422"} <= set(step_op["responses"])
    schemas = spec["components"]["schemas"]
    assert schemas["StepRequest"]["examples"] and schemas["CreateSession"]["examples"]
    for name in ("StepRequest", "StepResult", "CreateSession", "SessionCreated", "Observation"):
        props = schemas[name]["properties"]
        assert all(p.get("description") for p in props.values()), name


def test_rollouts_need_a_tokenizer(client: TestClient) -> None:
    body = {"env": "calc", "task_id": "calc-test-0", "base_url": "http://127.0.0.1:9", "model": "m"}
    r = client.post("/v1/rollouts", json=body)
    assert r.status_code == 409 and r.json()["error"] == "rollouts_disabled"
    assert client.post("/v1/rollouts", json={**body, "base_url": "file:///etc/passwd"}).status_code == 422


def test_rollout_tokenizer_choice(tmp_path: Path) -> None:
    with make_client(tokenizers=[str(tmp_path)]) as c:  # a directory without a tokenizer
        body = {"env": "calc", "task_id": "calc-test-0", "base_url": "http://127.0.0.1:9", "model": "m"}
        r = c.post("/v1/rollouts", json={**body, "tokenizer": "other"})
        assert r.status_code == 422 and "unknown tokenizer 'other'" in r.json()["message"]
        r = c.post("/v1/rollouts", json={**body, "tokenizer": tmp_path.name})
        assert r.status_code == 409 and r.json()["error"] == "tokenizer_unavailable"
        assert c.post("/v1/rollouts", json={**body, "task_id": "nope"}).status_code == 404


def test_rollout_tool_parser_choice(tmp_path: Path) -> None:
    """The caller names its model's tool parser; an unknown name is a clear 422 listing the valid ones."""
    with make_client(tokenizers=[str(tmp_path)]) as c:
        body = {"env": "calc", "task_id": "calc-test-0", "base_url": "http://127.0.0.1:9", "model": "m"}
        r = c.post("/v1/rollouts", json={**body, "tool_parser": "nope"})
        assert r.status_code == 422 and r.json()["error"] == "unknown_tool_parser"
        assert "llama3_json" in r.json()["message"]
        r = c.post("/v1/rollouts", json={**body, "tool_parser": "llama3_json"})
        assert r.status_code == 409 and r.json()["error"] == "tokenizer_unavailable"  # a known parser passes
