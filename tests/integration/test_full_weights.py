"""Full-weight RL on real parts: the trainer's whole model streamed into the session vLLM server (shared
memory, and the network path), a generation that spans a full-weight update, and full-weight training runs
(sync with a resume at another world size, async), whose ``final_model`` loads in transformers and vLLM.

Every test here replaces the session engine's base weights; the module fixture loads the model's own weights
back afterwards, so the tests that follow see the engine they expect.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.run import load_config
from agentrl.config.trainer import TrainerConfig
from agentrl.core.types import TrainSample
from agentrl.core.versions import engine_label, token_versions
from agentrl.inference import InferenceClient
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun
from agentrl.trainer.client import TrainerProcess
from agentrl.weight_sync.full import FullWeightSync
from tests.integration.vllm_metrics import start_paused_mid_generation

pytestmark = [pytest.mark.integration, pytest.mark.long]

PROMPT = [(i * 13) % 390 + 5 for i in range(32)]
N_TOKENS = 900  # prompt + completion within the session server's max_model_len (1024)


@pytest.fixture(scope="module")
def engine(weights_engine: Any) -> Any:
    """The session server, its own weights loaded back after this module's tests."""
    return weights_engine


@pytest.fixture()
async def trainer(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[TrainerProcess]:
    """A one-rank full-weight trainer of the tiny model, with a learning rate that moves it far in one step."""
    proc = TrainerProcess(TrainerConfig(model_path=str(tiny_model_dir), lora=False, lr=3e-3, device="cpu"),
                          tmp_path / "trainer")
    await asyncio.to_thread(proc.start)
    try:
        yield proc
    finally:
        await asyncio.to_thread(proc.close)


def _scored(prompt: list[int], gen: Any, advantage: float = 0.0) -> TrainSample:
    """The generation as a trainer sample (greedy tokens: scored at temperature 1, which vLLM reports)."""
    ids = list(prompt) + list(gen.token_ids)
    n, m = len(prompt), len(gen.token_ids)
    return TrainSample(ids, [0] * n + [1] * m, [0.0] * n + list(gen.logprobs), advantage, [-1] * n + [0] * m)


async def _step(trainer: TrainerProcess, client: InferenceClient) -> None:
    """One full-weight training step on a few sampled completions (alternating advantages)."""
    gens = await asyncio.gather(*(client.generate(PROMPT[i:] or PROMPT, max_tokens=24, temperature=1.0,
                                                  model="base", seed=i) for i in range(4)))
    samples = [_scored(PROMPT[i:] or PROMPT, g, 1.0 if i % 2 else -1.0) for i, g in enumerate(gens)]
    await trainer.train(samples, policy_version=0)


def _mae(xs: list[float], ys: list[float]) -> float:
    return sum(abs(a - b) for a, b in zip(xs, ys, strict=True)) / max(len(xs), 1)


async def _agreement(client: InferenceClient, trainer: TrainerProcess) -> float:
    """Mean |engine − trainer| logprob over a greedy completion the engine generates now."""
    gen = await client.generate(PROMPT, max_tokens=48, temperature=0.0, model="base")
    return _mae(gen.logprobs, (await trainer.logprobs([_scored(PROMPT, gen)]))[0][len(PROMPT):])


async def test_full_sync_makes_the_engine_serve_the_trainers_weights(engine, trainer: TrainerProcess) -> None:
    """Shared memory (several buckets, double-buffered), then the network path (buckets in the call body)."""
    async with InferenceClient([engine.url], timeout_s=300) as client:
        with FullWeightSync(trainer, client, bucket_bytes=256 << 10) as shm_sync:
            await shm_sync.publish(0)
            assert len(shm_sync.buckets) > 2, "the tiny model must span several buckets for this test"
            initial = await _agreement(client, trainer)
            await _step(trainer, client)
            stale = await _agreement(client, trainer)
            m = await shm_sync.publish(1)
            after_shm = await _agreement(client, trainer)
        with FullWeightSync(trainer, client, remote=[engine.url], bucket_bytes=256 << 10) as net_sync:
            await _step(trainer, client)
            stale_net = await _agreement(client, trainer)
            m_net = await net_sync.publish(2)
            after_net = await _agreement(client, trainer)
            gen = await client.generate(PROMPT, max_tokens=8, temperature=0.0, model="base")
    assert token_versions(gen, -1) == [2] * 8 and gen.weight_versions[-1][0] == engine_label(2)
    assert initial < 1e-5, f"before any update the engine and the trainer hold the same weights: {initial:.2e}"
    assert stale > 1e-2 and stale_net > 1e-2, f"one step at lr 3e-3 must move the policy ({stale:.2e})"
    for after, before in ((after_shm, stale), (after_net, stale_net)):
        assert after < 1e-4 and after < before / 100, f"engine vs trainer after a sync: {after:.2e} ({before:.2e})"
    for rec in (m, m_net):
        assert rec["engines_failed"] == 0 and rec["weight_bytes"] > 0 and rec["full_load_ms"] > 0
    await _shards_equal_gathered(trainer)


async def _shards_equal_gathered(trainer: TrainerProcess) -> None:
    """A bucket each rank writes its shards of equals the bucket gathered for a trainer on another host."""
    from multiprocessing import shared_memory

    from agentrl.weight_sync.buckets import layout_bytes, plan_buckets

    layout = plan_buckets(await trainer.weight_specs(), "float32", 1 << 30)[0]
    nbytes = layout_bytes(layout)
    shm = shared_memory.SharedMemory(create=True, size=nbytes + 64)
    try:
        here = await trainer.write_weight_bucket(layout, shm.name, nbytes + 64, 64)
        away = await trainer.write_weight_bucket(layout, None, 0, 0)  # as for a trainer on another host
        assert here["written"] and here["mode"] == "shards" and not away["written"]
        assert bytes(shm.buf[64:64 + nbytes]) == away["data"]
    finally:
        shm.close()
        shm.unlink()


async def test_a_generation_spanning_a_full_weight_update_continues_on_the_new_weights(
        engine, trainer: TrainerProcess) -> None:
    async with InferenceClient([engine.url], timeout_s=300) as client:
        with FullWeightSync(trainer, client) as sync:
            await sync.publish(0)

            async def greedy() -> Any:
                return await client.generate(PROMPT, max_tokens=N_TOKENS, temperature=0.0, model="base",
                                             ignore_eos=True, stop_token_ids=[])

            ref = await greedy()
            await _step(trainer, client)
            try:
                running = await start_paused_mid_generation(client, engine.url, greedy, first=8, total=N_TOKENS)
                await sync.publish(1)  # pauses (keep: already), loads, relabels, resets the cache, resumes
            finally:
                await client.resume()
            gen = await running
        new = (await trainer.logprobs([_scored(PROMPT, gen)]))[0][len(PROMPT):]
    versions = token_versions(gen, -1)
    assert 1 in versions, f"no token tagged v1: spans {gen.weight_versions}"
    k = versions.index(1)
    assert 0 < k < N_TOKENS and versions == [0] * k + [1] * (N_TOKENS - k), gen.weight_versions
    assert gen.token_ids[:k] == ref.token_ids[:k], "the prefix generated before the update must be kept"
    # the tokens after the update were produced by the new weights (KV recomputed), those before by the old
    assert _mae(gen.logprobs[k:], new[k:]) < 1e-4
    assert _mae(gen.logprobs[:k], new[:k]) > 1e-3


async def test_full_weight_training_sync_then_async_resume_on_two_ranks_and_final_model(engine, tiny_model_dir: Path,
                                                                      tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from agentrl.inference import VLLMServer, VLLMServerConfig

    base = {
        "env": "calc", "output_dir": str(tmp_path), "model": str(tiny_model_dir), "endpoints": [engine.url],
        "tasks_per_step": 4, "group_size": 4, "eval_size": 2, "eval_every": 0, "time_limit_min": None,
        "engine_warmup": False,
        "trainer": {"lora": False, "lr": 1e-5},
    }
    sync_cfg = {**base, "name": "full-sync", "steps": 2, "checkpoint_every": 2}
    await TrainingRun(load_config(None, sync_cfg), progress=False).run()
    run_dir = tmp_path / "full-sync"
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2]
    for r in train:
        assert r["num_failed"] == 0 and r["weight_bytes"] > 0 and r["engines_failed"] == 0
        if r["num_trained"]:  # on-policy after every full-weight sync: engine and trainer logprobs agree
            assert r["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02)
            assert abs(r["train_behav_logp_diff"]) < 0.02
    # resume from the full-weight checkpoint of step 2 on two ranks (it was written by one), asynchronously:
    # full-weight updates land while episodes run, and those episodes continue under the new weights
    resumed = {**sync_cfg, "steps": 5, "nproc": 2, "mode": "async", "pipeline": {"max_staleness": 1},
               "checkpoint_every": 0}
    await TrainingRun(load_config(None, resumed), resume=True, progress=False).run()
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5] and [r["version"] for r in train[2:]] == [3, 4, 5]
    assert all(r["mode"] == "async" and r["train_staleness_max"] <= 3 and r["engines_failed"] == 0
               for r in train[2:])  # no trained token older than the cap, η + 2
    assert sum(r["staleness_mean"] for r in train[3:]) > 0, "no episode overlapped a full-weight update"

    final = run_dir / "final_model"
    assert (final / "config.json").is_file() and list(final.glob("*.safetensors"))
    assert (final / "tokenizer_config.json").is_file()
    # the final model loads as it is in transformers and in vLLM, and both decode the same greedy tokens
    import torch

    hf = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    with torch.no_grad():
        out = hf.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False)
    hf_tokens = out[0, len(PROMPT):].tolist()
    server = VLLMServer(VLLMServerConfig(model=str(final), dtype="float32", max_model_len=256, enable_lora=False),
                        tmp_path / "final-logs")
    await asyncio.to_thread(server.start)
    try:
        async with InferenceClient([server.url], timeout_s=120) as client:
            gen = await client.generate(PROMPT, max_tokens=12, temperature=0.0, model="base", ignore_eos=True)
    finally:
        await asyncio.to_thread(server.stop)
    assert gen.token_ids[: len(hf_tokens)] == hf_tokens
