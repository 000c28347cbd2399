"""Token-faithful chat formatting: opening prompts, stop tokens, observation deltas and tool-call parsing.

The agent loop never re-renders a whole conversation to get token ids. It renders the opening prompt
once, appends the engine's own output ids after each model turn (the end-of-turn token included), and
appends the *delta* that the chat template adds for new messages (tool results, the next generation
prompt). The delta is taken from the template itself: a dummy conversation is rendered with and
without the new messages, and the delta is what follows the dummy assistant turn's end token. Only the
text *after* that turn is used, so a template that rewrites earlier turns when more messages follow
(Qwen3 drops an empty ``<think></think>`` block from a turn that is no longer the last) still gives the
right delta; ``agentrl.launch.doctor`` reports such templates and what the model sees versus what is trained.

A turn ends on any of :attr:`ChatFormat.stop_token_ids`: the template's end-of-turn token(s) and every
eos id of the model's ``generation_config.json``.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.core.utils.lru import lru_get
from agentrl.rollout.toolcalls import DEFAULT_TOOL_PARSER, ParsedTurn, ToolCallParser

__all__ = ["ChatFormat", "ParsedTurn", "UnusableChatTemplate", "end_of_turn_ids", "generation_eos_ids"]

log = logging.getLogger(__name__)

MARK = "agentrl-turn-marker"
"""Content of the dummy assistant turn: found again in renders to cut the delta after its end token."""
_MAX_CACHED_OPENINGS = 256
"""Opening prompts whose ids :meth:`ChatFormat.prompt_ids` keeps (a few batches of groups)."""
_MAX_CACHED_OBSERVATIONS = 1024
"""Observation deltas whose ids :meth:`ChatFormat.observation_ids` keeps."""
_NAME_MARK = "agentrlmarkerfn"
"""The function name of the dummy call that :meth:`ChatFormat.call_opening` finds again in a render."""
_DUMMY_USER = {"role": "user", "content": "x"}
_DUMMY_ASSISTANT = {"role": "assistant", "content": MARK}


class UnusableChatTemplate(ConfigError, ValueError):
    """The tokenizer or its chat template cannot format turns as agentrl needs: no template, no end-of-turn
    token, a turn whose end cannot be located, or no way to force a tool call."""

    code = "config.unusable_chat_template"
_DUMMY_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "a1b2c3d4e", "type": "function", "function": {"name": "probe", "arguments": {"q": MARK}}}]}


def generation_eos_ids(model_dir: str | Path | None) -> list[int]:
    """The eos ids of a model directory's ``generation_config.json`` (an int or a list there)."""
    if model_dir is None:
        return []
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError) as e:
        log.warning("cannot read %s: %s", path, e)
        return []
    if eos is None:
        return []
    return [int(e) for e in (eos if isinstance(eos, list) else [eos])]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for i, tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(tok, "special", False):
            ids.add(int(i))
    return ids


def end_of_turn_ids(tokenizer: Any, render: Any) -> list[int]:
    """The special token(s) the template closes an assistant turn with: for a plain answer and for a
    tool call, the last non-whitespace token of the turn when it is a special token."""
    special = _special_ids(tokenizer)
    try:
        head = render([_DUMMY_USER], gen=True)
    except Exception:  # a template that cannot render a lone user message: no end token found
        return []
    out: list[int] = []
    for turn in (_DUMMY_ASSISTANT, _DUMMY_CALL):
        try:
            text = render([_DUMMY_USER, turn], gen=False)
        except Exception:  # a template that cannot show this kind of turn
            continue
        if not text.startswith(head):
            continue
        ids = list(tokenizer.encode(text[len(head):], add_special_tokens=False))
        while ids and not tokenizer.decode([ids[-1]]).strip():
            ids.pop()
        if ids and ids[-1] in special and ids[-1] not in out:
            out.append(ids[-1])
    return out


class ChatFormat:
    """Renders prompts and observation deltas with a tokenizer's chat template, knows the tokens that end a
    turn, and parses tool calls with the named vLLM tool parser.

    ``tokenizer`` is a Hugging Face tokenizer with a ``chat_template``; ``tool_parser`` a name of vLLM's
    ``--tool-call-parser``; ``model_dir`` the directory whose ``generation_config.json`` lists the eos ids
    (default: the tokenizer's own directory); ``chat_template`` a template to use instead of the tokenizer's
    own: a built-in name or a Jinja file (:mod:`agentrl.rollout.templates`; it is set on ``tokenizer``).
    """

    def __init__(self, tokenizer: Any, tool_parser: str = DEFAULT_TOOL_PARSER,
                 model_dir: str | Path | None = None, chat_template: str | None = None) -> None:
        from agentrl.rollout.templates import apply

        self.chat_template: str = apply(tokenizer, chat_template)
        """Which template renders the turns: ``own`` (the tokenizer's), a built-in name or a file's path."""
        if not getattr(tokenizer, "chat_template", None):
            raise UnusableChatTemplate("the tokenizer has no chat_template; agentrl needs one to format turns")
        self.tokenizer = tokenizer
        self.tool_parser = tool_parser
        self._parser: ToolCallParser | None = None
        if model_dir is None and Path(str(getattr(tokenizer, "name_or_path", "") or "")).is_dir():
            model_dir = tokenizer.name_or_path
        self.end_of_turn_ids: list[int] = end_of_turn_ids(tokenizer, self._render_msgs)
        """The template's own end-of-turn token(s)."""
        stop = list(self.end_of_turn_ids)
        for i in [*([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []),
                  *generation_eos_ids(model_dir)]:
            if i not in stop:
                stop.append(int(i))
        if not stop:
            raise UnusableChatTemplate("the tokenizer has no eos_token and the chat template closes turns with no "
                                       "special token; agentrl cannot tell when a turn ends")
        self.stop_token_ids: list[int] = stop
        """Every token that ends a turn (sent to the engine as ``stop_token_ids``; kept in the trajectory)."""
        self.eos_token_id: int = stop[0]
        """The main end-of-turn token (the template's, else the tokenizer's eos)."""
        self.eos_text: str = tokenizer.convert_ids_to_tokens(self.eos_token_id)
        self._openings: OrderedDict[str, list[int]] = OrderedDict()
        self._observations: OrderedDict[str, list[int]] = OrderedDict()
        self._call_id_rendered: dict[str, bool] = {}
        self._call_openings: dict[str, str] = {}

    def _render_msgs(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                     gen: bool = False) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=gen
        )

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, gen: bool) -> str:
        return self._render_msgs(messages, tools, gen)

    @property
    def parser(self) -> ToolCallParser:
        """The tool-call parser (built, and vLLM imported, on first use)."""
        if self._parser is None:
            self._parser = ToolCallParser(self.tool_parser, self.tokenizer)
        return self._parser

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParsedTurn:
        """Content and tool calls of one model turn's text (see :mod:`agentrl.rollout.toolcalls`); never raises."""
        return self.parser.parse(text, tools)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with special tokens parsed and none added."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        """Token ids of the opening prompt, ending with the generation prompt.

        The episodes of a GRPO group open on the same messages: the ids of recent openings are kept
        (keyed by the messages and tools as JSON), so a group renders and tokenizes its prompt once.
        """
        key = json.dumps([messages, tools], sort_keys=True, default=str)
        return list(lru_get(self._openings, key, _MAX_CACHED_OPENINGS,
                            lambda: self.encode(self._render(messages, tools, gen=True))))

    def _after_turn(self, rendered: str) -> str:
        """The text after the dummy assistant turn's end-of-turn token in ``rendered``."""
        at = rendered.rfind(MARK)
        if at < 0:
            raise UnusableChatTemplate("the chat template dropped the assistant turn's content; agentrl cannot "
                                       "locate where a turn ends")
        rest = rendered[at + len(MARK):]
        body = rest.lstrip(" ")
        for tid in self.end_of_turn_ids or [self.eos_token_id]:
            end = self.tokenizer.convert_ids_to_tokens(tid)
            if body.startswith(end):
                return body[len(end):]
        raise UnusableChatTemplate(f"the chat template does not close assistant turns with an end-of-turn token "
                                   f"({', '.join(repr(self.tokenizer.convert_ids_to_tokens(t)) for t in self.stop_token_ids)}): "
                                   f"after the turn it renders {rest[:40]!r}")

    def observation_text(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                         ended_with: int | None = None) -> str:
        """Text the template inserts after a finished assistant turn: the rest of that turn's closing, the
        new messages, and the next generation prompt.

        ``ended_with`` is the last token the model sampled. When it is one of the template's end-of-turn
        tokens (or not given) the turn is closed already; otherwise (another eos id of the model, or a turn
        cut by its token budget) the template's end-of-turn token is inserted first, so the context the
        model reads next is the template's.
        """
        base = [_DUMMY_USER, _DUMMY_ASSISTANT]
        full = self._render(base + new_messages, tools, gen=True)
        delta = self._after_turn(full)
        closed = ended_with is None or ended_with in self.end_of_turn_ids or (
            not self.end_of_turn_ids and ended_with == self.eos_token_id)
        if not closed:
            delta = self.eos_text + delta
        return delta

    def observation_ids(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        ended_with: int | None = None) -> list[int]:
        """Token ids to append after an assistant turn (see :meth:`observation_text`).

        Rendering the template is most of the agent loop's own CPU per turn, and the episodes of a group
        often see the same observation (the same call, the same result). Recent deltas are kept, keyed by
        the new messages, the tools and whether the turn was closed; tool-call ids are left out of the key
        when the template does not render them (checked once per tools list by rendering two ids), since
        every call has a fresh id.
        """
        closed = ended_with is None or ended_with in self.end_of_turn_ids or (
            not self.end_of_turn_ids and ended_with == self.eos_token_id)
        tools_key = json.dumps(tools, sort_keys=True, default=str) if tools else ""
        if self._renders_call_ids(tools, tools_key):
            shown = new_messages
        else:
            shown = [{k: v for k, v in m.items() if k != "tool_call_id"} for m in new_messages]
        key = json.dumps([shown, closed], sort_keys=True, default=str) + tools_key
        return list(lru_get(self._observations, key, _MAX_CACHED_OBSERVATIONS,
                            lambda: self.encode(self.observation_text(new_messages, tools, ended_with))))

    def _renders_call_ids(self, tools: list[dict[str, Any]] | None, tools_key: str) -> bool:
        """Whether the template's rendering of a tool message depends on its ``tool_call_id``."""
        known = self._call_id_rendered.get(tools_key)
        if known is None:
            def probe(call_id: str) -> str:
                msg = {"role": "tool", "content": MARK, "tool_call_id": call_id, "name": "probe"}
                return self._render([_DUMMY_USER, _DUMMY_CALL, msg], tools, gen=True)

            try:
                known = probe("a1b2c3d4e") != probe("f5e6d7c8b")
            except Exception:  # a template that cannot render the probe: never leave the id out
                known = True
            self._call_id_rendered[tools_key] = known
        return known

    def call_opening(self, tools: list[dict[str, Any]] | None, name: str | None) -> str:
        """The text this template writes at the start of an assistant turn that calls a tool, up to where the
        model chooses: the function's name (``name`` None: any of ``tools``), or the arguments of the named
        function. It is cut before its last whitespace, so the model writes the rest in its own tokens (for
        Hermes-style templates: ``<tool_call>\\n{"name":`` or ``<tool_call>\\n{"name": "f", "arguments":``).

        A forced ``tool_choice`` appends these ids to the prompt: the model's own distribution then samples
        the rest of the call, so the trainer scores exactly what was sampled (constrained decoding would
        sample from another distribution). Raises ValueError when the template does not render tool calls
        where they can be found.
        """
        key = json.dumps([tools, name], sort_keys=True, default=str)
        known = self._call_openings.get(key)
        if known is not None:
            return known
        call = {"id": "a1b2c3d4e", "type": "function",
                "function": {"name": name or _NAME_MARK, "arguments": {MARK: 1}}}
        gen = self._render([_DUMMY_USER], tools, gen=True)
        full = self._render([_DUMMY_USER, {"role": "assistant", "content": "", "tool_calls": [call]}], tools,
                            gen=False)
        at = full.find(_NAME_MARK if name is None else MARK, len(gen))
        if not full.startswith(gen) or at < 0:
            raise UnusableChatTemplate("this model's chat template does not render an assistant tool call after "
                                       "its generation prompt, so a tool call cannot be forced")
        opening = full[len(gen):at].rstrip(" \t\n\"'{")
        self._call_openings[key] = opening
        return opening

    def ends_turn(self, ids: list[int]) -> bool:
        """Whether model output ``ids`` ends with a stop token (a finished turn, not a cut one)."""
        return bool(ids) and ids[-1] in self.stop_token_ids

    def decode(self, ids: list[int]) -> str:
        """Text of model-generated ids, special tokens kept except the final stop token."""
        if self.ends_turn(ids):
            ids = ids[:-1]
        return self.tokenizer.decode(ids, skip_special_tokens=False)
