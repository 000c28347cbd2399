"""One multi-turn calc episode per model family on a real vLLM server, with a tiny random model built on the
family's test tokenizer (published chat template and special tokens; see tests/fixtures_families.py).

The model's output is noise, so its first turn is a scripted tool call written exactly as the family's
template shows one (a random model never writes one); every later turn is sampled by the engine. What must
hold: the family's parser reads the call, the tool runs, the observation delta is the template's, the
engine's prompts extend each other token by token, and each engine turn ends on one of the family's stop
tokens (kept in the trajectory) or is cut by its token budget.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.envs.calc import CalcEnv
from agentrl.inference.client import Generation, InferenceClient
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.loop import run_episode
from tests.conftest import require
from tests.fixtures_families import FAMILIES, build_family_model

pytestmark = [pytest.mark.integration, pytest.mark.long]


class ShortCalc(CalcEnv):
    """Calc with short turns: the engine's turns are noise."""

    max_tokens_per_turn: ClassVar[int] = 24


def _tool_call_ids(chat: ChatFormat, tools: list[dict[str, Any]]) -> list[int]:
    """An assistant turn calling calculate(expression="2 + 3"), rendered by the family's template."""
    call = {"id": "abc123xyz", "type": "function", "function": {"name": "calculate",
                                                                "arguments": {"expression": "2 + 3"}}}
    msgs = [{"role": "user", "content": "Add them."}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    head = chat._render(msgs[:1], tools, gen=True)
    ids = chat.encode(chat._render(msgs, tools, gen=False)[len(head):])
    end = next(j for j, t in enumerate(ids) if t in chat.stop_token_ids)
    return ids[: end + 1]


class FirstTurnScripted:
    """The first turn is a scripted tool call; every later turn comes from the real engine (recorded)."""

    def __init__(self, inner: InferenceClient, first: list[int]) -> None:
        self.inner, self.first = inner, first
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        if not self.calls and self.first:
            gen = Generation(token_ids=list(self.first), logprobs=[0.0] * len(self.first), finish_reason="stop",
                             weight_versions=None, endpoint="scripted")
        else:
            gen = await self.inner.generate(prompt_ids, **kw)
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture(scope="module")
def family_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[ChatFormat, Any]]]:
    """Every family's engine, started at once (a start is mostly one core's work: on a machine of two, four
    starts side by side take about half as long as one after another), stopped at the module's end."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from concurrent.futures import ThreadPoolExecutor

    from transformers import AutoTokenizer

    from agentrl.inference import VLLMServer, VLLMServerConfig

    def prepare(name: str) -> tuple[ChatFormat, Any]:
        family = FAMILIES[name]
        model_dir: Path = build_family_model(family, tmp_path_factory.mktemp(name.replace(".", "_")))
        chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir), family.tool_parser, model_dir=model_dir)
        # eager: this checks chat templates and tool parsers on the engine, not compiled kernels
        cfg = VLLMServerConfig(model=str(model_dir), dtype="float32", max_model_len=1024, enable_lora=False,
                               worker_extension=None, startup_timeout_s=600, extra_args=["--enforce-eager"])
        # not bound to core 0 as one engine is by default: four engines starting at once use every core
        return chat, VLLMServer(cfg, tmp_path_factory.mktemp("vllm-logs"), env={"VLLM_CPU_OMP_THREADS_BIND": "nobind"})

    servers = {name: prepare(name) for name in FAMILIES}
    try:
        with ThreadPoolExecutor(len(servers)) as pool:
            for started in [pool.submit(server.start) for _, server in servers.values()]:
                started.result()
        yield servers
    finally:
        for _, server in servers.values():
            server.stop()


@pytest.fixture(params=list(FAMILIES))
def family_server(request: pytest.FixtureRequest, family_servers: dict[str, tuple[ChatFormat, Any]]) -> tuple:
    chat, server = family_servers[request.param]
    return request.param, chat, server


async def test_multi_turn_episode_on_the_engine(family_server: tuple[str, ChatFormat, Any]) -> None:
    name, chat, server = family_server
    tools = ShortCalc.tool_schemas()
    first = _tool_call_ids(chat, tools)
    stopped = 0
    async with InferenceClient([server.url]) as client:
        for task in ShortCalc.tasks("test")[:4]:
            gen = FirstTurnScripted(client, first)
            traj = await run_episode(ShortCalc, task, gen, chat, SamplingConfig(temperature=1.0))
            assert not traj.failed, (name, traj.error)
            traj.check()
            assert traj.num_turns >= 2 and traj.num_tool_calls >= 1, (name, traj.messages)
            assert [m.role for m in traj.messages[:4]] == ["system", "user", "assistant", "tool"]
            assert traj.messages[2].tool_calls[0].name == "calculate"
            assert traj.messages[3].content == "5"
            # the observation after the scripted call is the template's rendering of the tool result
            obs = traj.completion_ids[len(first): len(first) + traj.loss_mask[len(first):].index(1)]
            assert obs == chat.observation_ids([traj.messages[3].to_openai()], tools, ended_with=first[-1])
            assert "5" in chat.tokenizer.decode(obs)
            # token-faithful: each engine prompt is the previous prompt plus its output plus the delta
            for (p0, g0), (p1, _) in zip(gen.calls, gen.calls[1:], strict=False):
                assert p1[: len(p0) + len(g0.token_ids)] == p0 + g0.token_ids
            assert gen.calls[0][0] == traj.prompt_ids
            for _, g in gen.calls[1:]:  # engine turns: a stop token ends them (and is kept), or the budget
                if g.finish_reason == "stop":
                    assert g.token_ids[-1] in chat.stop_token_ids, (name, g.token_ids[-5:])
                    stopped += 1
                else:
                    assert g.finish_reason == "length" and len(g.token_ids) == ShortCalc.max_tokens_per_turn
            assert traj.stop_reason in (StopReason.COMPLETED, StopReason.MAX_TOKENS, StopReason.MAX_TURNS,
                                        StopReason.PARSE_ERROR), traj.stop_reason
    assert stopped >= 1, f"{name}: no engine turn ended on a stop token in 4 episodes"
