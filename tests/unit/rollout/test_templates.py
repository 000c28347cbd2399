"""Chat templates in place of a model's own: a ChatML tokenizer whose template shows no tools (as SmolLM2's) is
refused with the built-in that fits; with ``hermes`` it passes every check, episodes are token-faithful, and the
template travels with what a run saves."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from agentrl.launch.doctor import check_model, diagnose, probe_conversation
from agentrl.rollout import templates
from agentrl.rollout.chat import ChatFormat

PLAIN_CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
"""A ChatML template that renders no tools and no tool calls (SmolLM2's, without its default system prompt)."""


@pytest.fixture(scope="module")
def plain_chatml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.tools.modelgen.tokenizer import train_tokenizer

    out = tmp_path_factory.mktemp("plain-chatml")
    tok = train_tokenizer(["An apple is a round fruit. Look the word up."] * 10, vocab_size=300)
    tok.chat_template = PLAIN_CHATML
    tok.save_pretrained(out)
    return out


def test_builtins_resolve_and_unknown_names_are_refused(tmp_path: Path) -> None:
    assert "hermes" in templates.builtin_names()
    assert templates.resolve(None) is None and templates.resolve("own") is None
    hermes = templates.resolve("hermes")
    assert hermes is not None and hermes.label == "hermes" and "<tool_call>" in hermes.text
    mine = tmp_path / "t.jinja"
    mine.write_text("{{ messages[0].content }}")
    assert templates.resolve(str(mine)).text == "{{ messages[0].content }}"  # type: ignore[union-attr]
    with pytest.raises(templates.UnknownChatTemplate, match=r"neither a built-in template .*hermes.* nor a file"):
        templates.resolve("chatml-nope")


def test_a_template_that_shows_no_tools_is_refused_naming_the_builtin(plain_chatml: Path) -> None:
    report = diagnose(plain_chatml, "hermes")
    assert report.chat_template == "own" and not report.renders_tools
    assert report.suggested_chat_template == "hermes" and not report.ok
    assert any("renders no trace of the tools, the assistant's tool call" in p and "--chat-template hermes" in p
               for p in report.problems), report.text()
    with pytest.raises(ValueError, match="--chat-template hermes"):
        check_model(plain_chatml, "hermes")


def test_hermes_on_a_chatml_tokenizer_passes_every_check(plain_chatml: Path) -> None:
    report = diagnose(plain_chatml, "hermes", chat_template="hermes")
    assert report.ok, report.text()
    assert report.chat_template == "hermes" and report.renders_tools and report.chat_template_appends_only
    assert report.roundtrip_ok and report.observation_delta_ok and report.stop_tokens == ["<|im_end|>"]
    assert json.loads(report.model_dump_json())["chat_template"] == "hermes"
    check_model(plain_chatml, "hermes", "hermes")


def test_hermes_renders_tools_calls_and_results_and_only_appends(plain_chatml: Path) -> None:
    from transformers import AutoTokenizer

    chat = ChatFormat(AutoTokenizer.from_pretrained(plain_chatml), "hermes", chat_template="hermes")
    assert chat.chat_template == "hermes"
    msgs = probe_conversation()
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    renders = [chat._render(msgs[:k], tools, gen=False) for k in range(2, len(msgs) + 1)]
    assert all(b.startswith(a) for a, b in itertools.pairwise(renders))
    full = renders[-1]
    assert full.startswith("<|im_start|>system\nAnswer briefly.\n\n# Tools\n")
    assert '"name": "lookup"' in full and '<tool_call>\n{"name": "lookup", "arguments": {"word": "apple"}}\n</tool_call><|im_end|>' in full
    assert "<|im_start|>tool\n<tool_response>\na round fruit\n</tool_response><|im_end|>\n" in full
    assert chat._render(msgs[1:2], None, gen=True) == "<|im_start|>user\nWhat is an apple?<|im_end|>\n<|im_start|>assistant\n"


def test_the_template_travels_with_what_a_run_saves(tmp_path: Path) -> None:
    templates.carry(tmp_path, None)
    assert templates.carried(tmp_path) is None  # the model's own: nothing written
    templates.carry(tmp_path, "hermes")
    assert templates.carried(tmp_path) == str(tmp_path / "chat_template.jinja")
    assert (tmp_path / "chat_template.jinja").read_text() == templates.resolve("hermes").text  # type: ignore[union-attr]


def test_a_tokenizer_without_chatml_tokens_gets_no_suggestion(tmp_path: Path) -> None:
    from tests.fixtures_families import FAMILIES, build_family_tokenizer

    build_family_tokenizer(FAMILIES["llama3.1"], tmp_path)
    from transformers import AutoTokenizer

    assert templates.fitting_builtins(AutoTokenizer.from_pretrained(tmp_path)) == []
