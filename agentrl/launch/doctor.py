"""``agentrl doctor``: check that a model directory works with the agent loop before a run.

The checks render one small tool-using conversation with the model's own chat template (or the one
``--chat-template`` names: a built-in such as ``hermes``, or a file) and replay it the way the agent loop does
(prompt ids, sampled ids up to the end-of-turn token, observation delta):

- ``renders_tools``: the template shows the tools, an assistant's tool call and a tool result. Many chat
  models' templates show none of them (SmolLM2, Gemma, Phi-3, the DeepSeek-R1 distills); the problem then
  names the built-in template that fits the tokenizer's special tokens (``suggested_chat_template``).

- ``chat_template_appends_only``: rendering a growing conversation (system, user, assistant tool call,
  tool result, final answer) only ever appends text. Qwen3-style thinking templates do not: a turn's empty
  ``<think></think>`` block is dropped once the turn is no longer the last. agentrl handles such templates:
  it never re-renders, so the model sees and is trained on exactly the tokens it sampled (its own think
  blocks included); only a chat server that re-renders the same history would show the model other text.
  What must hold is the next check.
- ``observation_delta_ok``: the ids the loop appends after a tool-call turn (tool results and the next
  generation prompt) are the ids the template renders after that turn; for an appends-only template the
  whole replayed sequence must equal the tokenized full render.
- ``roundtrip_ok``: a tool call rendered the way the template shows assistant tool calls is parsed back by
  the chosen ``tool_parser`` into the same name and arguments.
- ``stop_token_ids``: every token that ends a turn (template end-of-turn tokens, generation_config eos).
- ``moe``: read from the model's ``config.json`` (no weights loaded, no engine started): null for a dense
  model; for a mixture-of-experts model its experts, top-k, family and whether routing capture (what routing
  replay needs) works on the engine this machine would run, and how (``capture_path``). A MoE family whose
  router agentrl cannot replay is a problem (:class:`agentrl.moe.families.UnsupportedMoE`).

``problems`` lists, in plain words, what fails and the fix; ``agentrl train`` refuses a model with problems.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from agentrl.core.errors import ConfigError

PROBE_TOOLS = [{"type": "function", "function": {
    "name": "lookup", "description": "Look a word up in the dictionary.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "The word."}},
                   "required": ["word"]}}}]
PROBE_ARGS = {"word": "apple"}
TOP_K_FIELDS = ("num_experts_per_tok", "moe_top_k", "num_experts_per_token", "top_k")
"""Config fields that may hold an MoE model's top-k (read only to describe a family agentrl refuses)."""
VLLM_NATIVE = "vllm-native"
"""``capture_path``: vLLM returns ``routed_experts`` itself (``enable_return_routed_experts``)."""
WORKER_CAPTURE = "agentrl-worker-capture"
"""``capture_path``: agentrl's worker extension taps every ``FusedMoE`` router (:mod:`agentrl.engine.capture`)."""
CANDIDATE_PARSERS = ["hermes", "llama3_json", "mistral", "qwen3_coder", "pythonic", "llama4_pythonic"]
"""Parsers tried when the chosen one cannot read the template's tool calls, to suggest a fix."""


class TemplateProbeError(ConfigError, ValueError):
    """The chat template renders the probe's tool-call turn so that agentrl cannot tell where a sampled turn
    starts (the generation prompt) or ends (a stop token)."""

    code = "config.chat_template.probe"


class DoctorCheckFailed(ConfigError, ValueError):
    """The model fails ``agentrl doctor``'s checks; the message lists the problems."""

    code = "config.doctor_check"


def probe_conversation() -> list[dict[str, Any]]:
    """The conversation the checks render: system, user, a tool call, its result, a final answer."""
    call = {"id": "a1b2c3d4e", "type": "function", "function": {"name": "lookup", "arguments": dict(PROBE_ARGS)}}
    return [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is an apple?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "lookup", "content": "a round fruit"},
        {"role": "assistant", "content": "An apple is a round fruit."},
    ]


class DoctorReport(BaseModel):
    """What ``agentrl doctor`` found for one model directory and tool parser."""

    model: str
    """The model directory checked."""
    tool_parser: str
    """The tool parser chosen (``--tool-parser``)."""
    chat_template: str = "own"
    """The template checked: ``own`` (the model's), a built-in name or a file (``--chat-template``)."""
    renders_tools: bool = False
    """The template shows the tools, an assistant's tool calls and tool results (a template that renders none
    of them leaves the model blind to its tools: see ``suggested_chat_template``)."""
    suggested_chat_template: str | None = None
    """When the template cannot show tools: the built-in template that fits the tokenizer's special tokens."""
    stop_token_ids: list[int] = Field(default_factory=list)
    """Tokens that end a turn: the template's end-of-turn token(s), then the generation_config eos ids."""
    stop_tokens: list[str] = Field(default_factory=list)
    """The same tokens as text."""
    chat_template_appends_only: bool = False
    """Rendering a growing conversation only appends text (no earlier turn is rewritten)."""
    history_rewrite: str | None = None
    """Where a longer render changed earlier text (when the template does not only append)."""
    thinking: bool = False
    """The template renders ``<think>`` blocks in assistant turns."""
    roundtrip_ok: bool = False
    """A tool call rendered by the template is parsed back into the same name and arguments."""
    parsers_that_read_the_template: list[str] = Field(default_factory=list)
    """Parsers (of a few common ones) that read the template's tool call back, when the chosen one does not."""
    observation_delta_ok: bool = False
    """The loop's observation ids equal what the template renders after a tool-call turn."""
    problems: list[str] = Field(default_factory=list)
    """What fails, in plain words, with the fix. Empty: the model can be trained."""
    notes: list[str] = Field(default_factory=list)
    """What is handled but worth knowing."""
    moe: dict[str, Any] | None = None
    """Null for a dense model (or no readable ``config.json``); for a mixture-of-experts model
    ``{"experts", "top_k", "family", "routing_capture", "capture_path"}``; for a MoE family agentrl cannot
    replay ``{"experts", "top_k", "family", "routing_capture": false, "error"}`` (and a problem)."""

    @property
    def ok(self) -> bool:
        """No problems."""
        return not self.problems

    def text(self) -> str:
        """A human-readable report."""
        yes = {True: "yes", False: "NO"}
        stops = ", ".join(f"{t} ({i})" for t, i in zip(self.stop_tokens, self.stop_token_ids, strict=True))
        lines = [f"model:                      {self.model}",
                 f"tool_parser:                {self.tool_parser}",
                 f"chat template:              {self.chat_template}",
                 f"renders tools and calls:    {yes[self.renders_tools]}",
                 f"stop tokens:                {stops}",
                 f"chat template appends only: {yes[self.chat_template_appends_only]}",
                 f"thinking template:          {'yes' if self.thinking else 'no'}",
                 f"tool-call round trip:       {yes[self.roundtrip_ok]}",
                 f"observation delta:          {yes[self.observation_delta_ok]}"]
        if self.moe is not None:
            m = self.moe
            capture = (f"yes ({m.get('capture_path')})" if m.get("routing_capture")
                       else "NO (see the problem below)" if m.get("error") else "NO")
            lines += [f"MoE model:                  {m.get('family')}, {m.get('experts')} experts, "
                      f"top-{m.get('top_k')}",
                      f"MoE routing capture:        {capture}"]
        lines += [f"note: {n}" for n in self.notes]
        lines += [f"problem: {p}" for p in self.problems]
        lines.append("ok: the model can be trained" if self.ok else "not ok: fix the problems above")
        return "\n".join(lines)


def _first_difference(a: str, b: str) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _appends_only(chat: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str | None:
    """None when every longer render starts with the shorter one; else where it first does not. The
    smallest render is the opening prompt (system and user: some templates cannot render less)."""
    for k in range(2, len(msgs)):
        nxt = chat._render(msgs[: k + 1], tools, gen=False)
        for gen in (False, True):
            if gen and msgs[k]["role"] != "assistant":
                continue
            cur = chat._render(msgs[:k], tools, gen=gen)
            if not nxt.startswith(cur):
                i = _first_difference(cur, nxt)
                return (f"adding message {k + 1} ({msgs[k]['role']}) changed the text rendered before it at "
                        f"char {i}: {cur[i:i + 40]!r} became {nxt[i:i + 40]!r}")
    return None


def _sampled_turn(chat: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[int]:
    """Ids of the assistant tool-call turn (message 3) as the model would sample it: what the template
    renders after the user message and the generation prompt, through the first stop token. (Located after
    the user's text, since some templates move the system prompt once an assistant turn follows.)"""
    user = msgs[1]["content"]
    head = chat._render(msgs[:2], tools, gen=True)
    full = chat._render(msgs[:3], tools, gen=False)
    gen_prompt = head[head.rfind(user) + len(user):]
    at = full.rfind(user) + len(user)
    if not full[at:].startswith(gen_prompt):
        raise TemplateProbeError(f"the generation prompt is not how the template starts an assistant turn: it ends "
                         f"{gen_prompt[-40:]!r}, an assistant turn starts {full[at:at + 40]!r}")
    ids = chat.encode(full[at + len(gen_prompt):])
    for j, t in enumerate(ids):
        if t in chat.stop_token_ids:
            return ids[: j + 1]
    raise TemplateProbeError("the assistant turn holding a tool call ends with none of the stop tokens "
                     f"{chat.stop_token_ids}")


def _calls_match(parsed: Any) -> bool:
    return (not parsed.errors and len(parsed.tool_calls) == 1 and parsed.tool_calls[0].name == "lookup"
            and parsed.tool_calls[0].arguments == PROBE_ARGS)


NO_TOOLS, NO_CALL, NO_RESULT = "the tools", "the assistant's tool call", "the tool result"


def _blind_to_tools(chat: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[str]:
    """What the template leaves out of a tool-using conversation (empty: it shows the tools, the call and the
    result): the tools when the prompt renders the same with and without them, the call when the assistant
    turn renders no trace of its function name or arguments, the result when the tool turn's content is lost."""
    missing = []
    if chat._render(msgs[:2], tools, gen=True) == chat._render(msgs[:2], None, gen=True):
        missing.append(NO_TOOLS)
    rendered = chat._render(msgs[:3], tools, gen=False)
    question = msgs[1]["content"]
    call_turn = rendered[rendered.rfind(question) + len(question):]  # not the tool list, not the question
    if "lookup" not in call_turn or PROBE_ARGS["word"] not in call_turn:
        missing.append(NO_CALL)
    if msgs[3]["content"] not in chat._render(msgs[:4], tools, gen=True):
        missing.append(NO_RESULT)
    return missing


def diagnose(model: str | Path, tool_parser: str = "hermes", chat_template: str | None = None) -> DoctorReport:
    """Run every check on ``model`` (a directory with a tokenizer and chat template) with ``tool_parser``, and
    the template ``chat_template`` names instead of the model's own (a built-in name or a file)."""
    from agentrl.rollout.chat import ChatFormat, UnusableChatTemplate
    from agentrl.rollout.templates import UnknownChatTemplate

    report = DoctorReport(model=str(model), tool_parser=tool_parser, chat_template=chat_template or "own")
    problems = report.problems
    _check_moe(model, report)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(model))
    except Exception as e:
        problems.append(f"cannot load a tokenizer from {model}: {type(e).__name__}: {str(e)[:300]}")
        return report
    try:
        chat = ChatFormat(tokenizer, tool_parser=tool_parser, model_dir=model, chat_template=chat_template)
    except UnknownChatTemplate as e:
        problems.append(str(e))
        return report
    except UnusableChatTemplate as e:
        problems.append(f"{e} (fix the tokenizer files of {model}, or use --chat-template)")
        return report
    report.chat_template = chat.chat_template
    report.stop_token_ids = list(chat.stop_token_ids)
    report.stop_tokens = [tokenizer.convert_ids_to_tokens(i) for i in chat.stop_token_ids]
    if not chat.end_of_turn_ids:
        problems.append("the chat template closes assistant turns with no special token, so agentrl cannot tell "
                        "where a turn ends; use a template that ends each turn with an end-of-turn token")
    tools = PROBE_TOOLS
    msgs = probe_conversation()
    try:
        rewrite = _appends_only(chat, msgs, tools)
    except Exception as e:
        problems.append(f"the chat template cannot render a tool-using conversation (system, user, assistant "
                        f"tool call, tool result, answer): {type(e).__name__}: {str(e)[:300]}")
        return report
    report.chat_template_appends_only = rewrite is None
    report.history_rewrite = rewrite
    if not _check_renders_tools(chat, tokenizer, msgs, tools, report):
        return report  # nothing to parse back or replay
    try:
        turn = _sampled_turn(chat, msgs, tools)
    except TemplateProbeError as e:
        problems.append(str(e))
        return report
    turn_text = chat.decode(turn)
    report.thinking = "<think>" in turn_text or "<think>" in chat._render(msgs[:2], tools, gen=True)
    _check_roundtrip(chat, tokenizer, tool_parser, turn_text, tools, report)
    _check_observation_delta(chat, msgs, tools, turn, rewrite, report)
    _note_handled(model, chat, tokenizer, rewrite, report)
    return report


def _check_renders_tools(chat: Any, tokenizer: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]],
                         report: DoctorReport) -> bool:
    """Fill ``report.renders_tools`` (and ``suggested_chat_template``, with a problem, when the template leaves
    something out); whether it renders the tool call, so that there is something to parse back and replay."""
    from agentrl.rollout.templates import fitting_builtins

    blind = _blind_to_tools(chat, msgs, tools)
    report.renders_tools = not blind
    if blind:
        fits = fitting_builtins(tokenizer)
        report.suggested_chat_template = fits[0] if fits else None
        fix = (f"use --chat-template {fits[0]} (chat_template = {json.dumps(fits[0])}), a built-in template that "
               "fits this tokenizer's special tokens" if fits else
               "write a template that shows them and pass it as --chat-template FILE (docs/models.md)")
        report.problems.append(f"the chat template ({report.chat_template}) renders no trace of {', '.join(blind)}: "
                               f"the model could not see its tools or be trained on its calls; {fix}")
        if NO_CALL in blind:
            return False
    return True


def _check_roundtrip(chat: Any, tokenizer: Any, tool_parser: str, turn_text: str, tools: list[dict[str, Any]],
                     report: DoctorReport) -> None:
    """Round trip of the sampled turn ``turn_text`` through the chosen ``tool_parser``: fill
    ``report.roundtrip_ok``, and when it fails, the parsers that do read the template's tool call and a problem
    naming the fix."""
    from agentrl.rollout.toolcalls import ToolCallParser, ToolParserError, tool_parser_names

    if tool_parser not in tool_parser_names():
        report.problems.append(f"unknown tool parser {tool_parser!r}: use --tool-parser with one of vLLM's parsers "
                               f"(e.g. {', '.join(CANDIDATE_PARSERS)})")
        return
    try:
        parsed = chat.parse(turn_text, tools)
        report.roundtrip_ok = _calls_match(parsed)
        why = f"it read {[(c.name, c.arguments) for c in parsed.tool_calls]}, errors {parsed.errors}"
    except ToolParserError as e:  # the parser cannot be used with this tokenizer
        why = str(e)
    if report.roundtrip_ok:
        return
    for name in CANDIDATE_PARSERS:
        try:
            if name != tool_parser and _calls_match(ToolCallParser(name, tokenizer).parse(turn_text, tools)):
                report.parsers_that_read_the_template.append(name)
        except ToolParserError:
            continue
    fix = (f"use --tool-parser {report.parsers_that_read_the_template[0]} (tool_parser = "
           f"{json.dumps(report.parsers_that_read_the_template[0])})"
           if report.parsers_that_read_the_template else "choose the --tool-parser of this model family "
           "(see docs/models.md)")
    report.problems.append(f"the {tool_parser} tool parser does not read back the tool call this chat template "
                           f"renders ({turn_text[:120]!r}; {why[:200]}): {fix}")


def _check_observation_delta(chat: Any, msgs: list[dict[str, Any]], tools: list[dict[str, Any]],
                             turn: list[int], rewrite: str | None, report: DoctorReport) -> None:
    """The observation delta, replayed as the loop does it after the sampled tool-call ``turn``: fill
    ``report.observation_delta_ok`` (for an appends-only template, ``rewrite`` None, the whole replayed
    sequence must also equal the tokenized full render), with a problem when it fails."""
    from agentrl.rollout.chat import UnusableChatTemplate

    problems = report.problems
    try:
        obs = chat.observation_ids([msgs[3]], tools, ended_with=turn[-1])
        expected_text = chat._render(msgs[:4], tools, gen=True)
        loop_ids = chat.prompt_ids(msgs[:2], tools) + turn + obs
        end_text = chat.tokenizer.convert_ids_to_tokens(turn[-1])
        # the template's text after the tool-call turn: after the end token that follows the call's argument
        # (the argument's last occurrence, written however the template writes values: JSON, XML, key='value')
        after = expected_text.find(end_text, expected_text.rfind(PROBE_ARGS["word"]))
        tail = expected_text[after + len(end_text):] if after >= 0 else None
        delta_ok = tail is not None and chat.encode(tail) == obs
        if rewrite is None:
            delta_ok = delta_ok and loop_ids == chat.encode(expected_text)
        report.observation_delta_ok = delta_ok
        if not delta_ok:
            problems.append(f"the observation delta agentrl computes ({chat.observation_text([msgs[3]], tools)[:120]!r}) "
                            f"is not what the template renders after a tool-call turn ({(tail or '')[:120]!r}); "
                            "this chat template cannot be used for token-faithful multi-turn rollouts")
    except UnusableChatTemplate as e:
        problems.append(f"{e}; this chat template cannot be used for token-faithful multi-turn rollouts")
    except Exception as e:  # a template that refuses the dummy conversation the delta is computed from
        problems.append(f"the chat template cannot render a tool result after a plain assistant turn, which is how "
                        f"agentrl computes the observation delta ({type(e).__name__}: {str(e)[:200]}); templates "
                        "that write tool results inside the calling turn are not supported yet")


def _note_handled(model: str | Path, chat: Any, tokenizer: Any, rewrite: str | None, report: DoctorReport) -> None:
    """Notes on what is handled: a template that rewrites history (``rewrite``) while the observation delta
    holds, and end-of-turn tokens that ``generation_config.json`` does not list as eos."""
    if rewrite is not None and report.observation_delta_ok:
        report.notes.append(f"the chat template rewrites history ({rewrite}). Handled: the agent loop renders the "
                            "opening prompt once and then only appends token ids, so the model sees, and is trained "
                            "on, that prompt and exactly the tokens it sampled"
                            + (" (its <think> blocks included)" if report.thinking else "")
                            + "; a chat server re-rendering this history would show the model different text")
    missing = [t for t in chat.end_of_turn_ids if t not in _gen_eos(model)]
    if missing and (Path(model) / "generation_config.json").is_file():
        report.notes.append(f"generation_config.json does not list the template's end-of-turn token(s) "
                            f"{[tokenizer.convert_ids_to_tokens(t) for t in missing]} as eos; agentrl stops on them "
                            "anyway")


def routing_capture_path() -> str | None:
    """How the engine this machine would run captures MoE routing: :data:`VLLM_NATIVE` on a GPU build of
    vLLM whose runner can return routed experts (``enable_return_routed_experts``, which needs Triton),
    else :data:`WORKER_CAPTURE`; None when vLLM is not installed. Nothing is imported from vLLM."""
    import importlib.util

    from agentrl.config.facts import cpu_build

    spec = importlib.util.find_spec("vllm")
    if spec is None:
        return None
    if importlib.util.find_spec("triton") is not None and not cpu_build():
        for root in spec.submodule_search_locations or []:
            args = Path(root) / "engine" / "arg_utils.py"
            if args.is_file() and "enable_return_routed_experts" in args.read_text(errors="replace"):
                return VLLM_NATIVE
    return WORKER_CAPTURE


def _config_int(config: dict[str, Any], fields: tuple[str, ...]) -> int | None:
    """The largest positive int among ``fields`` of ``config`` or of its sub-configs (one level deep)."""
    found = [v for c in [config, *(v for v in config.values() if isinstance(v, dict))] for f in fields
             if isinstance(v := c.get(f), int) and not isinstance(v, bool) and v > 0]
    return max(found) if found else None


def _check_moe(model: str | Path, report: DoctorReport) -> None:
    """Fill ``report.moe`` from the model's ``config.json`` (nothing when there is none: the tokenizer check
    reports a missing model)."""
    from agentrl.moe.families import EXPERT_COUNT_FIELDS, UnsupportedMoE, moe_info

    path = Path(model) / "config.json"
    if not path.is_file():
        return
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        report.problems.append(f"cannot read {path}: {type(e).__name__}: {str(e)[:200]}")
        return
    if not isinstance(config, dict):
        report.problems.append(f"cannot read {path}: ValueError: not a JSON object")
        return
    if not config.get("model_type"):
        return  # moe_info needs a model_type; a config without one says nothing about experts
    try:
        info = moe_info(config)
    except UnsupportedMoE as e:
        experts, top_k = _config_int(config, EXPERT_COUNT_FIELDS), _config_int(config, TOP_K_FIELDS)
        if experts is not None and top_k is not None:
            report.moe = {"experts": experts, "top_k": top_k, "family": config["model_type"],
                          "routing_capture": False, "error": str(e)}
        report.problems.append(f"{e}. agentrl cannot train this model (the trainer refuses a MoE model whose "
                               "routing it cannot replay): use a model of a supported family")
        return
    except Exception as e:  # a config transformers cannot build for a supported family
        report.problems.append(f"cannot read the MoE layout of {path}: {type(e).__name__}: {str(e)[:300]}")
        return
    if info is None:
        return
    capture = routing_capture_path()
    report.moe = {**info.as_doctor(), "family": info.family, "routing_capture": capture is not None,
                  "capture_path": capture}
    if capture is None:
        report.notes.append("MoE model: vLLM is not installed here, so whether the engine can capture routing "
                            "(what routing replay needs) is not known")
    report.notes.append("MoE model: on the CPU build of vLLM a MoE engine cannot serve LoRA (vLLM's LoRA path "
                        "for MoE layers needs Triton), so a LoRA run syncs merged weights to the engine instead")


def _gen_eos(model: str | Path) -> list[int]:
    from agentrl.rollout.chat import generation_eos_ids

    return generation_eos_ids(model)


def check_model(model: str | Path, tool_parser: str, chat_template: str | None = None) -> DoctorReport:
    """:func:`diagnose`, raising :class:`DoctorCheckFailed` (a ``ValueError``) with the problems (what ``agentrl train`` runs at start)."""
    report = diagnose(model, tool_parser, chat_template)
    if report.problems:
        flags = f"--tool-parser {tool_parser}" + (f" --chat-template {chat_template}" if chat_template else "")
        raise DoctorCheckFailed(f"model {model} fails agentrl doctor's checks (agentrl doctor --model {model} "
                         f"{flags}):\n  " + "\n  ".join(report.problems))
    return report
