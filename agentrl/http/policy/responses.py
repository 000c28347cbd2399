"""OpenAI's Responses API (``POST /v1/responses``) over the chat-completion path.

The subset the OpenAI Agents SDK's default model uses: ``instructions``, ``input`` as a string or as items
(messages with text parts, ``function_call`` and ``function_call_output``), function tools,
``previous_response_id`` or the whole input replayed, ``max_output_tokens``, ``temperature``, ``top_p``,
``tool_choice`` (``auto``, ``none``, ``required`` or a named function: see
:meth:`agentrl.rollout.chat.ChatFormat.call_opening`), ``parallel_tool_calls``, ``stream``, and the sampled
tokens' logprobs (``include: ["message.output_text.logprobs"]``, ``top_logprobs``). A request becomes one chat
request (:func:`to_chat`): instructions as the first system message, each run of an assistant message and
the ``function_call`` items after it as one assistant message, each ``function_call_output`` as a tool
message. So a call is recorded exactly as the same conversation sent to ``/v1/chat/completions``, and an
agent that replays the items it received extends its row.

What would change the sampled distribution (structured output) or needs OpenAI's hosted
state (``conversation``, stored ``prompt`` templates, ``item_reference``, hosted tools) is refused with an
OpenAI-shaped 400 naming the parameter.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.http.errors import ApiError
from agentrl.http.policy.messages import ChatRequest, content_text, tool_arguments

_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(BaseModel):
    """The body of ``POST /v1/responses`` (the fields agentrl honours or refuses; others are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field("", max_length=256)
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = Field(None, max_length=512)
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_output_tokens: int | None = Field(None, ge=1)
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = Field(None, max_length=128)
    stream: bool | None = None
    text: dict[str, Any] | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    background: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    include: list[str] | None = None
    """Extra output; ``message.output_text.logprobs`` is honoured, other values are ignored."""
    metadata: dict[str, Any] | None = None


def _bad(message: str, param: str) -> ApiError:
    return ApiError(400, message, code="invalid_request_error", param=param)


def _refuse_hosted(req: ResponsesRequest) -> None:
    if req.conversation is not None:
        raise _bad("conversation is not supported: send previous_response_id or the whole input", "conversation")
    if req.prompt is not None:
        raise _bad("prompt (a stored prompt template) is not supported: send instructions and input", "prompt")
    if req.background:
        raise _bad("background responses are not supported", "background")
    fmt = (req.text or {}).get("format")
    kind = fmt.get("type") if isinstance(fmt, dict) else fmt
    if kind not in (None, "text"):
        raise _bad(f"text.format {kind!r} is not supported: structured output needs constrained decoding, which "
                   "samples from another distribution than the policy's", "text.format")


def _text(content: Any, param: str) -> str:
    """The text of a message's or an output's content (Responses part types)."""
    return content_text(content, param, param, _TEXT_PARTS)


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of a request's ``input`` (see the module docstring)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{param} must be an object", param)
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise _bad(f"{param}.role must be system, developer, user or assistant, not {role!r}", param)
            out.append({"role": role, "content": _text(item.get("content"), f"{param}.content")})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise _bad(f"{param}: a function_call needs a string call_id and name", param)
            arguments = item.get("arguments", "")
            if not isinstance(arguments, str):
                raise _bad(f"{param}.arguments must be a JSON string", param)
            tool_arguments(arguments, param, param)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if out and out[-1]["role"] == "assistant":  # the calls of one turn follow its text
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad(f"{param}: a function_call_output needs a string call_id", param)
            out.append({"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{param}.output")})
        else:
            raise _bad(f"{param}: items of type {kind!r} are not supported (messages, function_call and "
                       "function_call_output are; send previous_response_id or replay the items themselves)", param)
    return out


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Responses function tools (``{"type": "function", "name", "parameters", ...}``) as chat tools."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        if kind != "function":
            raise _bad(f"tools[{i}]: only function tools are supported (got {kind!r})", "tools")
        if not isinstance(tool.get("name"), str):
            raise _bad(f"tools[{i}]: a function tool needs a string name", "tools")
        fn = {"name": tool["name"]}
        for key in ("description", "parameters"):
            if tool.get(key) is not None:
                fn[key] = tool[key]
        out.append({"type": "function", "function": fn})
    return out


@dataclass
class _Stored:
    parent: str | None
    messages: list[dict[str, Any]]
    """What this response added to its conversation: its input messages and its answer."""


class ResponseStore:
    """Recent responses of each caller, for ``previous_response_id``: each keeps its parent's id and what it
    added, so a chain costs memory once. The oldest are forgotten first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[tuple[str, str], _Stored] = OrderedDict()

    def conversation(self, owner: str, response_id: str) -> list[dict[str, Any]]:
        """The messages of the conversation that ended with ``response_id`` (instructions excluded)."""
        chain: list[list[dict[str, Any]]] = []
        at: str | None = response_id
        while at is not None:
            stored = self._items.get((owner, at))
            if stored is None:
                raise ApiError(404, f"previous response {at!r} not found (responses are kept for the caller that "
                                    f"made them, the latest {self.capacity})", param="previous_response_id")
            self._items.move_to_end((owner, at))
            chain.append(stored.messages)
            at = stored.parent
        return [m for part in reversed(chain) for m in part]

    def put(self, owner: str, response_id: str, parent: str | None, messages: list[dict[str, Any]]) -> None:
        self._items[(owner, response_id)] = _Stored(parent, messages)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]]) -> tuple[ChatRequest, list[dict[str, Any]]]:
    """The chat request of ``req`` after ``history`` (the previous response's conversation), and the messages
    this request adds to its conversation."""
    _refuse_hosted(req)
    added = input_messages(req.input)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages = system + history + added
    if not messages:
        raise _bad("input is empty", "input")
    chat = ChatRequest(model=req.model, messages=messages, tools=chat_tools(req.tools), tool_choice=req.tool_choice,
                       temperature=req.temperature, top_p=req.top_p, max_completion_tokens=req.max_output_tokens,
                       parallel_tool_calls=req.parallel_tool_calls, logprobs=wants_logprobs(req),
                       top_logprobs=req.top_logprobs if wants_logprobs(req) else None)
    return chat, added


def wants_logprobs(req: ResponsesRequest) -> bool:
    """Whether ``req`` asks for the output text's logprobs."""
    return "message.output_text.logprobs" in (req.include or [])


def output_items(message: dict[str, Any], logprobs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """A chat answer (``choices[0].message``, with its ``logprobs``) as Responses output items: its text as a
    message, then each tool call as a ``function_call``."""
    items: list[dict[str, Any]] = []
    calls = message.get("tool_calls") or []
    if message.get("content") or not calls:
        items.append({"id": f"msg_{uuid.uuid4().hex}", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": message.get("content") or "", "annotations": [],
                                   "logprobs": (logprobs or {}).get("content") or []}]})
    for call in calls:
        items.append({"id": f"fc_{uuid.uuid4().hex}", "type": "function_call", "status": "completed",
                      "call_id": call["id"], "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


def response_object(req: ResponsesRequest, completion: dict[str, Any], response_id: str) -> dict[str, Any]:
    """The ``response`` object of a chat completion answering ``req``."""
    choice = completion["choices"][0]
    usage = completion["usage"]
    incomplete = choice["finish_reason"] == "length"
    return {
        "id": response_id, "object": "response", "created_at": completion.get("created", int(time.time())),
        "status": "incomplete" if incomplete else "completed", "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": completion["model"],
        "output": output_items(choice["message"], choice.get("logprobs")), "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id, "reasoning": None, "store": True,
        "temperature": req.temperature, "text": {"format": {"type": "text"}}, "tool_choice": req.tool_choice or "auto",
        "tools": req.tools or [], "top_p": req.top_p, "truncation": "disabled", "metadata": req.metadata or {},
        "usage": {"input_tokens": usage["prompt_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": usage["completion_tokens"], "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage["total_tokens"]},
    }
