"""OpenAI chat-completion requests: the accepted fields, their checks, and one normal form of a message.

The normal form (:func:`normalize`) is what two calls of an episode are compared by: role, text content,
tool calls as ``(id, name, arguments)`` with the arguments parsed from JSON, ``tool_call_id`` and
``name``. Fields the SDK adds with empty values (``refusal``, ``audio``, ``function_call``, ...) are
ignored, so an agent that sends back the message object it received extends its history.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentrl.http.errors import ApiError

ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatRequest(BaseModel):
    """The body of ``POST /v1/chat/completions`` (the fields agentrl honours or refuses; others are ignored)."""

    model_config = ConfigDict(extra="allow")

    model: str = Field("", max_length=256)
    messages: list[dict[str, Any]] = Field(min_length=1, max_length=10_000)
    tools: list[dict[str, Any]] | None = Field(None, max_length=512)
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int | None = Field(None, ge=1, le=16)
    """Choices to sample (each recorded as its own row)."""
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    seed: int | None = None
    parallel_tool_calls: bool | None = None

    @property
    def stops(self) -> list[str]:
        """The stop sequences, as a list (empty strings dropped)."""
        raw = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return [s for s in raw if s]


def _bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, code="invalid_request_error", param=param)


def check_request(req: ChatRequest) -> None:
    """Refuse, with a clear HTTP 400 naming the parameter, what the endpoint cannot honour without changing
    the sampled policy."""
    if len(req.stops) > 4:
        raise _bad(f"stop takes at most 4 sequences, not {len(req.stops)}", "stop")
    if req.top_logprobs and not req.logprobs:
        raise _bad("top_logprobs needs logprobs=true", "top_logprobs")
    names = []
    for i, tool in enumerate(req.tools or []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _bad(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ..., 'parameters': "
                       "...}}}", "tools")
        names.append(fn["name"])
    forced = forced_call(req.tool_choice)
    if forced is not None and not names:
        raise _bad(f"tool_choice {req.tool_choice!r} needs tools", "tool_choice")
    if forced and forced not in names:
        raise _bad(f"tool_choice names {forced!r}, which is not among the tools ({', '.join(names)})", "tool_choice")
    for i, m in enumerate(req.messages):
        _check_message(i, m)


def forced_call(choice: str | dict[str, Any] | None) -> str | None:
    """What a ``tool_choice`` forces: None (nothing: ``auto``, ``none`` or absent), ``""`` (a call to some tool:
    ``required``) or the name of the function to call (``{"type": "function", "function": {"name": ...}}``,
    or the Responses API's ``{"type": "function", "name": ...}``); anything else is a 400."""
    if choice in (None, "auto", "none"):
        return None
    if choice == "required":
        return ""
    if isinstance(choice, dict) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else choice.get("name")
        if isinstance(name, str) and name:
            return name
    raise _bad(f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'function': {{'name': "
               f"...}}}}, not {choice!r}", "tool_choice")


def content_text(content: Any, where: str, param: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """The text of a message's content: a string, a list of text parts (of the part types ``kinds``) or null;
    anything else is a 400 that names ``where`` in its message and ``param`` as OpenAI's ``error.param``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            kind = p.get("type") if isinstance(p, dict) else type(p).__name__
            if kind not in kinds:
                raise _bad(f"{where}: only text parts are supported (got {kind!r})", param)
            if not isinstance(p.get("text"), str):
                raise _bad(f"{where}: a {kind} part needs a string text", param)
            parts.append(p["text"])
        return "".join(parts)
    raise _bad(f"{where} must be a string, a list of text parts, or null", param)


def _text(i: int, content: Any) -> str:
    return content_text(content, f"messages[{i}].content", "messages")


def _check_message(i: int, m: dict[str, Any]) -> None:
    role = m.get("role")
    if role not in ROLES:
        raise _bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, not {role!r}")
    _text(i, m.get("content"))
    calls = m.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise _bad(f"messages[{i}].tool_calls: only assistant messages carry a list of tool calls")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise _bad(f"messages[{i}].tool_calls[{j}] needs function.name")
            _arguments(i, fn.get("arguments"))
    if role == "tool" and not isinstance(m.get("tool_call_id", ""), str):
        raise _bad(f"messages[{i}].tool_call_id must be a string")


def tool_arguments(raw: Any, where: str, param: str | None = None) -> Any:
    """A tool call's arguments parsed from their JSON text (empty: ``{}``; already parsed: as they are); text
    that is not JSON is a 400 naming ``where`` (and ``param`` as OpenAI's ``error.param``)."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            raise _bad(f"{where}: tool call arguments are not valid JSON: {raw[:200]}", param) from None
    return raw


def _arguments(i: int, raw: Any) -> Any:
    return tool_arguments(raw, f"messages[{i}]")


def normalize(i: int, m: dict[str, Any]) -> dict[str, Any]:
    """One message in the normal form, also the form rendered with the chat template (arguments as
    objects, as vLLM's server gives them to templates)."""
    out: dict[str, Any] = {"role": m["role"], "content": _text(i, m.get("content"))}
    if m.get("tool_calls"):
        out["tool_calls"] = [
            {"id": str(c.get("id") or ""), "type": "function",
             "function": {"name": c["function"]["name"], "arguments": _arguments(i, c["function"].get("arguments"))}}
            for c in m["tool_calls"]]
    for key in ("tool_call_id", "name"):
        if m.get(key):
            out[key] = str(m[key])
    return out


def normalize_all(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every message of a request in the normal form."""
    return [normalize(i, m) for i, m in enumerate(messages)]


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    """A canonical text of the tool schemas (a change of tools starts a new row)."""
    return json.dumps(tools or [], sort_keys=True, separators=(",", ":"))

