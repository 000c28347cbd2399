"""A chat completion as OpenAI's server-sent events (``stream=true``).

The endpoint samples a turn whole (it must see every id to record the row), then sends it as the chunks a
streaming client expects: the role, the content, each tool call (id, name and arguments), the finish reason,
optionally the usage, then ``[DONE]``. A streamed call records the same row as the same call unstreamed; the
first byte comes when the turn is sampled, not token by token.
"""

from __future__ import annotations

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
