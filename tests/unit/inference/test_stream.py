"""Streamed generations (``on_tokens``): each chunk's ids handed on in order, the assembled ``Generation`` equal
to the unstreamed one, and a failure after ids were handed on raised, never retried elsewhere."""

from __future__ import annotations

import json

import httpx
import pytest

from agentrl.inference import InferenceClient, InferenceError

A, B = "http://a:1", "http://b:1"
IDS = [5, 6, 7, 2]
SPANS = [{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 4}]


def _chunk(ids: list[int], finish: str | None = None, spans: list[dict] | None = None) -> str:
    choice = {"index": 0, "token_ids": ids, "finish_reason": finish, "weight_versions": spans,
              "logprobs": {"content": [{"token_id": t, "logprob": -0.1 * t} for t in ids]}}
    return f"data: {json.dumps({'request_id': 'r', 'choices': [choice]})}\n\n"


def _sse(*events: str) -> httpx.Response:
    return httpx.Response(200, content="".join(events).encode(), headers={"content-type": "text/event-stream"})


def _whole(stream: bool) -> httpx.Response:
    if stream:
        return _sse(_chunk(IDS[:1]), _chunk(IDS[1:3]), _chunk(IDS[3:], "stop", SPANS), "data: [DONE]\n\n")
    choice = {"index": 0, "token_ids": IDS, "finish_reason": "stop", "weight_versions": SPANS,
              "logprobs": {"content": [{"token_id": t, "logprob": -0.1 * t} for t in IDS]}}
    return httpx.Response(200, json={"choices": [choice]})


def _client(handler, endpoints=(A,)) -> InferenceClient:
    return InferenceClient(list(endpoints), transport=httpx.MockTransport(handler), backoff_s=0.001, max_retries=2)


async def test_streamed_ids_arrive_in_order_and_the_generation_is_the_unstreamed_one() -> None:
    asked: list[bool] = []

    def handler(req: httpx.Request) -> httpx.Response:
        stream = bool(json.loads(req.content).get("stream"))
        asked.append(stream)
        return _whole(stream)

    got: list[list[int]] = []
    async with _client(handler) as c:
        streamed = await c.generate([1, 2], max_tokens=8, on_tokens=got.append)
        plain = await c.generate([1, 2], max_tokens=8)
    assert asked == [True, False] and got == [[5], [6, 7], [2]]
    assert (streamed.token_ids, streamed.logprobs, streamed.finish_reason, streamed.weight_versions) == \
           (plain.token_ids, plain.logprobs, plain.finish_reason, plain.weight_versions)
    assert streamed.weight_versions == [("3", 0, 2), ("4", 2, 4)]


async def test_a_stream_cut_before_any_id_is_retried_elsewhere() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "a":
            return _sse("data: [DONE]\n\n")  # no finish reason: cut
        return _whole(True)

    got: list[list[int]] = []
    async with _client(handler, endpoints=(A, B)) as c:
        gen = await c.generate([1], max_tokens=8, on_tokens=got.append, key="k")
    assert gen.endpoint == B and [t for ids in got for t in ids] == IDS


@pytest.mark.parametrize("tail", [
    "data: [DONE]\n\n",  # cut mid-generation
    'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n',  # an error chunk
])
async def test_a_failure_after_ids_were_handed_on_is_raised_not_retried(tail: str) -> None:
    calls: list[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.url.host)
        return _sse(_chunk(IDS[:2]), tail)

    got: list[list[int]] = []
    async with _client(handler, endpoints=(A, B)) as c:
        with pytest.raises(InferenceError, match="after streaming 2 tokens"):
            await c.generate([1], max_tokens=8, on_tokens=got.append)
    assert len(calls) == 1 and got == [IDS[:2]]


async def test_an_error_answer_to_a_stream_is_read_like_an_unstreamed_one() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"error": {"message": "bad sampling params", "type": "BadRequestError"}})

    async with _client(handler) as c:
        with pytest.raises(InferenceError, match="HTTP 400: bad sampling params"):
            await c.generate([1], max_tokens=8, on_tokens=lambda ids: None)


async def test_the_completions_fallback_hands_on_the_whole_output() -> None:
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/inference/v1/generate":
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(200, json={"choices": [{"text": "", "token_ids": IDS, "finish_reason": "stop",
                                                      "logprobs": {"token_logprobs": [-0.1] * 4}}]})

    got: list[list[int]] = []
    async with _client(handler) as c:
        gen = await c.generate([1], max_tokens=8, on_tokens=got.append)
    assert got == [IDS] and gen.token_ids == IDS


async def test_a_malformed_streamed_answer_is_an_inference_error_naming_the_stream() -> None:
    bad = [{"version": "3", "start": "zero", "end": 4}]

    def handler(req: httpx.Request) -> httpx.Response:
        return _sse(_chunk(IDS, "stop", bad), "data: [DONE]\n\n")

    async with _client(handler) as c:
        with pytest.raises(InferenceError, match=r"http://a:1 \(streamed\) returned an unexpected body \(ValueError"):
            await c.generate([1], max_tokens=8, on_tokens=lambda ids: None)
