"""Tool-call parsing through vLLM's parsers: good calls, malformed calls as errors (never exceptions)."""

from __future__ import annotations

import pytest

from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.toolcalls import ToolCallParser, check_tool_parser_name
from agentrl.tools.modelgen.tokenizer import train_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(train_tokenizer(["The answer is 5."] * 10, vocab_size=300))


def test_parse_single_and_multiple_calls(chat: ChatFormat) -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    p = chat.parse(text)
    assert p.errors == []
    assert p.content == "Let me compute."
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("calculate", {"expression": "2 + 3"})]
    two = chat.parse('<tool_call>{"name": "a", "arguments": {}}</tool_call>'
                     '<tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert [(c.name, c.arguments) for c in two.tool_calls] == [("a", {}), ("b", {"x": 1})]
    assert two.tool_calls[0].id != two.tool_calls[1].id
    assert all(len(c.id) == 9 and c.id.isalnum() for c in two.tool_calls)


def test_no_call_is_plain_content(chat: ChatFormat) -> None:
    p = chat.parse("The answer is 5.")
    assert (p.content, p.tool_calls, p.errors) == ("The answer is 5.", [], [])


def test_malformed_calls_become_errors(chat: ChatFormat) -> None:
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>["calculate"]</tool_call>': 'string "name"',
        '<tool_call>{"name": 3}</tool_call>': 'string "name"',
        '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>': "arguments of f are not valid JSON",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "f"': "never closed",
        '<tool_call>{"name": "f"}</tool_call>': 'no "arguments"',
    }
    for text, msg in cases.items():
        p = chat.parse(text)
        assert p.tool_calls == [], text
        assert len(p.errors) == 1 and msg in p.errors[0], (text, p.errors)


def test_one_bad_block_is_named_among_good_ones(chat: ChatFormat) -> None:
    """vLLM's Hermes parser rejects the whole turn; the error names the block that is wrong."""
    p = chat.parse('<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>')
    assert p.tool_calls == [] and len(p.errors) == 1 and "{oops}" in p.errors[0]


def test_other_formats_by_name(chat: ChatFormat) -> None:
    tok = chat.tokenizer
    py = ToolCallParser("pythonic", tok).parse("[add(a=1, b=2)]", TOOLS)
    assert [(c.name, c.arguments) for c in py.tool_calls] == [("add", {"a": 1, "b": 2})] and py.errors == []
    xml = ToolCallParser("qwen3_coder", tok).parse(
        "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call>", TOOLS)
    assert [(c.name, c.arguments) for c in xml.tool_calls] == [("add", {"a": 1, "b": 2})]
    bad = ToolCallParser("qwen3_coder", tok).parse("<tool_call>\nadd(1, 2)\n</tool_call>", TOOLS)
    assert bad.tool_calls == [] and bad.errors, bad


def test_unknown_parser_names_the_valid_ones(chat: ChatFormat) -> None:
    with pytest.raises(ValueError, match=r"unknown tool parser 'nope'.*hermes.*llama3_json"):
        check_tool_parser_name("nope")
    with pytest.raises(ValueError, match="unknown tool parser"):
        ChatFormat(chat.tokenizer, tool_parser="nope").parse("hi")


def test_the_native_hermes_reader_agrees_with_vllms(chat: ChatFormat) -> None:
    """Scripted policies read their own text without vLLM (``parse_hermes``); on every form above, on the texts
    they write and on plain content it gives what vLLM's hermes parser gives."""
    from agentrl.rollout.scripted import tool_call_text
    from agentrl.rollout.toolcalls import parse_hermes

    texts = [
        "The answer is 5.", "", "  padded  ",
        'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>',
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}'
        "</tool_call>",
        "<tool_call>{not json}</tool_call>", '<tool_call>["calculate"]</tool_call>', '<tool_call>{"name": 3}</tool_call>',
        '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>', '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "f"', '<tool_call>{"name": "f"}</tool_call>',
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>',
        "I will look.\n" + tool_call_text("set_digit", {"position": 0, "digit": 7}) + "\n"
        + tool_call_text("submit", {}),
    ]
    for text in texts:
        native, vllm = parse_hermes(text), chat.parse(text)
        assert native.content == vllm.content, text
        assert [(c.name, c.arguments) for c in native.tool_calls] == [(c.name, c.arguments) for c in vllm.tool_calls]
        assert native.errors == vllm.errors, text
