"""Token-by-token generation: the engine's ``/inference/v1/generate`` answer with ``stream=true``, read chunk by
chunk, each chunk's new ids handed on at once, and the whole assembled into the body of the unstreamed answer
(so it is read by the same :func:`~agentrl.inference.wire.parse_generate` and yields the same ``Generation``:
ids, logprobs, alternatives and weight-version spans)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

from agentrl.inference.wire import InferenceError, TransientError, check_response

OnTokens = Callable[[list[int]], None]
"""Called with each run of newly sampled ids, in order, as the engine sends them."""


class StreamAssembler:
    """Collects the chunks of one tokens-mode stream (its first choice) into an unstreamed answer's body."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.token_ids: list[int] = []
        self.content: list[dict[str, Any]] = []
        self.finish_reason: str | None = None
        self.spans: list[dict[str, Any]] | None = None

    def add(self, data: str) -> list[int]:
        """Read one ``data:`` payload; the ids it adds. An error chunk raises (5xx kinds: ``TransientError``)."""
        try:
            chunk = json.loads(data)
        except ValueError as e:
            raise InferenceError(f"{self.url} streamed a malformed chunk ({e}): {data[:200]}", endpoint=self.url) from e
        if isinstance(chunk, dict) and chunk.get("error"):
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            message = f"{self.url} failed mid-stream: {err.get('message') or err}"
            if int(err.get("code") or 500) >= 500:
                raise TransientError(message)
            raise InferenceError(message, endpoint=self.url)
        new: list[int] = []
        for ch in chunk.get("choices") or []:
            if ch.get("index", 0) != 0:
                continue
            new += [int(t) for t in ch.get("token_ids") or []]
            self.content += (ch.get("logprobs") or {}).get("content") or []
            self.finish_reason = ch.get("finish_reason") or self.finish_reason
            self.spans = ch.get("weight_versions") or self.spans
        self.token_ids += new
        return new

    def body(self) -> dict[str, Any]:
        """The unstreamed answer's body; a stream that ended without a finish reason was cut (retryable)."""
        if self.finish_reason is None:
            raise TransientError(f"{self.url}: the stream ended before the generation finished")
        return {"choices": [{"index": 0, "token_ids": self.token_ids, "logprobs": {"content": self.content},
                             "finish_reason": self.finish_reason, "weight_versions": self.spans}]}


async def sse_data(r: httpx.Response) -> AsyncIterator[str]:
    """The ``data:`` payloads of a server-sent-event stream, in order, up to ``[DONE]``."""
    async for line in r.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield data


async def stream_generate(http: httpx.AsyncClient, url: str, body: dict[str, Any], on_tokens: OnTokens) -> dict[str, Any]:
    """POST ``body`` to ``url`` (a generate route) streamed; ``on_tokens`` gets each chunk's new ids; returns the
    unstreamed answer's body. Transport failures are ``TransientError``s, error answers as ``check_response``."""
    asm = StreamAssembler(url)
    try:
        async with http.stream("POST", url, json={**body, "stream": True}) as r:
            if r.status_code >= 400:
                await r.aread()
                check_response(r, url)
            async for data in sse_data(r):
                new = asm.add(data)
                if new:
                    on_tokens(new)
    except httpx.TransportError as e:
        raise TransientError(f"{type(e).__name__}: {e}", refused=isinstance(e, httpx.ConnectError)) from e
    return asm.body()
