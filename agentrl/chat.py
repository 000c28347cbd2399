"""Token-faithful chat formatting: opening prompts, observation deltas and tool-call parsing.

The agent loop never re-renders a whole conversation to get token ids. It renders the opening prompt
once, appends the engine's own output ids after each model turn, and appends the *delta* that the
chat template adds for new messages (tool results, the next generation prompt). The delta is taken
from the template itself by rendering a fixed dummy conversation with and without the new messages,
so it works for any chat template with the prefix property (Qwen2.5, Hermes, Llama 3, ...).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentrl.types import ToolCall

_TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_UNCLOSED_RE = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)

_DUMMY_USER = {"role": "user", "content": "x"}
_DUMMY_ASSISTANT = {"role": "assistant", "content": "y"}


@dataclass
class ParsedTurn:
    """A model turn split into free text and tool calls, with the parse errors found."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def parse_tool_calls(text: str) -> ParsedTurn:
    """Parse Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

    Malformed blocks are reported in ``errors`` (one message per block, written for the model to read)
    instead of raising.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _TOOL_CALL_RE.finditer(text):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos}): {body[:200]}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f'tool call must be a JSON object with a string "name": {body[:200]}')
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                errors.append(f"arguments of {obj['name']} are not valid JSON: {args[:200]}")
                continue
        if not isinstance(args, dict):
            errors.append(f"arguments of {obj['name']} must be a JSON object, got {type(args).__name__}")
            continue
        calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:12]}", name=obj["name"], arguments=args))
    if _UNCLOSED_RE.search(text):
        errors.append("a <tool_call> block was opened but never closed with </tool_call>")
    content = _TOOL_CALL_RE.sub("", text).strip()
    return ParsedTurn(content=content, tool_calls=calls, errors=errors)


class ChatFormat:
    """Renders prompts and observation deltas with a tokenizer's chat template.

    ``tokenizer`` is a Hugging Face tokenizer with a ``chat_template``.
    """

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the tokenizer has no chat_template; agentrl needs one to format turns")
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the tokenizer has no eos_token; set it to the end-of-turn token")
        self.eos_token_id: int = int(eos)
        self.eos_text: str = tokenizer.convert_ids_to_tokens(self.eos_token_id)

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=gen
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens parsed and none added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the opening prompt, ending with the generation prompt."""
        return self.encode(self._render(messages, tools, gen=True))

    def observation_text(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
        """Text the template inserts after a finished assistant turn (which ended with the eos token):
        the rest of that turn's closing, the new messages, and the next generation prompt."""
        base_msgs = [_DUMMY_USER, _DUMMY_ASSISTANT]
        base = self._render(base_msgs, tools, gen=False)
        full = self._render(base_msgs + new_messages, tools, gen=True)
        if not full.startswith(base):
            raise ValueError(
                "the chat template lacks the prefix property (rendering more messages changed earlier "
                "text); token-faithful multi-turn needs a template that only appends"
            )
        end = base.rfind(self.eos_text)
        if end < 0:
            raise ValueError(f"the chat template does not close assistant turns with {self.eos_text!r}")
        closing = base[end + len(self.eos_text) :]
        return closing + full[len(base) :]

    def observation_ids(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids to append after an assistant turn that ended with the eos token."""
        return self.encode(self.observation_text(new_messages, tools))

    def decode(self, ids: list[int]) -> str:
        """Text of model-generated ids, special tokens kept except the final eos."""
        if ids and ids[-1] == self.eos_token_id:
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
