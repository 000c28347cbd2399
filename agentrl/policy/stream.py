"""A chat completion, or a Responses API response, as OpenAI's server-sent events (``stream=true``).

The endpoint samples a turn whole (it must see every id to record the row), then sends it as the chunks a
streaming client expects: the role, the content, each tool call (id, name and arguments), the finish reason,
optionally the usage, then ``[DONE]``. A streamed call records the same row as the same call unstreamed; the
first byte comes when the turn is sampled, not token by token.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any


def _chunk(completion: dict[str, Any], choices: list[dict[str, Any]], **extra: Any) -> str:
    body = {"id": completion["id"], "object": "chat.completion.chunk", "created": completion["created"],
            "model": completion["model"], "choices": choices, **extra}
    return f"data: {json.dumps(body)}\n\n"


def sse_events(completion: dict[str, Any], include_usage: bool = False) -> Iterator[str]:
    """The ``data:`` events of ``completion`` (a ``chat.completion`` object), choice by choice."""
    for choice in completion["choices"]:
        i, message = choice["index"], choice["message"]
        yield _chunk(completion, [{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None}])
        if message.get("content"):
            yield _chunk(completion, [{"index": i, "delta": {"content": message["content"]},
                                       "logprobs": choice.get("logprobs"), "finish_reason": None}])
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
