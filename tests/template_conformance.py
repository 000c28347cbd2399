"""Conformance of published chat templates with agentrl's doctor: the templates TRL ships in its wheel.

TRL (``trl/chat_templates/*.jinja``) keeps the chat templates of many model families, originals and training
variants. For each, a small test tokenizer is built that carries the special tokens the template writes (found
by rendering it on the doctor's probe conversation), the family's bos/eos and its generation_config eos list;
then :func:`agentrl.launch.doctor.diagnose` runs on it and one row records what it found: whether the template
only appends, whether it shows the tools, the call and the result, which vLLM tool parser reads its calls back,
its stop tokens, and what agentrl would use (the template itself, the built-in ``hermes``, or nothing).

The wheel is fetched with pip (no install) into ``.cache/trl-wheel/`` once per machine.
``python -m tests.template_conformance`` prints the table in markdown.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentrl.launch.doctor import DoctorReport

TRL_VERSION = "1.16.0"
"""The TRL release whose templates are checked."""
ROOT = Path(__file__).resolve().parents[1]
CACHE_DIR = ROOT / ".cache" / "trl-wheel"
"""Where the wheel is kept between runs (``.cache/`` is git-ignored)."""
EXPECTED = Path(__file__).parent / "data" / "template_conformance.json"
"""The rows :func:`compute_rows` gave when last checked by hand."""
TEMPLATE_DIR = "trl/chat_templates/"

EXTRA_PARSERS = ["deepseek_v3", "deepseek_v31", "glm45", "glm47", "openai", "gemma4", "lfm2", "muse_glimmer",
                 "cohere_command3", "cohere_command4", "qwen3_xml", "phi4_mini_json"]
"""vLLM parsers of families TRL ships templates for, tried (in this order) when neither ``hermes`` nor the
doctor's own candidates read a template's tool call back."""


class TemplatesUnavailable(RuntimeError):
    """The TRL wheel could not be downloaded (no network, or no pip)."""


# ------------------------------------------------------------------------------------------------ the wheel

def fetch_wheel(cache_dir: Path = CACHE_DIR, version: str = TRL_VERSION) -> Path:
    """The TRL wheel of ``version`` in ``cache_dir``, downloaded by pip (``--no-deps``, nothing installed) the
    first time. A lock file keeps concurrent callers (pytest-xdist workers) from downloading it twice; the
    wheel is downloaded into a temporary folder and renamed into place. Raises :class:`TemplatesUnavailable`."""
    import fcntl
    import os

    cache_dir.mkdir(parents=True, exist_ok=True)
    wheel = cache_dir / f"trl-{version}-py3-none-any.whl"
    if wheel.is_file():
        return wheel
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if wheel.is_file():  # another process downloaded it while this one waited
            return wheel
        with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
            try:
                done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
                                       "--disable-pip-version-check", "--only-binary=:all:", "--timeout", "30",
                                       f"trl=={version}", "-d", tmp], capture_output=True, text=True, timeout=300)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise TemplatesUnavailable(f"cannot run pip to download trl=={version}: {e}") from e
            got = sorted(Path(tmp).glob("trl-*.whl"))
            if done.returncode != 0 or not got:
                raise TemplatesUnavailable(f"pip cannot download trl=={version} (no network?): "
                                           f"{(done.stderr or done.stdout).strip()[-400:]}")
            os.replace(got[0], wheel)
    return wheel


def read_templates(wheel: Path) -> dict[str, str]:
    """The chat templates a TRL wheel ships: ``{name: text}`` for ``trl/chat_templates/<name>.jinja``."""
    with zipfile.ZipFile(wheel) as z:
        return {n[len(TEMPLATE_DIR):-len(".jinja")]: z.read(n).decode() for n in sorted(z.namelist())
                if n.startswith(TEMPLATE_DIR) and n.endswith(".jinja") and "/" not in n[len(TEMPLATE_DIR):]}


def fetch_templates(cache_dir: Path = CACHE_DIR) -> dict[str, str]:
    """TRL's chat templates (see :func:`fetch_wheel` and :func:`read_templates`)."""
    return read_templates(fetch_wheel(cache_dir))


# ----------------------------------------------------------------------------------- the family's tokens

@dataclass(frozen=True)
class FamilyTokens:
    """The tokens of a family's tokenizer that a template does not necessarily write: bos, eos, pad, and the
    eos list of its ``generation_config.json``."""

    bos: str | None = None
    eos: str | None = None
    pad: str | None = None
    generation_eos: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    """Other special tokens of the family's tokenizer that its tool parser needs (Llama's ``<|python_tag|>``)."""


_QWEN = FamilyTokens(None, "<|im_end|>", "<|endoftext|>", ["<|im_end|>", "<|endoftext|>"])
_DEEPSEEK = FamilyTokens("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", None, ["<｜end▁of▁sentence｜>"])
_GEMMA = FamilyTokens("<bos>", "<eos>", "<pad>", ["<eos>", "<end_of_turn>"])
_GEMMA4 = FamilyTokens("<bos>", "<eos>", "<pad>", ["<eos>", "<turn|>"])
_LLAMA31 = FamilyTokens("<|begin_of_text|>", "<|eot_id|>", None, ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
                        ["<|python_tag|>"])
_COHERE = FamilyTokens("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", "<PAD>", ["<|END_OF_TURN_TOKEN|>"])
FAMILY_TOKENS: dict[str, FamilyTokens] = {
    "cohere": _COHERE,
    "deepseek": _DEEPSEEK,
    "diffusion_gemma": _GEMMA4,
    "gemma": _GEMMA,
    "gemma4": _GEMMA4,
    "glm4moe": FamilyTokens(None, "<|endoftext|>", "<|endoftext|>", ["<|endoftext|>", "<|user|>", "<|observation|>"]),
    "gptoss": FamilyTokens("<|startoftext|>", "<|return|>", "<|endoftext|>", ["<|return|>", "<|endoftext|>", "<|call|>"]),
    "idefics3": FamilyTokens("<|begin_of_text|>", "<end_of_utterance>", None, ["<end_of_utterance>", "<|end_of_text|>"]),
    "lfm2": FamilyTokens("<|startoftext|>", "<|im_end|>", "<|pad|>", ["<|im_end|>"]),
    "llama3": FamilyTokens("<|begin_of_text|>", "<|eot_id|>", None, ["<|end_of_text|>", "<|eot_id|>"]),
    "llama3_1": _LLAMA31,
    "llama3_2": _LLAMA31,
    "llava_next": FamilyTokens("<s>", "</s>", "<pad>", ["</s>"]),
    "muse_glimmer": FamilyTokens("<|begin_of_text|>", "<|eot|>", None, ["<|eot|>", "<|eom|>"]),
    "nemotron": FamilyTokens("<s>", "<|im_end|>", None, ["<|im_end|>"]),
    "phi3": FamilyTokens("<s>", "<|endoftext|>", "<|endoftext|>", ["<|endoftext|>", "<|assistant|>", "<|end|>"]),
    "qwen": _QWEN,
    "smolvlm": FamilyTokens("<|im_start|>", "<end_of_utterance>", "<|im_end|>", ["<end_of_utterance>"]),
}
"""The published tokens of each family TRL ships a template for, by template name prefix (longest wins)."""


def family_tokens(name: str) -> FamilyTokens:
    """The :data:`FAMILY_TOKENS` entry whose key is the longest prefix of template ``name`` (none: no tokens)."""
    keys = [k for k in FAMILY_TOKENS if name.startswith(k)]
    return FAMILY_TOKENS[max(keys, key=len)] if keys else FamilyTokens()


# ------------------------------------------------------------------------------- the template's tokens

_SPECIAL_FORMS = re.compile(
    r"<\|[^<>\s|]*\|>"  # <|im_start|>, <|"|>
    r"|<\|[^<>\s|]+>"  # <|turn>, <|tool_call>
    r"|<[^<>\s|/][^<>\s|]*\|>"  # <turn|>, <tool_call|>
    r"|<｜[^<>｜\s]+｜>"  # <｜Assistant｜> (DeepSeek, full-width bars)
    r"|\[/?[A-Za-z]*[A-Z][A-Za-z_]*\]"  # [INST], [/INST], [gMASK]
)
"""Forms a family's tokenizer has as special tokens."""
_TAG = re.compile(r"</?[A-Za-z_][A-Za-z0-9_]*>")
_SPECIAL_TAGS = re.compile(r"</?(s|bos|eos|pad|unk|sop|eop|image|(start|end)_of_[a-z_]+)>")
"""``<word>`` tags a family's tokenizer has as special tokens (Gemma's turn markers, ``<s>``, ``</s>``, ...)."""
_ADDED_TAGS = re.compile(r"</?(tool_call|tool_response|think|arg_key|arg_value)>")
"""``<word>`` tags a family's tokenizer has as added tokens that are not special (Qwen's ``<tool_call>``,
``<think>``, GLM's ``<arg_key>``); every other tag (``<tools>``, ``<function=f>``) is plain text."""


def template_tokens(text: str) -> tuple[list[str], list[str]]:
    """The special tokens and the added (not special) tokens written in ``text``, in order of appearance."""
    special: list[str] = []
    added: list[str] = []
    for m in re.finditer(f"{_SPECIAL_FORMS.pattern}|{_TAG.pattern}", text):
        tok = m.group(0)
        if _TAG.fullmatch(tok):
            if _SPECIAL_TAGS.fullmatch(tok):
                special.append(tok)
            elif _ADDED_TAGS.fullmatch(tok):
                added.append(tok)
        else:
            special.append(tok)
    return list(dict.fromkeys(special)), list(dict.fromkeys(added))


def _variables(family: FamilyTokens) -> dict[str, str]:
    """The template variables ``apply_chat_template`` passes from the tokenizer's special tokens."""
    return {k: v for k, v in (("bos_token", family.bos), ("eos_token", family.eos), ("pad_token", family.pad))
            if v is not None}


def probe_renders(template: str, family: FamilyTokens) -> tuple[list[str], str | None]:
    """The template rendered (with transformers' renderer) on the doctor's probe conversation (the opening
    prompt, the whole conversation, the conversation up to the tool result) and on a plain user/assistant
    exchange; and the first error the probe conversation raised (None: it rendered)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from agentrl.launch.doctor import PROBE_TOOLS, probe_conversation

    msgs = probe_conversation()
    plain = [{"role": "user", "content": "What is an apple?"}, {"role": "assistant", "content": "A fruit."}]
    cases: list[tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool, bool]] = [
        (msgs[:2], PROBE_TOOLS, True, True), (msgs, PROBE_TOOLS, False, True), (msgs[:4], PROBE_TOOLS, True, True),
        (plain[:1], None, True, False), (plain, None, False, False)]
    texts: list[str] = []
    error: str | None = None
    for conversation, tools, gen, probe in cases:
        try:
            rendered, _ = render_jinja_template(conversations=[conversation], tools=tools, chat_template=template,
                                                add_generation_prompt=gen, **_variables(family))
            texts.append(rendered[0])
        except Exception as e:
            if probe and error is None:
                error = f"{type(e).__name__}: {e}"
    return texts, error


# ---------------------------------------------------------------------------------------- the tokenizer

_CORPUS = [
    "What is an apple? An apple is a round fruit. Answer briefly.", "Look a word up in the dictionary.",
    '{"name": "lookup", "arguments": {"word": "apple"}}', '{"type": "function", "function": {"name": "lookup"}}',
    "You are a helpful assistant with tool calling capabilities. You may call one or more functions.",
    "system user assistant tool model function parameters properties description required string object",
    "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] { } , . ; : ! ? \" ' # _ < > | \n",
]


@cache
def _base_tokenizer() -> str:
    """A small byte-level BPE (as :mod:`tests.fixtures_families` trains), as JSON: trained once."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=480, min_frequency=2, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok.to_str()


@dataclass
class BuiltTokenizer:
    """A template's test tokenizer: where it is saved and the tokens it was given."""

    path: Path
    special: list[str]
    added: list[str]
    render_error: str | None


def build_tokenizer(template: str, family: FamilyTokens, out_dir: Path) -> BuiltTokenizer:
    """Save into ``out_dir`` a test tokenizer carrying ``template``, the special and added tokens it writes
    (:func:`template_tokens` on :func:`probe_renders`, in the order they appear there, then those written in
    the template's text that the probe did not reach) and the family's tokens, with a
    ``generation_config.json`` listing the family's eos ids."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    texts, error = probe_renders(template, family)
    special, added = template_tokens("".join(texts))
    written_special, written_added = template_tokens(template)
    special = list(dict.fromkeys(t for t in (*special, *written_special, family.bos, family.eos, family.pad,
                                             *family.generation_eos, *family.extra) if t is not None))
    added = [t for t in dict.fromkeys(added + written_added) if t not in special]
    base = Tokenizer.from_str(_base_tokenizer())
    base.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    base.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    fast = PreTrainedTokenizerFast(tokenizer_object=base, bos_token=family.bos, eos_token=family.eos,
                                   pad_token=family.pad, clean_up_tokenization_spaces=False, model_max_length=4096)
    fast.chat_template = template
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    eos = [fast.convert_tokens_to_ids(t) for t in family.generation_eos]
    (out_dir / "generation_config.json").write_text(json.dumps({"eos_token_id": eos} if eos else {}))
    return BuiltTokenizer(out_dir, special, added, error)


# ------------------------------------------------------------------------------------------------ one row

OWN, HERMES, NONE = "own", "hermes", "none"
"""What agentrl uses: the template itself, ``--chat-template hermes``, or nothing that fits."""


def _read_by_extra(path: Path, parsers: Sequence[str]) -> str | None:
    """The first of ``parsers`` that reads back the probe's tool call as the template renders it (None: none
    does, or the turn cannot be cut out), checked as the doctor checks its own candidates."""
    from transformers import AutoTokenizer

    from agentrl.launch.doctor import PROBE_TOOLS, _calls_match, _sampled_turn, probe_conversation
    from agentrl.rollout.chat import ChatFormat
    from agentrl.rollout.toolcalls import ToolCallParser, tool_parser_names

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    try:
        chat = ChatFormat(tokenizer, model_dir=path)
        text = chat.decode(_sampled_turn(chat, probe_conversation(), PROBE_TOOLS))
    except Exception:
        return None
    known = set(tool_parser_names())
    for name in parsers:
        if name not in known:
            continue
        try:
            if _calls_match(ToolCallParser(name, tokenizer).parse(text, PROBE_TOOLS)):
                return name
        except Exception:
            continue
    return None


_REPR = re.compile(r"""(?<!\w)('(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")""")
"""A Python repr of a string in a doctor's message (rendered text: it may hold the date a template renders)."""
_IDS = re.compile(r"\[\d+(?:, \d+)*\]")


def shorten(problem: str, limit: int = 120) -> str:
    """A doctor's message cut to what fails: rendered text (quoted) and token ids left out, up to its first
    ``: `` or ``; `` outside parentheses, at most ``limit`` characters."""
    text = _IDS.sub("[…]", _REPR.sub("…", problem))
    depth = 0
    for i, ch in enumerate(text):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and ch in ":;" and text[i + 1: i + 2] in (" ", ""):
            text = text[:i]
            break
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _diagnose(path: Path, parser: str, chat_template: str | None = None) -> DoctorReport:
    """:func:`agentrl.launch.doctor.diagnose`; an exception it raises becomes the report's only problem."""
    from agentrl.launch.doctor import DoctorReport, diagnose

    try:
        return diagnose(path, parser, chat_template)
    except Exception as e:
        return DoctorReport(model=str(path), tool_parser=parser, chat_template=chat_template or OWN,
                            problems=[f"agentrl doctor raised {type(e).__name__} ({e})"])


def template_row(name: str, template: str, work_dir: Path, parsers: Sequence[str] = EXTRA_PARSERS) -> dict[str, Any]:
    """Run the doctor on a test tokenizer carrying ``template`` (see :func:`build_tokenizer`) in a folder of
    ``work_dir``, and return its row: what the doctor found with the parser that reads the template's tool
    calls (``hermes`` first, then the doctor's candidates, then ``parsers``), and what agentrl would use."""
    from agentrl.launch.doctor import NO_CALL, NO_RESULT, NO_TOOLS
    from agentrl.rollout.templates import fitting_builtins

    family = family_tokens(name)
    built = build_tokenizer(template, family, work_dir / name)
    report = _diagnose(built.path, "hermes")
    parser = "hermes" if report.roundtrip_ok else None
    if parser is None and report.parsers_that_read_the_template:
        parser = report.parsers_that_read_the_template[0]
    if parser is None and any("tool parser does not read back" in p for p in report.problems):
        parser = _read_by_extra(built.path, parsers)
    if parser is not None and parser != "hermes":
        report = _diagnose(built.path, parser)
    # the doctor sets history_rewrite where a template does not only append, and stops before both checks
    # where it cannot render the probe conversation (then neither is known: None)
    appends: bool | None = True if report.chat_template_appends_only else (
        False if report.history_rewrite is not None else None)
    blind = next((p for p in report.problems if "renders no trace of" in p), "")
    renders = None if appends is None else {"tools": NO_TOOLS not in blind, "call": NO_CALL not in blind,
                                            "result": NO_RESULT not in blind}
    uses, hermes_problem = OWN, None
    if not report.ok:
        from transformers import AutoTokenizer

        uses = NONE
        if "hermes" in fitting_builtins(AutoTokenizer.from_pretrained(str(built.path))):
            with_hermes = _diagnose(built.path, "hermes", chat_template="hermes")
            uses = HERMES if with_hermes.ok else NONE
            hermes_problem = None if with_hermes.ok else shorten(with_hermes.problems[0])
    return {
        "template": name,
        "special_tokens": built.special,
        "added_tokens": built.added,
        "render_error": built.render_error and built.render_error[:160],
        "appends_only": appends,
        "renders": renders,
        "thinking": report.thinking,
        "parser": parser or NONE,
        "roundtrip_ok": report.roundtrip_ok,
        "observation_delta_ok": report.observation_delta_ok,
        "stop_tokens": report.stop_tokens,
        "ok": report.ok,
        "uses": uses,
        "problems": [shorten(p) for p in report.problems],
        "hermes_problem": hermes_problem,
    }


def compute_rows(templates: dict[str, str], work_dir: Path | None = None) -> list[dict[str, Any]]:
    """:func:`template_row` of every template, by name (test tokenizers in ``work_dir``, else a temporary
    folder)."""
    if work_dir is not None:
        return [template_row(n, templates[n], work_dir) for n in sorted(templates)]
    with tempfile.TemporaryDirectory(prefix="agentrl-template-conformance-") as tmp:
        return [template_row(n, templates[n], Path(tmp)) for n in sorted(templates)]


# ------------------------------------------------------------------------------------------------ the table

def _yes(b: bool | None) -> str:
    return "?" if b is None else "yes" if b else "no"


def _uses(row: dict[str, Any]) -> str:
    return {OWN: "its own template", HERMES: "`--chat-template hermes`"}.get(row["uses"], "none: write a template")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _note(row: dict[str, Any]) -> str:
    """The doctor's first problem (shortened), with the probe's render error where it has one."""
    note = row["problems"][0] if row["problems"] else ""
    if row["render_error"]:
        if row["appends_only"] is None and note.startswith("the chat template cannot render"):
            return f"cannot render the probe conversation: {row['render_error']}"
        note = (note + "; " if note else "") + f"probe: {row['render_error']}"
    return note


def render_markdown(rows: Iterable[dict[str, Any]]) -> str:
    """The rows as a markdown table: template, appends only, renders tools (tools / call / result), parser,
    stop tokens, what agentrl uses, notes (the doctor's first problem, shortened). ``?``: the doctor stopped
    before that check."""
    lines = ["| template | appends only | renders tools (tools / call / result) | parser that reads it | stop tokens "
             "| agentrl uses | notes |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        rendered = r["renders"] or {}
        renders = " / ".join(_yes(rendered.get(k)) for k in ("tools", "call", "result"))
        stops = ", ".join(f"`{t}`" for t in r["stop_tokens"]) or "none"
        lines.append(f"| {r['template']} | {_yes(r['appends_only'])} | {renders} | {r['parser']} | {_cell(stops)} "
                     f"| {_uses(r)} | {_cell(_note(r))} |")
    return "\n".join(lines)


def expected_rows(path: Path = EXPECTED) -> dict[str, dict[str, Any]]:
    """The rows ``tests/data/template_conformance.json`` holds, by template (it also names the TRL version:
    a ``ValueError`` when that is not :data:`TRL_VERSION`)."""
    data = json.loads(path.read_text())
    if data.get("trl_version") != TRL_VERSION:
        raise ValueError(f"{path} holds the rows of trl {data.get('trl_version')}, not of {TRL_VERSION}: regenerate it "
                         "with python -m tests.template_conformance --write")
    return {r["template"]: r for r in data["rows"]}


def main(argv: Sequence[str] | None = None) -> int:
    """Print the conformance table in markdown (``--json``: the rows as JSON; ``--write``: write them into
    ``tests/data/template_conformance.json``, the rows the integration test expects)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tests.template_conformance",
                                 description="The conformance table of TRL's chat templates with agentrl doctor.")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of a markdown table")
    ap.add_argument("--write", action="store_true", help=f"write the rows into {EXPECTED.relative_to(ROOT)}")
    args = ap.parse_args(argv)
    try:
        rows = compute_rows(fetch_templates())
    except TemplatesUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    data = json.dumps({"trl_version": TRL_VERSION, "rows": rows}, indent=1, ensure_ascii=False) + "\n"
    if args.write:
        EXPECTED.write_text(data)
    print(data if args.json else render_markdown(rows), end="" if args.json else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
