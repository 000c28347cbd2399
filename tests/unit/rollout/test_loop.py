"""The agent loop's control flow with a scripted generator (the real-engine test is in integration)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import agentrl
from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.inference.client import Generation, InferenceError
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.loop import run_episode
from agentrl.tools.modelgen.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    corpus = ["The answer is 42. What is 3 + 4?", '{"name": "add", "arguments": {"a": 1}}'] * 20
    return ChatFormat(train_tokenizer(corpus, vocab_size=400))


class Scripted:
    """Replies with scripted texts (ending with eos unless ``truncate``), recording prompts."""

    def __init__(self, chat: ChatFormat, texts: list[str], truncate: bool = False, delay: float = 0.0) -> None:
        self.chat, self.texts, self.truncate, self.delay = chat, list(texts), truncate, delay
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        self.prompts.append(list(prompt_ids))
        if self.delay:
            await asyncio.sleep(self.delay)
        ids = self.chat.encode(self.texts.pop(0))
        if not self.truncate:
            ids.append(self.chat.eos_token_id)
        return Generation(token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="length" if self.truncate else "stop",
                          weight_versions=[("3", 0, len(ids))], endpoint="fake")


class Adder(agentrl.Environment):
    name = "adder"
    max_turns = 3

    async def reset(self, task: agentrl.Task) -> str:
        return "What is 3 + 4?"

    @agentrl.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)

    @agentrl.tool
    def submit(self, answer: int) -> str:
        """Submit."""
        self.finish()
        return "ok"

    async def reward(self, messages: list[agentrl.Message]) -> float:
        return float("7" in messages[-1].content)


def call(name: str, **args: Any) -> str:
    import json

    return f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>'


async def test_two_turn_episode_contract(chat: ChatFormat) -> None:
    gen = Scripted(chat, [call("add", a=3, b=4), "The answer is 7."])
    traj = await run_episode(Adder, {"id": "t"}, gen, chat, SamplingConfig())
    traj.check()
    assert (traj.stop_reason, traj.reward, traj.num_turns, traj.num_tool_calls) == (StopReason.COMPLETED, 1.0, 2, 1)
    # Turn 2's prompt extends turn 1's prompt plus turn 1's output exactly.
    first_out = [*chat.encode(call("add", a=3, b=4)), chat.eos_token_id]
    assert gen.prompts[1][: len(gen.prompts[0]) + len(first_out)] == gen.prompts[0] + first_out
    assert gen.prompts[1] == traj.prompt_ids + traj.completion_ids[: len(gen.prompts[1]) - len(traj.prompt_ids)]
    # Masks, logprobs and versions line up: the tool observation is masked out.
    obs_len = len(gen.prompts[1]) - len(gen.prompts[0]) - len(first_out)
    assert traj.loss_mask == [1] * len(first_out) + [0] * obs_len + [1] * (len(traj.loss_mask) - len(first_out) - obs_len)
    assert all((v == 3) == bool(m) for v, m in zip(traj.versions, traj.loss_mask, strict=True))
    assert all((lp == -0.5) == bool(m) for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True))
    assert "<tool_response>" in chat.tokenizer.decode(traj.completion_ids) and traj.messages[2].content == "7"


async def test_malformed_calls_are_observations_then_parse_error(chat: ChatFormat) -> None:
    gen = Scripted(chat, ["<tool_call>{oops</tool_call>", call("add", a="x", b=1), "<tool_call>[]</tool_call>"])
    traj = await run_episode(Adder, {"id": "t"}, gen, chat, SamplingConfig(max_parse_errors=2))
    assert traj.num_malformed_tool_calls == 3
    assert traj.messages[2].content.startswith("Error: tool call is not valid JSON")
    assert "must be of type integer" in traj.messages[4].content
    assert traj.stop_reason == StopReason.MAX_TURNS and not traj.failed


async def test_tool_ends_episode_and_limits(chat: ChatFormat) -> None:
    traj = await run_episode(Adder, {"id": "t"}, Scripted(chat, [call("submit", answer=7)]), chat, SamplingConfig())
    assert (traj.stop_reason, traj.num_turns) == (StopReason.COMPLETED, 1)
    traj = await run_episode(Adder, {"id": "t"}, Scripted(chat, [call("add", a=1, b=1)] * 3), chat, SamplingConfig())
    assert (traj.stop_reason, traj.num_turns) == (StopReason.MAX_TURNS, 3)
    traj = await run_episode(Adder, {"id": "t"}, Scripted(chat, ["The answer", "x"], truncate=True), chat, SamplingConfig())
    assert traj.stop_reason == StopReason.MAX_TOKENS
    traj = await run_episode(Adder, {"id": "t"}, Scripted(chat, ["x"]), chat, SamplingConfig(max_context_tokens=16))
    assert traj.stop_reason == StopReason.MAX_TOKENS and traj.num_turns == 0


async def test_failures_are_recorded_as_data(chat: ChatFormat) -> None:
    class Broken(Adder):
        wall_time_limit_s = 0.2

        async def reward(self, messages: list[agentrl.Message]) -> float:
            raise ZeroDivisionError("bad reward")

    traj = await run_episode(Broken, {"id": "t"}, Scripted(chat, ["The answer is 7."]), chat, SamplingConfig())
    assert traj.stop_reason == StopReason.ENV_ERROR and traj.error.startswith("ZeroDivisionError: bad reward")
    slow = Scripted(chat, ["x"], delay=5)  # the engine never answers in time: infrastructure, not the agent
    traj = await run_episode(Broken, {"id": "t"}, slow, chat, SamplingConfig())
    assert traj.stop_reason == StopReason.WALL_TIMEOUT and traj.failed and traj.reward == 0.0

    class Dead:
        async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
            raise InferenceError("http://127.0.0.1:1 refused")

    traj = await run_episode(Adder, {"id": "t"}, Dead(), chat, SamplingConfig())
    assert traj.stop_reason == StopReason.INFERENCE_ERROR and traj.failed and "refused" in traj.error


async def test_an_episode_releases_its_engine_binding_however_it_ends(chat: ChatFormat) -> None:
    """The key an episode's turns stick to one engine with is forgotten when it ends (a long run would pile
    them up otherwise), after a completed episode as after a failed one."""
    from agentrl.inference.routing import EndpointPool

    class Bound(Scripted):
        def __init__(self, texts: list[str], fail: bool = False) -> None:
            super().__init__(chat, texts)
            self.pool, self.fail = EndpointPool(["http://a", "http://b"]), fail

        async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
            self.pool.pick(kw["key"])
            if self.fail:
                raise InferenceError("http://a refused")
            return await super().generate(prompt_ids, **kw)

        def forget(self, key: str) -> None:
            self.pool.forget(key)

    done = Bound([call("add", a=3, b=4), "The answer is 7."])
    traj = await run_episode(Adder, {"id": "t"}, done, chat, SamplingConfig())
    assert traj.stop_reason == StopReason.COMPLETED and not done.pool._sticky
    failed = Bound([], fail=True)
    traj = await run_episode(Adder, {"id": "t"}, failed, chat, SamplingConfig())
    assert traj.stop_reason == StopReason.INFERENCE_ERROR and not failed.pool._sticky
