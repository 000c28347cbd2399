"""Tool-call parsing through vLLM's own tool-parser registry, with agentrl's checks on top.

A model family writes tool calls in its own format (Hermes ``<tool_call>{...}</tool_call>``, Llama 3.1
JSON, Mistral ``[TOOL_CALLS]``, Qwen3-Coder XML, pythonic ``[f(x=1)]``, ...). vLLM ships a parser for
each, chosen by name (the names of ``vllm serve --tool-call-parser``). agentrl runs the named parser on
the decoded text of the sampled tokens (the tokens themselves stay in the trajectory untouched), then
checks what it found: a call needs a string name and arguments that are a JSON object. Whatever the
parser cannot read but looks like a started tool call becomes an error message the model reads in its
next observation; parsing never raises.

vLLM is imported only when a parser is built, never at module import time.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.core.types import ToolCall
from agentrl.core.utils.lru import lru_get

DEFAULT_TOOL_PARSER = "hermes"
"""The parser of the embedded tiny model (and of Qwen2.5 / Hermes-style templates)."""

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_HERMES_UNCLOSED = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)
_START_ATTRS = ("tool_call_start_token", "bot_token", "tool_calls_start_token", "tool_call_prefix")
_START_MARKERS = {"qwen3_coder": "<tool_call>", "qwen3_xml": "<tool_call>", "llama3_json": "<|python_tag|>",
                  "llama4_json": "<|python_tag|>", "mistral": "[TOOL_CALLS]"}
"""Where a parser object does not expose the text that opens a call: the marker of its format."""
_MAX_CACHED_REQUESTS = 64


@dataclass
class ParsedTurn:
    """A model turn split into free text and tool calls, with the parse errors found."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class ToolParserError(ConfigError, ValueError):
    """The tool parser named (``--tool-parser``) is not one of vLLM's, or cannot be used with the tokenizer."""

    code = "config.tool_parser"


class ToolParsersMissing(ConfigError, RuntimeError):
    """vLLM, whose tool parsers read the model's tool calls, is not installed here."""

    code = "config.tool_parser.no_vllm"


def new_call_id() -> str:
    """A fresh tool-call id: 9 alphanumeric characters, the one form every tested template accepts
    (Mistral's refuses any other)."""
    return uuid.uuid4().hex[:9]


def tool_parser_names() -> list[str]:
    """Names of the tool parsers vLLM registers (what ``--tool-parser`` accepts)."""
    try:
        from vllm.tool_parsers import ToolParserManager
    except ImportError as e:
        raise ToolParsersMissing("tool calls are parsed by vLLM's tool parsers, and vLLM is not installed here: "
                                 "install agentrl with its inference stack (the cpu or gpu extra)") from e

    return ToolParserManager.list_registered()


def check_tool_parser_name(name: str) -> None:
    """Raise :class:`ToolParserError` (a ``ValueError``) naming the valid parsers when ``name`` is not one of
    them."""
    names = tool_parser_names()
    if name not in names:
        raise ToolParserError(f"unknown tool parser {name!r} (--tool-parser / tool_parser); vLLM's parsers are: "
                              f"{', '.join(names)}")


def _hermes_problems(text: str) -> list[str]:
    """Why Hermes-style ``<tool_call>`` blocks in ``text`` cannot be read, one message per bad block."""
    errors: list[str] = []
    for match in _HERMES_BLOCK.finditer(text):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos}): {body[:200]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f'tool call must be a JSON object with a string "name": {body[:200]}')
        elif "arguments" not in obj:
            errors.append(f'tool call {obj["name"]} has no "arguments" (write "arguments": {{}} for none)')
    if _HERMES_UNCLOSED.search(text):
        errors.append("a <tool_call> block was opened but never closed with </tool_call>")
    return errors


def parse_hermes(text: str) -> ParsedTurn:
    """Hermes-style ``<tool_call>`` JSON blocks read without vLLM: the content before the first block and one
    call per block, or the blocks' errors (as :class:`ToolCallParser` reports them). For text agentrl writes
    itself (scripted policies), where importing vLLM's parsers would cost more than the whole evaluation."""
    if "<tool_call>" not in text:
        return ParsedTurn(content=text.strip())
    content = text[: text.index("<tool_call>")].strip()
    errors = _hermes_problems(text)
    if errors:
        return ParsedTurn(content=content, errors=errors)
    calls: list[ToolCall] = []
    for match in _HERMES_BLOCK.finditer(text):
        obj = json.loads(match.group(1).strip())
        args, err = _arguments(obj["name"], json.dumps(obj["arguments"]))  # as vLLM passes them on
        if err is not None:
            errors.append(err)
        else:
            calls.append(ToolCall(id=new_call_id(), name=obj["name"], arguments=args or {}))
    return ParsedTurn(content=content, tool_calls=calls, errors=errors)


def _arguments(name: str, raw: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The arguments of a parsed call as a dict, or the error to report."""
    args = raw
    for _ in range(2):  # a JSON string, possibly holding a JSON-encoded object
        if not isinstance(args, str):
            break
        if not args.strip():
            return {}, None
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None, f"arguments of {name} are not valid JSON: {str(raw)[:200]}"
    if args is None:
        return {}, None
    if not isinstance(args, dict):
        return None, f"arguments of {name} must be a JSON object, got {type(args).__name__}"
    return args, None


class ToolCallParser:
    """One of vLLM's tool parsers, by name, for one tokenizer.

    ``parse`` is what vLLM's OpenAI server does for a non-streamed chat completion (``extract_tool_calls``
    on the whole output text), plus agentrl's checks and error messages.
    """

    def __init__(self, name: str, tokenizer: Any) -> None:
        check_tool_parser_name(name)
        from vllm.tool_parsers import ToolParserManager

        cls = ToolParserManager.get_tool_parser(name)
        # agentrl reports unreadable calls to the model itself; the parser's own tracebacks are noise.
        logging.getLogger(cls.__module__).setLevel(logging.CRITICAL)
        self.name = name
        self._cls = cls
        self._tokenizer = tokenizer
        try:
            self._default = cls(tokenizer, None)
        except Exception as e:
            raise ToolParserError(f"the {name!r} tool parser cannot be used with this tokenizer: {e}") from e
        self.start_marker: str | None = next(
            (v for a in _START_ATTRS if isinstance(v := getattr(self._default, a, None), str) and v),
            _START_MARKERS.get(name))
        """The text that opens a tool call in this format (None where the format has no fixed marker)."""
        self._json_blocks = self.start_marker == "<tool_call>" and getattr(cls, "tool_call_end_token", "") == "</tool_call>"
        self._requests: OrderedDict[str, Any] = OrderedDict()

    def _request(self, tools: list[dict[str, Any]] | None) -> Any:
        """The request the parser reads ``tools`` from. Building it (pydantic validation of vLLM's request
        model) cost more than the parse itself, so one is kept per distinct tools list (an episode's tools
        do not change between turns)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        key = json.dumps(tools, sort_keys=True, default=str) if tools else ""
        return lru_get(self._requests, key, _MAX_CACHED_REQUESTS,
                       lambda: ChatCompletionRequest(model="agentrl", messages=[], tools=tools or None))

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        """Split ``text`` (one model turn, end token removed) into content and tool calls; never raises."""
        try:
            parser = self._cls(self._tokenizer, tools) if tools else self._default
            info = parser.extract_tool_calls(text, self._request(tools))
        except Exception as e:
            return self._unread(text, f"{type(e).__name__}: {e}")
        if not info.tools_called:
            return self._unread(text, None)
        calls: list[ToolCall] = []
        errors: list[str] = []
        for tc in info.tool_calls:
            name = tc.function.name
            if not isinstance(name, str) or not name:
                errors.append(f"a tool call has no function name: {str(tc.function.arguments)[:200]}")
                continue
            args, err = _arguments(name, tc.function.arguments)
            if err is not None:
                errors.append(err)
                continue
            calls.append(ToolCall(id=new_call_id(), name=name, arguments=args or {}))
        return ParsedTurn(content=(info.content or "").strip(), tool_calls=calls, errors=errors)

    def _unread(self, text: str, why: str | None) -> ParsedTurn:
        """The parser found no call: plain content, or errors when a call was started but not readable."""
        marker = self.start_marker
        if marker is None or marker not in text:
            return ParsedTurn(content=text.strip())
        errors = _hermes_problems(text) if self._json_blocks else []
        if not errors:
            start = text.index(marker)
            errors = [f"a tool call was started ({marker}) but the {self.name} format could not read it"
                      + (f" ({why[:200]})" if why else "") + f": {text[start:start + 200]}"]
        return ParsedTurn(content=text[: text.index(marker)].strip(), errors=errors)
