"""Fuzzing the environment server from its own OpenAPI spec (schemathesis), plus raw garbage requests.

The property: whatever a client sends, the answer is never a 5xx (and, for requests shaped by the spec,
its status code, content type and body are the documented ones). Session routes are fuzzed twice per
generated case: with the generated session id, and with the id of a live session (so bodies reach the
step/reward logic, not only the 404 branch). ``AGENTRL_FUZZ_EXAMPLES`` raises the examples per operation.
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from agentrl.http.server import create_app
from tests.env_server_helpers import AUTH, TOKEN, config

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("AGENTRL_FUZZ_EXAMPLES", "60"))
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
)

# schemathesis runs APP in its own event loop (with its lifespan); the raw tests use GARBAGE_APP.
APP = create_app(config(max_request_bytes=64 * 1024), TOKEN)
GARBAGE_APP = create_app(config(max_request_bytes=64 * 1024), TOKEN)
STATS: Counter[str] = Counter()


def live_session(app: Any = APP) -> str:
    """The id of an open session of ``app`` whose episode is not over (a new one when needed)."""
    manager = app.state.manager
    for sid, s in manager.sessions.items():
        if not s.episode.done:
            return sid
    env = "calc" if len(manager.sessions) % 2 else "probe"
    task = {"id": f"fuzz-{uuid.uuid4().hex[:6]}", "question": "1 + 1?", "answer": 2}
    client = TestClient(app, headers=AUTH)
    r = client.post("/v1/sessions", json={"env": env, "task": task})
    assert r.status_code == 201, r.text
    for sid in list(manager.sessions)[:-8]:  # keep the store small
        client.delete(f"/v1/sessions/{sid}")
    return r.json()["session_id"]


@pytest.fixture(scope="module")
def garbage_client() -> Iterator[TestClient]:
    with TestClient(GARBAGE_APP, headers=AUTH, raise_server_exceptions=False) as c:
        yield c


def record(response: Any, where: str) -> None:
    STATS["requests"] += 1
    STATS[f"{response.status_code // 100}xx"] += 1
    assert response.status_code < 500, f"{where} answered {response.status_code}: {response.text[:500]}"


schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@schema.parametrize()
@SETTINGS
def test_openapi_fuzz_never_5xx(case: schemathesis.Case) -> None:
    """No 5xx, and every answer has a documented status, content type and body schema."""
    record(case.call_and_validate(headers=AUTH, checks=CHECKS), f"{case.method} {case.formatted_path}")
    if "session_id" in (case.path_parameters or {}):
        case.path_parameters = {**case.path_parameters, "session_id": live_session()}
        record(
            case.call_and_validate(headers=AUTH, checks=CHECKS),
            f"{case.method} {case.formatted_path} (live session)",
        )


@schema.parametrize()
@settings(
    max_examples=max(5, EXAMPLES // 6), deadline=None, suppress_health_check=list(HealthCheck), database=None
)
def test_openapi_fuzz_without_token_is_401(case: schemathesis.Case) -> None:
    response = case.call()
    record(response, f"{case.method} {case.formatted_path} (no token)")
    if case.path not in ("/health", "/openapi.json"):
        assert response.status_code in (401, 404, 405, 413, 422), response.text


SEGMENTS = st.sampled_from(
    [
        "v1",
        "sessions",
        "envs",
        "calc",
        "probe",
        "tasks",
        "step",
        "reward",
        "rollouts",
        "..",
        "%00",
        "%ff",
        "x" * 300,
        "ünï",
        "{session_id}",
        "",
        "metrics",
        "health",
    ]
)
METHODS = st.sampled_from(["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"])
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "",
    ]
)
BODIES = st.one_of(
    st.binary(max_size=2048),
    st.text(max_size=512).map(str.encode),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
        lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=12), kids, max_size=4),
        max_leaves=20,
    ).map(lambda v: __import__("json").dumps(v).encode()),
)


@given(
    method=METHODS,
    segments=st.lists(SEGMENTS, min_size=0, max_size=5),
    body=BODIES,
    ctype=CONTENT_TYPES,
    live=st.booleans(),
)
@SETTINGS
def test_garbage_requests_never_5xx(
    garbage_client: TestClient, method: str, segments: list[str], body: bytes, ctype: str, live: bool
) -> None:
    path = "/" + "/".join(live_session(GARBAGE_APP) if live and s == "{session_id}" else s for s in segments)
    headers = {**AUTH, "content-type": ctype} if ctype else dict(AUTH)
    # An absolute URL: the client refuses a relative one whose path starts with "//" (empty segments).
    url = f"http://testserver{path}"
    record(garbage_client.request(method, url, content=body, headers=headers), f"{method} {path}")


@given(body=BODIES, ctype=CONTENT_TYPES, route=st.sampled_from(["step", "reward", "create"]))
@SETTINGS
def test_garbage_bodies_on_live_sessions_never_5xx(
    garbage_client: TestClient, body: bytes, ctype: str, route: str
) -> None:
    path = "/v1/sessions" if route == "create" else f"/v1/sessions/{live_session(GARBAGE_APP)}/{route}"
    headers = {**AUTH, "content-type": ctype} if ctype else dict(AUTH)
    record(garbage_client.post(path, content=body, headers=headers), f"POST {path}")


def test_fuzz_summary() -> None:
    """Runs last in this module: the totals (reported with -s)."""
    if not STATS:
        pytest.skip("the fuzz tests did not run")
    print(f"\nenv-server fuzz: {dict(STATS)}")
    assert STATS["5xx"] == 0
