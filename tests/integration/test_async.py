"""The async engine on real parts: a generation that spans a weight update (partial rollout) on the
session vLLM server, and a short async training run with torchrun."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.config.run import load_config
from agentrl.core.versions import token_versions
from agentrl.inference import InferenceClient
from agentrl.orchestrator.loop import live_update
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun
from agentrl.tools.bench.models import lora_shapes, random_lora, save_lora
from agentrl.weight_sync.shm import SharedMemoryAdapterSync
from tests.integration.vllm_metrics import start_paused_mid_generation

pytestmark = pytest.mark.integration

NAME = "partial-policy"
PROMPT = [(i * 11) % 390 + 5 for i in range(40)]
N_TOKENS = 900  # prompt + completion within the session server's max_model_len (1024)
N_FIRST = 8  # tokens generated under v0 before the update is started


class _Trainer:
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]:
        return self.tensors


async def test_generation_spanning_an_update_keeps_its_prefix(vllm_server, tmp_path: Path) -> None:
    shapes = lora_shapes("tiny", 16)
    base = {n: (torch.zeros(s) if "lora_B" in n else torch.randn(s) * 0.1) for n, s in shapes.items()}
    trainer = _Trainer(base)
    async with InferenceClient([vllm_server.url], timeout_s=300) as client:
        await client.load_lora_adapter(NAME, str(save_lora(tmp_path / "v0", base)))
        await client.set_weight_version("0")

        async def greedy():
            return await client.generate(PROMPT, max_tokens=N_TOKENS, temperature=0.0, model=NAME,
                                         ignore_eos=True)

        ref = await greedy()
        assert token_versions(ref, -1) == [0] * N_TOKENS
        with SharedMemoryAdapterSync(trainer, client, NAME, reset="") as sync:
            trainer.tensors = random_lora(shapes, seed=7, std=0.5)  # far from v0: outputs must change
            try:
                running = await start_paused_mid_generation(client, vllm_server.url, greedy, first=N_FIRST,
                                                            total=N_TOKENS)
                m = await live_update(client, sync, 1, paused=True, mode="keep")
            finally:
                await client.resume()
            gen = await running
        assert m["engine_ms"] > 0
        versions = token_versions(gen, -1)
        assert 1 in versions, f"no token tagged v1: spans {gen.weight_versions}"
        k = versions.index(1)
        assert 0 < k < N_TOKENS, gen.weight_versions
        assert versions == [0] * k + [1] * (N_TOKENS - k), "versions must be one v0 span then one v1 span"
        assert gen.token_ids[:k] == ref.token_ids[:k], "the prefix generated before the update must be kept"
        assert gen.logprobs[:k] == pytest.approx(ref.logprobs[:k], abs=1e-4)
        assert gen.token_ids[k:] != ref.token_ids[k:], "tokens after the update must come from the new weights"
        await client.unload_lora_adapter(NAME)


async def test_async_training_run(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = {
        "env": "calc", "name": "async", "output_dir": str(tmp_path), "model": str(tiny_model_dir),
        "endpoints": [vllm_server.url], "steps": 4, "tasks_per_step": 4, "group_size": 4, "mode": "async",
        "pipeline": {"max_staleness": 1}, "eval_size": 8, "eval_every": 0, "checkpoint_every": 0,
        "time_limit_min": None, "adapter_name": "async-policy",
        "trainer": {"lora_train_embedding": False},  # the adapter path: synced in place into the shared engine
    }
    summary = await TrainingRun(load_config(None, overrides), progress=False).run()
    run_dir = tmp_path / "async"
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2, 3, 4] and summary["steps"] == 4
    for r in train:
        assert r["mode"] == "async" and r["num_episodes"] == 16
        # the default policy (accept) drops nothing; no trained token is older than the cap (η + 2)
        assert r["dropped_groups_total"] == 0 and r["train_staleness_max"] <= 3
        assert 0.0 <= r["trainer_idle_frac"] <= 1.0 and 0.0 <= r["inference_idle_frac"] <= 1.0
        assert r["engine_ms"] > 0 and r.get("fallback", 0.0) == 0.0  # the in-place path, not files
    # once a first publish (which gathers the adapter and lays out the segment) was made, the one-rank trainer
    # writes the adapter into the segment itself
    assert all(r["trainer_wrote"] == 1.0 for r in train[1:])
    # the producer started the next step's groups before the weights changed, and they were trained on
    assert sum(r["staleness_mean"] for r in train[1:]) > 0
    assert (run_dir / "pipeline.png").stat().st_size > 1000
