"""The tiny model's chat template: exact rendering, tool calls, tool responses and the prefix property."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrl.envs.calc import CalcEnv
from agentrl.tools.modelgen.tokenizer import TOOL_TOKENS, render_chat, train_tokenizer

TOOLS = CalcEnv.tool_schemas()
SYSTEM = {"role": "system", "content": "Be brief."}
USER = {"role": "user", "content": "Ann has 23 apples. She buys 3 bags with 12 apples each. How many now?"}


def _call(expression: str, as_string: bool = False, openai: bool = True) -> dict[str, Any]:
    args: Any = {"expression": expression}
    if as_string:
        args = json.dumps(args)
    if openai:
        return {"id": "c1", "type": "function", "function": {"name": "calculate", "arguments": args}}
    return {"name": "calculate", "arguments": args}


EPISODE = [
    SYSTEM,
    USER,
    {"role": "assistant", "content": "", "tool_calls": [_call("23 + 3 * 12")]},
    {"role": "tool", "tool_call_id": "c1", "content": "59"},
    {"role": "assistant", "content": "The answer is 59."},
]


def test_renders_a_calc_episode_exactly() -> None:
    tools_line = json.dumps(TOOLS[0], separators=(",", ":"))
    expected = (
        f"<|im_start|>system\nBe brief.\n<tools>\n{tools_line}\n</tools><|im_end|>\n"
        f"<|im_start|>user\n{USER['content']}<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "calculate", "arguments": {"expression": "23 + 3 * 12"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n59\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nThe answer is 59.<|im_end|>\n"
    )
    assert render_chat(EPISODE, TOOLS) == expected
    assert (
        render_chat(EPISODE[:4], TOOLS, add_generation_prompt=True)
        == expected[: expected.rindex("The answer")]
    )


def test_without_tools_or_system() -> None:
    assert (
        render_chat([SYSTEM, USER])
        == f"<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n{USER['content']}<|im_end|>\n"
    )
    assert render_chat([USER], add_generation_prompt=True).endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat([USER], TOOLS).startswith("<|im_start|>system\n<tools>\n{")


def test_tool_call_arguments_as_dict_or_json_string() -> None:
    as_dict = [USER, {"role": "assistant", "content": None, "tool_calls": [_call("1 + 2")]}]
    as_str = [USER, {"role": "assistant", "content": None, "tool_calls": [_call("1 + 2", as_string=True)]}]
    flat = [USER, {"role": "assistant", "content": "", "tool_calls": [_call("1 + 2", openai=False)]}]
    text = render_chat(as_dict, TOOLS)
    assert text == render_chat(as_str, TOOLS) == render_chat(flat, TOOLS)
    assert (
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 2"}}\n</tool_call><|im_end|>'
        in text
    )


def test_consecutive_tool_messages_share_one_user_turn() -> None:
    msgs = [
        USER,
        {"role": "assistant", "content": "Two calls.", "tool_calls": [_call("1 + 1"), _call("2 + 2")]},
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "4"},
    ]
    text = render_chat(msgs, TOOLS, add_generation_prompt=True)
    assert "Two calls.\n<tool_call>\n" in text
    assert "</tool_call>\n<tool_call>\n" in text
    assert text.endswith(
        "<|im_start|>user\n<tool_response>\n2\n</tool_response>\n<tool_response>\n4\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert text.count("<|im_start|>user") == 2


CONVERSATIONS = [
    EPISODE,
    EPISODE[1:],
    [
        SYSTEM,
        USER,
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [_call("1/0"), _call("2", True)]},
        {"role": "tool", "content": "Error: division by zero"},
        {"role": "tool", "content": "2"},
        {"role": "assistant", "content": None, "tool_calls": [_call("3 * 4", openai=False)]},
        {"role": "tool", "content": "12"},
        {"role": "user", "content": "And?"},
        {"role": "assistant", "content": "12"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("tools", [TOOLS, None])
def test_prefix_property(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> None:
    for k in range(1, len(messages)):
        shorter, longer = render_chat(messages[:k], tools), render_chat(messages[: k + 1], tools)
        assert longer.startswith(shorter), (k, shorter[-80:], longer[-80:])
        if messages[k]["role"] == "assistant":
            prompt = render_chat(messages[:k], tools, add_generation_prompt=True)
            assert prompt.startswith(shorter) and longer.startswith(prompt)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    corpus = [render_chat(CONVERSATIONS[0], TOOLS), render_chat(CONVERSATIONS[2], TOOLS)] * 20
    return train_tokenizer(corpus, vocab_size=400)


def test_tokenizer_uses_the_template_and_keeps_tool_tokens(tokenizer: Any) -> None:
    assert tokenizer.apply_chat_template(EPISODE, tools=TOOLS, tokenize=False) == render_chat(EPISODE, TOOLS)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    for tok in [*TOOL_TOKENS, "<|im_start|>", "<|im_end|>", "<|endoftext|>"]:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1, tok
    text = render_chat(CONVERSATIONS[2], TOOLS)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    stripped = tokenizer.decode(ids, skip_special_tokens=True)
    assert "<tool_call>" in stripped and "</tool_response>" in stripped and "<|im_end|>" not in stripped


def test_digits_are_single_tokens(tokenizer: Any) -> None:
    ids = tokenizer.encode("12345 + 678", add_special_tokens=False)
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.strip().isdigit()] == list("12345678")
