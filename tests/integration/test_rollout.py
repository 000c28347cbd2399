"""The agent loop on a real vLLM server with the embedded tiny model and the calc environment."""

from __future__ import annotations

from typing import Any

import pytest

from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.envs.calc import CalcEnv
from agentrl.inference.client import Generation, InferenceClient
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.groups import RolloutWorkers
from agentrl.rollout.loop import run_episode

pytestmark = pytest.mark.integration


class Recording:
    """Wraps a real client and records every (prompt, generation) pair it serves."""

    def __init__(self, inner: InferenceClient) -> None:
        self.inner = inner
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        gen = await self.inner.generate(prompt_ids, **kw)
        self.calls.append((list(prompt_ids), gen))
        return gen


@pytest.fixture(scope="module")
def chat(tiny_model_dir) -> ChatFormat:
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(tiny_model_dir))


async def test_multi_turn_calc_rollout_is_token_faithful(vllm_server, chat: ChatFormat) -> None:
    async with InferenceClient([vllm_server.url]) as client:
        await client.set_weight_version("0")  # the session server is shared: other tests relabel it
        rec = Recording(client)
        tasks = CalcEnv.tasks("test")[:8]
        multi_turn = 0
        for task in tasks:
            rec.calls.clear()
            traj = await run_episode(CalcEnv, task, rec, chat, SamplingConfig(temperature=0.0))
            assert not traj.failed, traj.error
            traj.check()
            # The contract: every completion token is either the engine's output (mask 1, with its
            # logprob) or a template delta (mask 0), and turn k+1's prompt extends turn k's exactly.
            for k in range(len(rec.calls) - 1):
                prompt_k, gen_k = rec.calls[k]
                prompt_next, _ = rec.calls[k + 1]
                assert prompt_next[: len(prompt_k) + len(gen_k.token_ids)] == prompt_k + gen_k.token_ids
            assert rec.calls[0][0] == traj.prompt_ids
            model_ids = [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m]
            assert model_ids == [t for _, g in rec.calls for t in g.token_ids]
            model_lps = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
            assert model_lps == pytest.approx([lp for _, g in rec.calls for lp in g.logprobs])
            assert all(lp <= 0.0 for lp in model_lps)
            assert all(v == 0 for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m)
            if traj.num_turns >= 2:
                multi_turn += 1
                assert traj.num_tool_calls >= 1
                assert [m.role for m in traj.messages[:4]] == ["system", "user", "assistant", "tool"]
        assert multi_turn >= 1, "the warmed-up tiny model should call the calculator at least once"


async def test_workers_run_groups_with_rewards(vllm_server, chat: ChatFormat) -> None:
    async with InferenceClient([vllm_server.url]) as client:
        workers = RolloutWorkers(CalcEnv, client, chat, SamplingConfig(), max_concurrency=16)
        groups = await workers.run_groups(CalcEnv.tasks("test")[:4], 4)
    assert [len(g) for g in groups] == [4, 4, 4, 4]
    for g in groups:
        assert len({t.group_id for t in g}) == 1
    trajs = [t for g in groups for t in g]
    assert all(t.reward in (0.0, 1.0) for t in trajs)
    assert not any(t.failed for t in trajs), [t.error for t in trajs if t.failed]
    assert all(t.timings.generate_s > 0 for t in trajs)


async def test_dead_endpoint_is_recorded_not_raised(chat: ChatFormat) -> None:
    async with InferenceClient(["http://127.0.0.1:9"], timeout_s=2, max_retries=1, backoff_s=0.05) as client:
        traj = await run_episode(CalcEnv, CalcEnv.tasks("test")[0], client, chat, SamplingConfig())
    assert traj.stop_reason == StopReason.INFERENCE_ERROR
    assert traj.error and "127.0.0.1:9" in traj.error
