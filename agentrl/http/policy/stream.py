"""A chat completion, or a Responses API response, as OpenAI's server-sent events (``stream=true``).

A chat completion with one choice is streamed token by token (:class:`LiveTurn`): the text is sent as the
engine samples it, except what could still turn out to be a tool call or a stop sequence, which waits for
the end of the turn; tool calls are sent whole (their arguments must parse), then the finish reason,
optionally the usage, then ``[DONE]``. The row is recorded from the whole turn, as for the same call
unstreamed. Other calls (``n > 1``, ``logprobs``, a forced tool call, and the Responses API) are sampled
whole first and then sent as the chunks or events a streaming client expects (:func:`sse_events`,
:func:`response_events`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from agentrl.http.errors import ApiError


def _chunk(completion: dict[str, Any], choices: list[dict[str, Any]], **extra: Any) -> str:
    body = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


def _role(completion: dict[str, Any], i: int) -> str:
    return _chunk(completion, [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                "finish_reason": None}])


def _text(completion: dict[str, Any], i: int, text: str, logprobs: Any = None) -> str:
    return _chunk(completion, [{"index": i, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}])


def sse_events(completion: dict[str, Any], include_usage: bool = False, sent: str | None = None) -> Iterator[str]:
    """The ``data:`` events of ``completion`` (a ``chat.completion`` object), choice by choice. ``sent``: the
    first choice's text already streamed (its role and that text are not sent again)."""
    for choice in completion["choices"]:
        i, message = choice["index"], choice["message"]
        content = message.get("content") or ""
        if sent is None or i > 0:
            yield _role(completion, i)
            if content:
                yield _text(completion, i, content, choice.get("logprobs"))
        elif content.startswith(sent) and content != sent:
            yield _text(completion, i, content[len(sent):])
        for k, call in enumerate(message.get("tool_calls") or []):
            delta = {"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"],
                                                  "arguments": call["function"]["arguments"]}}]}
            yield _chunk(completion, [{"index": i, "delta": delta, "logprobs": None, "finish_reason": None}])
        yield _chunk(completion, [{"index": i, "delta": {}, "logprobs": None,
                                   "finish_reason": choice["finish_reason"]}])
    if include_usage:
        yield _chunk(completion, [], usage=completion["usage"])
    yield "data: [DONE]\n\n"


def _event(kind: str, seq: int, **body: Any) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **body})}\n\n"


def response_events(response: dict[str, Any]) -> Iterator[str]:
    """The events of a Responses API ``response`` (``stream=true``): created, each output item added with its
    text or arguments as one delta and done, then completed (or incomplete)."""
    seq = itertools.count()
    opening = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield _event("response.created", next(seq), response=opening)
    yield _event("response.in_progress", next(seq), response=opening)
    for k, item in enumerate(response["output"]):
        head = {"output_index": k, "item_id": item["id"]}
        if item["type"] == "message":
            yield _event("response.output_item.added", next(seq), output_index=k,
                         item={**item, "status": "in_progress", "content": []})
            for c, part in enumerate(item["content"]):
                empty = {**part, "text": ""}
                yield _event("response.content_part.added", next(seq), **head, content_index=c, part=empty)
                yield _event("response.output_text.delta", next(seq), **head, content_index=c, delta=part["text"],
                             logprobs=[])
                yield _event("response.output_text.done", next(seq), **head, content_index=c, text=part["text"],
                             logprobs=[])
                yield _event("response.content_part.done", next(seq), **head, content_index=c, part=part)
        else:
            yield _event("response.output_item.added", next(seq), output_index=k,
                         item={**item, "status": "in_progress", "arguments": ""})
            yield _event("response.function_call_arguments.delta", next(seq), **head, delta=item["arguments"])
            yield _event("response.function_call_arguments.done", next(seq), **head, name=item["name"],
                         arguments=item["arguments"])
        yield _event("response.output_item.done", next(seq), output_index=k, item=item)
    done = "response.completed" if response["status"] == "completed" else "response.incomplete"
    yield _event(done, next(seq), response=response)


class DeltaText:
    """The part of a turn's text that can be sent before the turn ends: not past where a tool call or a stop
    sequence (``markers``) starts or could start, not the leading or trailing whitespace the final answer
    strips, not a character whose bytes are still incomplete. What is sent is always a prefix of the final
    answer's text."""

    def __init__(self, markers: list[str]) -> None:
        self.markers = [m for m in markers if m]
        self.sent = ""
        self.frozen = False
        """A marker appeared: nothing more is sent before the turn ends."""

    def update(self, text: str) -> str:
        """The turn's text so far; returns what can be sent now that was not sent yet."""
        if self.frozen:
            return ""
        t = text.lstrip().rstrip("\ufffd")
        cut = len(t)
        for m in self.markers:
            if (at := t.find(m)) >= 0:
                cut, self.frozen = min(cut, at), True
            for k in range(min(len(m) - 1, len(t)), 0, -1):  # the text may end inside a marker
                if t.endswith(m[:k]):
                    cut = min(cut, len(t) - k)
                    break
        safe = t[:cut].rstrip()
        if not safe.startswith(self.sent):  # decoding moved an earlier character: stop sending early
            self.frozen = True
            return ""
        delta, self.sent = safe[len(self.sent):], max(safe, self.sent, key=len)
        return delta


class LiveTurn:
    """One chat completion streamed as it is sampled (see the module docstring): :meth:`push` is the
    generation's ``on_tokens``; :meth:`events` the server-sent events."""

    def __init__(self, decode: Callable[[list[int]], str], markers: list[str], model: str) -> None:
        self.decode = decode
        self.text = DeltaText(markers)
        self.ids: list[int] = []
        self.queue: asyncio.Queue[list[int]] = asyncio.Queue()
        self.head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": model}

    def push(self, ids: list[int]) -> None:
        self.queue.put_nowait(ids)

    async def _next(self, task: asyncio.Future[Any]) -> list[int] | None:
        """The next ids, or None once ``task`` (the completion) is done and every id has been read."""
        while self.queue.empty():
            if task.done():
                return None
            getter = asyncio.ensure_future(self.queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if getter.done():
                return getter.result()
            getter.cancel()
        return self.queue.get_nowait()

    async def opened(self, task: asyncio.Future[Any]) -> None:
        """Wait for the first sampled ids or the end of ``task``; the task's error (a bad request, the engine
        down) is raised here, before any byte is sent, so it is answered with its own HTTP status."""
        ids = await self._next(task)
        if ids is None:
            task.result()
        else:
            self.ids += ids

    async def events(self, task: asyncio.Future[Any], include_usage: bool) -> AsyncIterator[str]:
        """The events: the role, the text as it is sampled, then the rest of the completion ``task`` gives."""
        yield _role(self.head, 0)
        while True:
            if delta := self.text.update(self.decode(self.ids)):
                yield _text(self.head, 0, delta)
            ids = await self._next(task)
            if ids is None:
                break
            self.ids += ids
        try:
            completion = {**task.result(), **self.head}
        except ApiError as e:  # the call failed after its first tokens were sent
            error = {"message": e.message, "type": e.code, "code": e.code, "param": e.param}
            yield f"data: {json.dumps({'error': error})}\n\n"
            yield "data: [DONE]\n\n"
            return
        for event in sse_events(completion, include_usage, sent=self.text.sent):
            yield event
