"""Hermes tool-call parsing: good calls, malformed calls as errors (never exceptions)."""

from __future__ import annotations

from agentrl.chat import parse_tool_calls


def test_parse_single_and_multiple_calls() -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2 + 3"}}\n</tool_call>'
    p = parse_tool_calls(text)
    assert p.errors == []
    assert p.content == "Let me compute."
    assert [(c.name, c.arguments) for c in p.tool_calls] == [("calculate", {"expression": "2 + 3"})]
    two = parse_tool_calls('<tool_call>{"name": "a"}</tool_call><tool_call>{"name": "b", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert [(c.name, c.arguments) for c in two.tool_calls] == [("a", {}), ("b", {"x": 1})]
    assert two.tool_calls[0].id != two.tool_calls[1].id


def test_no_call_is_plain_content() -> None:
    p = parse_tool_calls("The answer is 5.")
    assert (p.content, p.tool_calls, p.errors) == ("The answer is 5.", [], [])


def test_malformed_calls_become_errors() -> None:
    cases = {
        "<tool_call>{not json}</tool_call>": "not valid JSON",
        '<tool_call>["calculate"]</tool_call>': 'string "name"',
        '<tool_call>{"name": 3}</tool_call>': 'string "name"',
        '<tool_call>{"name": "f", "arguments": "{bad"}</tool_call>': "arguments of f are not valid JSON",
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "f"': "never closed",
    }
    for text, msg in cases.items():
        p = parse_tool_calls(text)
        assert p.tool_calls == [], text
        assert len(p.errors) == 1 and msg in p.errors[0], (text, p.errors)
