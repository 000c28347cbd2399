"""Four real model families (published chat templates and special tokens on small test tokenizers): the
doctor's report, a tool-call round trip through the family's vLLM parser, stop tokens and the observation
delta after whichever stop token was sampled. The real-engine episodes are in tests/integration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.launch.doctor import diagnose, probe_conversation
from agentrl.rollout.chat import ChatFormat
from tests.fixtures_families import FAMILIES, build_family_tokenizer

EXPECTED = {  # family: (appends only, thinking, stop tokens)
    "qwen2.5": (True, False, ["<|im_end|>", "<|endoftext|>"]),
    "llama3.1": (True, False, ["<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"]),
    "mistral": (False, False, ["</s>"]),  # the system prompt moves to the last user turn
    "qwen3": (False, True, ["<|im_end|>", "<|endoftext|>"]),  # an empty <think></think> is dropped
}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    out = tmp_path_factory.mktemp(request.param.replace(".", "_"))
    build_family_tokenizer(FAMILIES[request.param], out)
    return request.param, out


def _chat(name: str, path: Path) -> ChatFormat:
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(path), FAMILIES[name].tool_parser, model_dir=path)


def test_doctor_report(family_dir: tuple[str, Path]) -> None:
    name, path = family_dir
    report = diagnose(path, FAMILIES[name].tool_parser)
    appends, thinking, stops = EXPECTED[name]
    assert report.problems == [], report.text()
    assert (report.roundtrip_ok, report.observation_delta_ok) == (True, True)
    assert (report.chat_template_appends_only, report.thinking) == (appends, thinking), report.text()
    assert report.stop_tokens == stops
    assert (report.history_rewrite is None) == appends
    assert any("rewrites history" in n for n in report.notes) == (not appends)
    json.loads(report.model_dump_json())  # what `agentrl doctor --json` prints


def test_the_wrong_parser_is_a_problem_naming_the_right_one(family_dir: tuple[str, Path]) -> None:
    name, path = family_dir
    wrong = "pythonic"
    report = diagnose(path, wrong)
    assert not report.roundtrip_ok and report.problems
    assert FAMILIES[name].tool_parser in report.parsers_that_read_the_template
    assert "--tool-parser" in report.problems[0]


def _call_turn(chat: ChatFormat, args: dict[str, Any]) -> str:
    """An assistant tool-call turn as the family's template renders it (the text the model would sample),
    up to its stop token."""
    msgs = [{"role": "user", "content": "Add them."},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "abc123xyz", "type": "function", "function": {"name": "add", "arguments": args}}]}]
    head = chat._render(msgs[:1], TOOLS, gen=True)
    full = chat._render(msgs, TOOLS, gen=False)
    ids = chat.encode(full[len(head):])
    end = next(j for j, t in enumerate(ids) if t in chat.stop_token_ids)
    return chat.decode(ids[:end])  # what the loop parses: the turn without its stop token


def test_tool_call_round_trip_and_malformed_calls(family_dir: tuple[str, Path]) -> None:
    name, path = family_dir
    chat = _chat(name, path)
    text = _call_turn(chat, {"a": 2, "b": 40})
    parsed = chat.parse(text, TOOLS)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("add", {"a": 2, "b": 40})], (text, parsed)
    assert parsed.errors == []
    assert chat.parse("The answer is 42.", TOOLS).tool_calls == []
    marker = chat.parser.start_marker
    if marker:  # a started but unreadable call is an error the model reads, never an exception
        bad = chat.parse(f"{marker} {{not a call", TOOLS)
        assert bad.tool_calls == [] and bad.errors, bad


def test_observation_delta_after_each_stop_token(family_dir: tuple[str, Path]) -> None:
    """The delta after the template's end token is the template's text; after another eos id (or a cut
    turn) the template's end token is inserted first."""
    name, path = family_dir
    chat = _chat(name, path)
    msgs = probe_conversation()
    tool_msg = msgs[3]
    end = chat.end_of_turn_ids[0]
    closed = chat.observation_text([tool_msg], TOOLS, ended_with=end)
    assert "a round fruit" in closed and not closed.startswith(chat.eos_text)
    for other in [*[t for t in chat.stop_token_ids if t not in chat.end_of_turn_ids], None]:
        if other is None:
            opened = chat.observation_text([tool_msg], TOOLS, ended_with=12345)  # a cut turn
        else:
            opened = chat.observation_text([tool_msg], TOOLS, ended_with=other)
        assert opened == chat.eos_text + closed
    ids = chat.observation_ids([tool_msg], TOOLS, ended_with=end)
    assert chat.encode(closed) == ids and not any(t in chat.stop_token_ids for t in ids[:1])


def _custom(tmp_path: Path, template: str) -> Path:
    from agentrl.tools.modelgen.tokenizer import train_tokenizer

    tok = train_tokenizer(["An apple is a round fruit."] * 10, vocab_size=300)
    tok.chat_template = template
    tok.save_pretrained(tmp_path)
    return tmp_path


_TURNS = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
          "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
          "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}")


def test_a_template_whose_delta_depends_on_history_is_refused(tmp_path: Path) -> None:
    """Tool results that show the message count: the delta taken from a dummy conversation is wrong."""
    turns = _TURNS.replace("{{ m.role }}\n", "{{ m.role }}{% if m.role == 'tool' %} {{ loop.length }}{% endif %}{{ '\\n' }}")
    path = _custom(tmp_path, turns + "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    report = diagnose(path, "hermes")
    assert report.roundtrip_ok and not report.observation_delta_ok
    assert any("observation delta" in p for p in report.problems), report.text()


def test_a_template_that_does_not_close_turns_with_a_special_token_is_refused(tmp_path: Path) -> None:
    path = _custom(tmp_path, _TURNS.replace("<|im_end|>", "") + "{% if add_generation_prompt %}<|im_start|>"
                   "assistant\n{% endif %}")
    report = diagnose(path, "hermes")
    assert not report.ok and any("no special token" in p for p in report.problems), report.text()
    from agentrl.launch.doctor import check_model

    with pytest.raises(ValueError, match="fails agentrl doctor's checks"):
        check_model(path, "hermes")


@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>"])
async def test_an_episode_ending_turns_on_either_stop_token_matches_the_template(tmp_path: Path, end: str) -> None:
    """Qwen2.5 (appends only): a tool-call turn that ends on the template's <|im_end|> or on the other eos,
    <|endoftext|>; either way the trajectory is the template's full render of the episode, token for token,
    and the sampled stop token is kept as a model token."""
    import agentrl
    from agentrl.config.run import SamplingConfig
    from agentrl.inference.client import Generation
    from agentrl.rollout.loop import run_episode

    build_family_tokenizer(FAMILIES["qwen2.5"], tmp_path)
    chat = _chat("qwen2.5", tmp_path)
    end_id = chat.tokenizer.convert_tokens_to_ids(end)

    class Add(agentrl.Environment):
        name = "add"

        async def reset(self, task: agentrl.Task) -> str:
            return "Add 2 and 40."

        @agentrl.tool
        def add(self, a: int, b: int) -> str:
            """Add two integers."""
            return str(a + b)

        async def reward(self, messages: list[agentrl.Message]) -> float:
            return 1.0

    turns = [_call_turn(chat, {"a": 2, "b": 40}), "It is 42."]

    class Scripted:
        async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
            assert end_id in kw["stop_token_ids"] and chat.eos_token_id in kw["stop_token_ids"]
            ids = [*chat.encode(turns.pop(0)), end_id]
            return Generation(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop", weight_versions=None,
                              endpoint="fake")

    traj = await run_episode(Add, {"id": "t"}, Scripted(), chat, SamplingConfig())
    assert not traj.failed and traj.num_tool_calls == 1, traj
    assert [m.content for m in traj.messages if m.role == "tool"] == ["42"]
    msgs = [m.to_openai() for m in traj.messages]
    for m in msgs:  # the template renders arguments given as objects
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    rendered = chat._render(msgs, Add.tool_schemas(), gen=False)
    if end != "<|im_end|>":  # the sampled <|endoftext|> stands where the template closes the turns
        rendered = rendered.replace("<|im_end|>\n<|im_start|>user\n<tool_response>",
                                    "<|endoftext|><|im_end|>\n<|im_start|>user\n<tool_response>")
        rendered = rendered[: rendered.rindex("<|im_end|>")] + "<|endoftext|>\n"
    assert traj.prompt_ids + traj.completion_ids == chat.encode(rendered.rstrip("\n"))
    model_ids = [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m]
    assert model_ids.count(end_id) == 2


def test_cached_observation_deltas_equal_fresh_renders(family_dir: tuple[str, Path]) -> None:
    """observation_ids keeps recent deltas (tool-call ids left out of the key only where the template does
    not render them): every answer equals a fresh render, whichever ids and stop tokens come in."""
    name, path = family_dir
    chat = _chat(name, path)
    renders_ids = chat._renders_call_ids(TOOLS, json.dumps(TOOLS, sort_keys=True))
    assert renders_ids == (name == "mistral"), "only Mistral's template shows tool-call ids"
    for call_id in ("a1b2c3d4e", "z9y8x7w6v", "a1b2c3d4e"):
        for ended in (None, *chat.stop_token_ids, 42):
            msgs = [{"role": "tool", "content": "5", "tool_call_id": call_id, "name": "add"}]
            fresh = chat.encode(chat.observation_text(msgs, TOOLS, ended_with=ended))
            assert chat.observation_ids(msgs, TOOLS, ended_with=ended) == fresh
    assert chat.prompt_ids([{"role": "user", "content": "2+3?"}], TOOLS) == chat.prompt_ids(
        [{"role": "user", "content": "2+3?"}], TOOLS) == chat.encode(chat._render(
            [{"role": "user", "content": "2+3?"}], TOOLS, gen=True))
