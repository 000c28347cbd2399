"""Pure-logic tests of the inference client: endpoint selection, retries, error mapping, fallback."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import pytest

from agentrl.inference import ContextLengthError, EndpointPool, InferenceClient, InferenceError

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def _gen_body(ids: list[int], versions: list[dict] | None = None, finish: str = "length") -> dict:
    return {"choices": [{"index": 0, "finish_reason": finish, "token_ids": ids, "weight_versions": versions,
                         "logprobs": {"content": [{"token_id": t, "logprob": -0.5} for t in ids]}}]}


# ---- endpoint selection ---------------------------------------------------------------------------------


def test_pool_least_outstanding_requests() -> None:
    pool = EndpointPool([A, B, C])
    pool.endpoints[0].outstanding = 3
    pool.endpoints[1].outstanding = 1
    pool.endpoints[2].outstanding = 2
    assert pool.pick().url == B


def test_pool_dispatch_rules_requests_and_tokens() -> None:
    """A holds one long-context request, B three short ones: by requests (the default) A is the lighter
    engine; by tokens, the rule the simulator compares it with, B is."""
    for by, lighter in (("requests", A), ("tokens", B)):
        pool = EndpointPool([A, B], by=by)
        a, b = pool.endpoints
        a.outstanding, a.outstanding_tokens = 1, 20_000 + 4_096
        b.outstanding, b.outstanding_tokens = 3, 3 * (300 + 512)
        assert {pool.pick().url for _ in range(4)} == {lighter}, by
    b.outstanding_tokens = 30_000  # by tokens B now holds more work than A
    assert pool.pick().url == A
    with pytest.raises(ValueError, match="requests"):
        EndpointPool([A], by="bytes")  # type: ignore[arg-type]


def test_pool_ties_rotate() -> None:
    pool = EndpointPool([A, B, C])
    assert Counter(pool.pick().url for _ in range(9)) == {A: 3, B: 3, C: 3}


def test_pool_sticky_key_ignores_load() -> None:
    pool = EndpointPool([A, B])
    first = pool.pick("episode-1")
    first.outstanding = 100  # busy, but the episode stays where its prefix cache is
    assert pool.pick("episode-1") is first
    assert pool.pick("episode-2") is not first
    pool.forget("episode-1")
    assert pool.pick("episode-1") is not first


def test_pool_avoid_rebinds_key() -> None:
    pool = EndpointPool([A, B])
    first = pool.pick("k")
    other = pool.pick("k", avoid=[first.url])
    assert other is not first
    assert pool.pick("k") is other  # the key moved with the retry
    assert pool.pick(avoid=[A, B]).url in (A, B)  # everything avoided: still returns one


def test_pool_key_lru_bounded() -> None:
    pool = EndpointPool([A, B], max_keys=2)
    for k in ("x", "y", "z"):
        pool.pick(k)
    assert list(pool._sticky) == ["y", "z"]


def test_pool_needs_endpoints() -> None:
    with pytest.raises(ValueError):
        EndpointPool([])


# ---- retries, errors, fallback (fake transport) -----------------------------------------------------------


def _client(handler, endpoints=(A,), **kw) -> InferenceClient:
    kw.setdefault("backoff_s", 0.001)
    return InferenceClient(list(endpoints), transport=httpx.MockTransport(handler), **kw)


async def test_generate_parses_and_sends_token_request() -> None:
    seen: list[dict] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(json.loads(req.content))
        return httpx.Response(200, json=_gen_body([5, 6, 2], [{"version": "7", "start": 0, "end": 3}], "stop"))

    async with _client(handler) as c:
        g = await c.generate([1, 2], max_tokens=4, temperature=0.7, stop_token_ids=[9], model="pol")
    assert (g.token_ids, g.logprobs, g.finish_reason) == ([5, 6, 2], [-0.5] * 3, "stop")
    assert g.weight_versions == [("7", 0, 3)] and g.endpoint == A
    body = seen[0]
    assert body["model"] == "pol" and body["token_ids"] == [1, 2]
    sp = body["sampling_params"]
    assert sp["logprobs"] == 0 and sp["skip_special_tokens"] is False and sp["stop_token_ids"] == [9]
    assert sp["max_tokens"] == 4 and sp["temperature"] == 0.7


async def test_retries_5xx_then_succeeds() -> None:
    calls = Counter()

    def handler(req: httpx.Request) -> httpx.Response:
        calls[req.url.host] += 1
        if calls[req.url.host] < 3:
            return httpx.Response(503, json={"error": {"message": "overloaded"}})
        return httpx.Response(200, json=_gen_body([4]))

    async with _client(handler, max_retries=3) as c:
        assert (await c.generate([1], max_tokens=1)).token_ids == [4]
    assert calls["a"] == 3


async def test_retry_moves_to_another_endpoint() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "a":
            raise httpx.ConnectError("refused", request=req)
        return httpx.Response(200, json=_gen_body([4]))

    async with _client(handler, endpoints=(A, B), max_retries=1) as c:
        for _ in range(4):
            assert (await c.generate([1], max_tokens=1, key="ep")).endpoint == B
        assert c.pool.pick("ep").url == B


async def test_gives_up_after_retry_budget() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url)
        raise httpx.ReadTimeout("slow", request=req)

    async with _client(handler, max_retries=2, backoff_s=0.01) as c:
        t0 = time.monotonic()
        with pytest.raises(InferenceError, match=r"after 3 attempts.*http://a:1.*ReadTimeout"):
            await c.generate([1], max_tokens=1)
        assert time.monotonic() - t0 >= 0.01 + 0.02  # exponential backoff between tries
    assert len(calls) == 3


async def test_4xx_raises_at_once_with_server_message() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(404, json={"error": {"message": "The model `x` does not exist.", "code": 404}})

    async with _client(handler, max_retries=3) as c:
        with pytest.raises(InferenceError, match="does not exist") as ei:
            await c.generate([1], max_tokens=1, model="x")
    assert len(calls) == 1 and ei.value.status_code == 404 and not isinstance(ei.value, ContextLengthError)


async def test_context_length_error() -> None:
    msg = "The decoder prompt (length 1100) is longer than the maximum model length of 1024."

    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": msg, "type": "BadRequestError", "code": 400}})

    async with _client(handler) as c:
        with pytest.raises(ContextLengthError, match="maximum model length"):
            await c.generate([1] * 1100, max_tokens=1)


async def test_falls_back_to_completions_once() -> None:
    paths: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        paths.append(req.url.path)
        if req.url.path == "/inference/v1/generate":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(req.content)
        assert body["prompt"] == [1, 2] and body["return_token_ids"] is True and body["logprobs"] in (0, 1)
        # as vLLM answers: even at logprobs=0 each sampled token is listed among its alternatives, named by
        # text (here "\n", which is no number) unless ids were asked for
        name = "token_id:{}" if body.get("return_tokens_as_token_ids") else "\n{}"
        tops = [{name.format(7): -1.0}, {name.format(2): -2.0}]
        return httpx.Response(200, json={"choices": [{"token_ids": [7, 2], "finish_reason": "stop", "logprobs": {
            "token_logprobs": [-1.0, -2.0], "top_logprobs": tops}}]})

    async with _client(handler) as c:
        for _ in range(3):
            g = await c.generate([1, 2], max_tokens=3)
            assert (g.token_ids, g.logprobs, g.weight_versions, g.top_logprobs) == ([7, 2], [-1.0, -2.0], None, None)
        assert (await c.generate([1, 2], max_tokens=3, top_logprobs=1)).top_logprobs == [{7: -1.0}, {2: -2.0}]
    assert paths.count("/inference/v1/generate") == 1 and paths.count("/v1/completions") == 4


async def test_scale_out_disabled_403_falls_back() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/inference/v1/generate":
            return httpx.Response(403, json={"error": {"message": "Scale-out endpoints are disabled. Restart",
                                                       "type": "PermissionDeniedError", "code": 403}})
        return httpx.Response(200, json={"choices": [{"token_ids": [3], "finish_reason": "length",
                                                      "logprobs": {"token_logprobs": [-1.0]}}]})

    async with _client(handler) as c:
        assert (await c.generate([1], max_tokens=1)).token_ids == [3]


async def test_requests_in_flight_when_the_route_fails_warn_once(caplog: pytest.LogCaptureFixture) -> None:
    """Many requests sent before the first answer all meet the missing route: one warning per engine."""
    first, all_in, arrived = asyncio.Event(), asyncio.Event(), [0]

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/inference/v1/generate":
            arrived[0] += 1
            if arrived[0] == 16:
                all_in.set()
            await first.wait()  # every request is in flight before any answer comes back
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json={"choices": [{"token_ids": [3], "finish_reason": "length",
                                                      "logprobs": {"token_logprobs": [-1.0]}}]})

    async with _client(handler) as c:
        calls = [asyncio.ensure_future(c.generate([1], max_tokens=1)) for _ in range(16)]
        await asyncio.wait_for(all_in.wait(), 30)
        first.set()
        assert all(g.token_ids == [3] for g in await asyncio.gather(*calls))
    warnings = [r for r in caplog.records if "falling back" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]


async def test_least_outstanding_under_concurrency() -> None:
    async def handler(req: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.02)
        return httpx.Response(200, json=_gen_body([1]))

    async with _client(handler, endpoints=(A, B, C)) as c:
        gens = await asyncio.gather(*(c.generate([1], max_tokens=1) for _ in range(30)))
        assert Counter(g.endpoint for g in gens) == {A: 10, B: 10, C: 10}
        assert all(e.outstanding == 0 and e.outstanding_tokens == 0 for e in c.pool.endpoints)


async def test_generate_counts_prompt_and_max_tokens_while_in_flight() -> None:
    """While a request is in flight its engine holds len(prompt) + max_tokens outstanding tokens; a long
    request on A sends the short ones that follow to B, and everything is released at the end."""
    release = asyncio.Event()
    seen: dict[str, int] = {}

    async def handler(req: httpx.Request) -> httpx.Response:
        if len(json.loads(req.content)["token_ids"]) > 100:
            await release.wait()
        return httpx.Response(200, json=_gen_body([1]))

    async with _client(handler, endpoints=(A, B)) as c:
        long = asyncio.create_task(c.generate(list(range(1000)), max_tokens=500))
        await asyncio.sleep(0.05)
        seen = {e.url: e.outstanding_tokens for e in c.pool.endpoints}
        shorts = [await c.generate([1, 2], max_tokens=8) for _ in range(3)]
        release.set()
        await long
        assert sorted(seen.values()) == [0, 1500]
        busy = next(u for u, n in seen.items() if n)
        assert {g.endpoint for g in shorts} == {B if busy == A else A}
        assert all(e.outstanding == 0 and e.outstanding_tokens == 0 for e in c.pool.endpoints)


async def test_broadcast_admin_calls() -> None:
    seen: list[tuple[str, str, str]] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((req.url.host, req.url.path, req.url.query.decode()))
        if req.url.path == "/v1/unload_lora_adapter":
            return httpx.Response(404, json={"error": {"message": "The lora adapter 'p' cannot be found.",
                                                       "type": "NotFoundError", "code": 404}})
        return httpx.Response(200, json={"status": "ok"})

    async with _client(handler, endpoints=(A, B)) as c:
        assert await c.load_lora_adapter("p", "/x") >= 0.0
        await c.pause("keep")
        await c.resume()
        await c.set_weight_version("3")
        await c.unload_lora_adapter("p")  # missing is fine by default
        with pytest.raises(InferenceError, match="cannot be found"):
            await c.unload_lora_adapter("p", missing_ok=False)
        with pytest.raises(ValueError):
            await c.pause("bogus")
    assert {(h, p) for h, p, _ in seen} >= {("a", "/v1/load_lora_adapter"), ("b", "/v1/load_lora_adapter"),
                                           ("a", "/pause"), ("b", "/update_weight_version"), ("b", "/resume")}
    assert ("a", "/pause", "mode=keep") in seen


async def test_admin_route_missing_hints_dev_mode() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    async with _client(handler) as c:
        with pytest.raises(InferenceError, match="VLLM_SERVER_DEV_MODE"):
            await c.pause()


async def test_health_reports_each_endpoint() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "b":
            raise httpx.ConnectError("down", request=req)
        return httpx.Response(200)

    async with _client(handler, endpoints=(A, B)) as c:
        assert await c.health() == {A: True, B: False}


def test_top_logprobs_are_read_by_id_from_either_route() -> None:
    from agentrl.inference.wire import parse_completions, parse_generate

    content = [{"token_id": 5, "logprob": -0.1, "top_logprobs": [{"token_id": 5, "logprob": -0.1},
                                                                  {"token_id": 9, "logprob": -2.5}]},
               {"token_id": 6, "logprob": -3.0, "top_logprobs": [{"token_id": 6, "logprob": -3.0},
                                                                  {"token_id": 1, "logprob": -0.2}]}]
    gen = parse_generate({"choices": [{"token_ids": [5, 6], "logprobs": {"content": content}}]}, "http://e")
    assert gen.top_logprobs == [{5: -0.1, 9: -2.5}, {6: -3.0, 1: -0.2}]
    body = {"choices": [{"token_ids": [5, 6], "logprobs": {
        "token_logprobs": [-0.1, -3.0], "top_logprobs": [{"token_id:5": -0.1, "token_id:9": -2.5},
                                                         {"token_id:6": -3.0, "token_id:1": -0.2}]}}]}
    assert parse_completions(body, "http://e").top_logprobs == gen.top_logprobs
    for c in content:
        c["top_logprobs"] = []
    assert parse_generate({"choices": [{"token_ids": [5, 6], "logprobs": {"content": content}}]}, "x").top_logprobs is None


async def test_a_request_on_an_engine_that_leaves_the_rotation_is_retried_elsewhere() -> None:
    """Engine A's host is lost: its request would hang until the read timeout. When A leaves the rotation
    (the health watch gives up on it) the request is abandoned and sent to B; A's next spell in rotation
    starts clean."""
    started = asyncio.Event()

    async def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "a":
            started.set()
            await asyncio.sleep(3600)  # a lost host: no answer, no error
        return httpx.Response(200, json=_gen_body([4]))

    async with _client(handler, endpoints=(A, B), timeout_s=600) as c:
        c.pool.endpoints[1].outstanding = 5  # A is picked first
        request = asyncio.ensure_future(c.generate([1], max_tokens=1))
        await asyncio.wait_for(started.wait(), 5)
        c.pool.mark_down(A, "health check failed")
        gen = await asyncio.wait_for(request, 5)
        assert gen.endpoint == B and gen.token_ids == [4]
        assert c.pool.endpoints[0].outstanding == 0
        c.pool.mark_up(A)
        assert not c.pool.endpoints[0].left.is_set()


async def test_clients_share_one_tls_context() -> None:
    """Building a TLS context reads the whole CA bundle (tens of ms of a blocked event loop): the engine
    client's pools and each remote episode's client reuse the process's one context."""
    from agentrl.core.utils.tls import tls_context
    from agentrl.environment.remote import RemoteEnvironment

    def context_of(http: httpx.AsyncClient) -> object:
        return http._transport._pool._ssl_context  # type: ignore[attr-defined]

    async with InferenceClient(["http://a:1", "http://b:2"]) as client:
        assert {id(context_of(p)) for p in client._pools} == {id(tls_context())}
    episodes = [RemoteEnvironment(url="http://env:1") for _ in range(2)]
    assert all(context_of(e._client()) is tls_context() for e in episodes)
    for e in episodes:
        await e._client().aclose()
