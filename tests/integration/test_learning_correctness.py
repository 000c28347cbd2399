"""Training-correctness mechanisms on the real engine (the session vLLM server, the embedded tiny model):

- the engine reports logprobs of the distribution it samples from (temperature applied), checked against
  the model itself run by transformers;
- on the ``/v1/completions`` fallback (no weight-version spans) a generation that spans a real weight
  update is tagged with the version in force when it was sent, never the newer one;
- an engine overloaded with far more episodes than it serves quickly produces no ``timeout`` episode
  (waiting for the engine is not the agent's time), so nothing is trained on as a timeout negative.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import agentrl
from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.core.utils.heap import freeze_heap
from agentrl.envs.calc import CalcEnv
from agentrl.inference import InferenceClient
from agentrl.inference.wire import Generation
from agentrl.orchestrator.loop import live_update
from agentrl.orchestrator.samples import to_samples
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.groups import RolloutWorkers
from agentrl.rollout.loop import run_episode
from agentrl.tools.bench.models import lora_shapes, random_lora, save_lora
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.integration.vllm_metrics import start_paused_mid_generation

pytestmark = pytest.mark.integration

PROMPT = [(i * 13) % 390 + 5 for i in range(24)]


@pytest.fixture(scope="module")
def chat(tiny_model_dir: Path) -> ChatFormat:
    from transformers import AutoTokenizer

    return ChatFormat(AutoTokenizer.from_pretrained(tiny_model_dir))


def reference_logprobs(model_dir: Path, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:
    """log softmax(logits / T) of each generated token, by the model run in transformers (float32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


async def test_engine_logprobs_are_of_the_sampled_distribution(vllm_server, tiny_model_dir: Path) -> None:
    async with InferenceClient([vllm_server.url]) as client:
        assert (await client.reports_sampling_logprobs(PROMPT)) == {vllm_server.url: True}
        gen = await client.generate(PROMPT, max_tokens=48, temperature=0.5, seed=3, ignore_eos=True)
    at_t = reference_logprobs(tiny_model_dir, PROMPT, gen.token_ids, 0.5)
    at_1 = reference_logprobs(tiny_model_dir, PROMPT, gen.token_ids, 1.0)
    err_t = max(abs(a - b) for a, b in zip(gen.logprobs, at_t, strict=True))
    err_1 = sum(abs(a - b) for a, b in zip(gen.logprobs, at_1, strict=True)) / len(at_1)
    assert err_t < 2e-3, f"engine logprobs differ from log softmax(logits / T) by up to {err_t:.2e}"
    assert err_1 > 20 * err_t, "the check must tell the sampled distribution from temperature 1"


class LongTalk(agentrl.Environment):
    """One long model turn and no tools (so a weight update can land inside it)."""

    name: ClassVar[str] = "long-talk"
    max_turns: ClassVar[int] = 1
    max_tokens_per_turn: ClassVar[int] = 600

    async def reset(self, task: agentrl.Task) -> str:
        return "Talk for a long time."

    async def reward(self, messages: list[agentrl.Message]) -> float:
        return 0.0


class UpdateMidGeneration:
    """Serves the episode's generation from the real engine with EOS ignored, and lands a real weight
    update (v0 -> v1, pause keep) while it runs; the run's version moves to 1 with the update."""

    def __init__(self, client: InferenceClient, url: str, sync: SharedMemoryAdapterSync, state: dict[str, int]):
        self.client, self.url, self.sync, self.state = client, url, sync, state
        self.generation: Generation | None = None

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        kw["stop_token_ids"] = []  # run to the token budget
        try:
            running = await start_paused_mid_generation(
                self.client, self.url, lambda: self.client.generate(prompt_ids, **kw, ignore_eos=True),
                first=8, total=kw["max_tokens"])
            await live_update(self.client, self.sync, 1, paused=True, mode="keep")
            self.state["version"] = 1
        finally:
            await self.client.resume()
        self.generation = await running
        return self.generation


class _Tensors:
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors


async def test_completions_fallback_tags_tokens_with_the_send_time_version(vllm_server, chat: ChatFormat,
                                                                          tmp_path: Path) -> None:
    name = "fallback-policy"
    shapes = lora_shapes("tiny", 16)
    source = _Tensors(random_lora(shapes, seed=11, std=0.1))
    state = {"version": 0}
    async with InferenceClient([vllm_server.url], timeout_s=300) as client:
        client.pool.endpoints[0].mode = "completions"  # an engine without the token-in/out route
        await client.load_lora_adapter(name, str(save_lora(tmp_path / "v0", source.tensors)))
        await client.set_weight_version("0")
        try:
            with SharedMemoryAdapterSync(source, client, name, reset="") as sync:
                source.tensors = random_lora(shapes, seed=12, std=0.5)
                engine = UpdateMidGeneration(client, vllm_server.url, sync, state)
                traj = await run_episode(LongTalk, {"id": "t"}, engine, chat, SamplingConfig(), model=name,
                                         policy_version=lambda: state["version"])
        finally:
            await client.unload_lora_adapter(name)
    assert traj.error is None, traj.error
    assert engine.generation is not None and engine.generation.weight_versions is None, "not the fallback route"
    assert state["version"] == 1 and traj.stop_reason is StopReason.MAX_TOKENS, traj.error
    model_versions = {v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m}
    assert model_versions == {0}, f"tokens sent under v0 were tagged {model_versions} (never newer than v0)"


class TightCalc(CalcEnv):
    """calc with a tight limit on the agent's own time (its calculator calls take microseconds)."""

    agent_time_limit_s: ClassVar[float] = 0.5


async def test_an_overloaded_engine_produces_no_timeout_negatives(vllm_server, chat: ChatFormat) -> None:
    """256 episodes at once on one CPU engine: each waits seconds for its turns, far past the agent's 0.5 s,
    and none ends as ``timeout`` (nor fails): the queueing is not the agent's doing. The heap is frozen
    first, as ``agentrl train`` does, so that full garbage collections stay short."""
    freeze_heap()
    async with InferenceClient([vllm_server.url]) as client:
        await client.set_weight_version("0")
        workers = RolloutWorkers(TightCalc, client, chat, SamplingConfig(), max_concurrency=256)
        try:
            groups = await workers.run_groups(list(CalcEnv.tasks("train"))[:64], 4)
        finally:
            gc.unfreeze()
    trajs = [t for g in groups for t in g]
    waited = sorted(t.timings.generate_s for t in trajs)
    assert waited[len(waited) // 2] > 4 * TightCalc.agent_time_limit_s, f"engine not overloaded: {waited[-5:]}"
    bad = [(t.stop_reason.value, t.error, round(t.timings.tool_s, 4)) for t in trajs
           if t.stop_reason is StopReason.TIMEOUT or t.failed]
    assert not bad, bad[:5]
    # microsecond calculator calls: what is charged is their own time, not the busy process's stalls
    assert max(t.timings.tool_s for t in trajs) < 0.4 * TightCalc.agent_time_limit_s
    _, stats = to_samples(groups)
    assert stats.stop_reasons.get("timeout", 0) == 0 and stats.num_episodes == 256
