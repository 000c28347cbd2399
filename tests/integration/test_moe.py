"""MoE routing capture on the real CPU vLLM engine: what the engine records per request is the routing its
own weights compute, for prompt, generated and prefix-cached positions alike."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import agentrl
from tests.conftest import require

pytestmark = pytest.mark.long

log = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def moe_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random tiny Qwen3-MoE model (4 layers of 8 experts, top-2) on the embedded model's tokenizer and
    chat template (what a run's model checks need)."""
    import json
    import shutil

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.fixtures_model import build_random_tiny_model

    out = build_random_tiny_model(tmp_path_factory.mktemp("tiny-moe"), seed=5, moe=True)
    for f in tiny_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "chat_template", "special_tokens", "generation_config")):
            shutil.copy(f, out / f.name)
    cfg = json.loads((out / "config.json").read_text())
    tok = json.loads((tiny_model_dir / "config.json").read_text())
    cfg.update(vocab_size=tok["vocab_size"], eos_token_id=tok["eos_token_id"], pad_token_id=tok["pad_token_id"],
               num_hidden_layers=4)
    (out / "config.json").write_text(json.dumps(cfg))
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out)).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def moe_engine(moe_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """One vLLM server of the MoE model for the session (no LoRA: the CPU build has no MoE LoRA path)."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.inference import VLLMServer, VLLMServerConfig

    cfg = VLLMServerConfig(model=str(moe_model_dir), dtype="float32", max_model_len=1024, enable_lora=False,
                           startup_timeout_s=600)
    server = VLLMServer(cfg, tmp_path_factory.mktemp("vllm-moe-logs"))
    server.start()
    log.info("MoE vLLM server %s ready in %.1fs", server.url, server.startup_s or -1)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def moe_server(moe_engine, moe_model_dir: Path) -> Iterator:
    """The session's MoE engine, with the model's own weights restored after a test that trained it."""
    yield moe_engine
    from agentrl.inference import InferenceClient

    async def restore() -> None:
        async with InferenceClient([moe_engine.url], timeout_s=300) as client:
            out = (await client.collective_rpc("agentrl_load_weights_from_path",
                                               kwargs={"path": str(moe_model_dir)}, timeout=300))[0]
            assert all(w.get("ok") for w in out), out
            await client.reset_prefix_cache()
            await client.set_weight_version("0")

    asyncio.run(restore())


def _reference_topk(model_dir: Path, ids: list[int], top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """The routers' top-k of every position recomputed by transformers from the same weights, and whether
    each (position, layer) decision is clear (the k-th and (k+1)-th router probabilities differ by > 1e-4)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), output_router_logits=True).router_logits
    probs = torch.stack([x.float().softmax(-1) for x in logits], dim=1)  # [T, L, E]
    top = probs.topk(top_k + 1, dim=-1)
    clear = (top.values[..., top_k - 1] - top.values[..., top_k]) > 1e-4
    return top.indices[..., :top_k].numpy(), clear.numpy()


def test_capture_matches_a_reference_forward(moe_server, moe_model_dir: Path) -> None:
    """Three requests: a first turn, its second turn (prefix from the cache, tool tokens appended) asking only
    for the positions it lacks, and another request sharing the first prompt (cached blocks computed by the
    first request). Every captured row equals the routing transformers computes from the same weights."""
    from agentrl.inference import InferenceClient

    async def run() -> tuple[list[int], np.ndarray, list[int], np.ndarray]:
        async with InferenceClient([moe_server.url], timeout_s=120) as client:
            enabled = await client.enable_routing_capture()
            rec = enabled[moe_server.url]
            assert rec["ok"], rec
            assert (rec["layers"], rec["top_k"], rec["experts"], rec["dtype"]) == (4, 2, 8, "uint8")
            prompt = [(7 * i) % 900 + 5 for i in range(70)]  # > 4 KV blocks, so the cache has whole blocks
            g1 = await client.generate(prompt, max_tokens=12, temperature=1.0, ignore_eos=True, seed=1,
                                       routing_from=0)
            assert g1.routing is not None and g1.routing.start == 0
            assert g1.routing.rows.shape == (len(prompt) + 12 - 1, 4, 2)  # the last token is never fed
            turn2 = prompt + g1.token_ids + [11, 12, 13, 14, 15]
            have = g1.routing.rows.shape[0]
            g2 = await client.generate(turn2, max_tokens=6, temperature=1.0, ignore_eos=True, seed=2,
                                       routing_from=have)
            assert g2.routing is not None and g2.routing.start == have
            episode = np.concatenate([g1.routing.rows, g2.routing.rows])
            g3 = await client.generate(prompt, max_tokens=4, temperature=1.0, ignore_eos=True, seed=3,
                                       routing_from=0)
            assert g3.routing is not None
            return turn2 + g2.token_ids, episode, prompt + g3.token_ids, g3.routing.rows

    ids, rows, ids3, rows3 = asyncio.run(run())
    for seq, got in ((ids, rows), (ids3, rows3)):
        assert got.shape[0] == len(seq) - 1
        ref, clear = _reference_topk(moe_model_dir, seq[:-1], 2)
        same = (np.sort(got.astype(np.int64), -1) == np.sort(ref, -1)).all(-1)
        assert clear.mean() > 0.9, "the random model's routing is too close to ties to compare"
        assert same[clear].all(), f"{int((~same & clear).sum())} clear decisions differ from the reference"


def test_routing_capture_is_refused_on_a_dense_engine(vllm_server) -> None:
    """A dense model's engine says so instead of returning empty routing."""
    from agentrl.inference import InferenceClient

    async def run() -> dict:
        async with InferenceClient([vllm_server.url], timeout_s=60) as client:
            return (await client.enable_routing_capture())[vllm_server.url]

    rec = asyncio.run(run())
    assert not rec["ok"] and rec["code"] == "routing.unavailable"
    assert "not a mixture-of-experts model" in rec["error"]


class Parity(agentrl.Environment):
    """One free-text turn, rewarded by the parity of its length: a random model earns varied rewards, so
    every group carries signal and every step trains."""

    name: ClassVar[str] = "parity"
    max_turns: ClassVar[int] = 1
    max_tokens_per_turn: ClassVar[int] = 48

    @classmethod
    def tasks(cls, split: str = "train") -> list[agentrl.Task]:
        return [{"id": f"{split}-{i}", "prompt": f"Say something about {i}."} for i in range(16)]

    async def reset(self, task: agentrl.Task) -> str:
        return str(task["prompt"])

    async def reward(self, messages: list[agentrl.Message]) -> float:
        return float(len(messages[-1].content) % 2)


def test_moe_lora_training_merges_and_replays_routing_sync_then_async(moe_server, moe_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    """A LoRA run of a MoE model on the CPU build: the engines run without LoRA and merge each adapter the
    trainer publishes into their weights (the run says so; only the adapter crosses), every trajectory carries the engine's routing, and the trainer replays it (on-policy
    right after each merged sync, the trainer's logprobs match the engine's); then asynchronously, with
    updates landing while episodes run."""
    from agentrl.config.run import load_config
    from agentrl.orchestrator.metrics import read_jsonl
    from agentrl.orchestrator.run import TrainingRun

    base = {
        "env": f"{Path(__file__).resolve()}:Parity", "output_dir": str(tmp_path), "model": str(moe_model_dir), "endpoints": [moe_server.url],
        "tasks_per_step": 4, "group_size": 4, "eval_size": 2, "eval_every": 0, "time_limit_min": None,
        "engine_warmup": False, "inference": {"max_model_len": 512},
        "trainer": {"lr": 5e-3, "micro_batch_tokens": 2048},
    }
    async def sync_run() -> None:
        run = await TrainingRun(load_config(None, {**base, "name": "moe-sync", "steps": 2}), progress=False).open()
        assert run.cfg.transport.transport == "merged" and not run.cfg.inference.enable_lora  # settled on resolution
        await run.run()

    asyncio.run(sync_run())
    train = [r for r in read_jsonl(tmp_path / "moe-sync" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2]
    for r in train:
        assert r["num_failed"] == 0 and r["adapter_bytes"] > 0 and "weight_bytes" not in r
        assert r["routing_coverage"] == 1.0
        assert r["train_routing_replayed_frac"] == 1.0  # the hook forced every recorded decision
        assert 0.0 <= r["train_routing_mismatch_frac"] <= 1.0
        # on-policy after each merged sync: the trainer, replaying the engine's routing, agrees with it
        assert r["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02)
    assert (tmp_path / "moe-sync" / "final_adapter" / "adapter_config.json").is_file()

    asyncio.run(TrainingRun(load_config(None, {**base, "name": "moe-async", "steps": 4, "mode": "async",
                                                "pipeline": {"max_staleness": 1}}), progress=False).run())
    train = [r for r in read_jsonl(tmp_path / "moe-async" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2, 3, 4]
    assert all(r["routing_coverage"] == 1.0 and r["train_routing_replayed_frac"] == 1.0 for r in train)
    assert sum(r["staleness_mean"] for r in train[1:]) > 0, "no episode overlapped a weight update"


def test_moe_full_weight_training_async_replays_routing(moe_server, moe_model_dir: Path, tmp_path: Path) -> None:
    """Full fine-tuning of a MoE model, asynchronously: every weight (the fused experts split back to the
    checkpoint's per-expert tensors) reaches the engine while episodes run; routing recorded under the old
    weights is replayed, and the first step, on-policy, agrees with the engine."""
    from agentrl.config.run import load_config
    from agentrl.orchestrator.metrics import read_jsonl
    from agentrl.orchestrator.run import TrainingRun

    cfg = {
        "env": f"{Path(__file__).resolve()}:Parity", "output_dir": str(tmp_path), "model": str(moe_model_dir), "endpoints": [moe_server.url],
        "name": "moe-full", "steps": 3, "mode": "async", "pipeline": {"max_staleness": 1},
        "tasks_per_step": 4, "group_size": 4, "eval_size": 2, "eval_every": 0, "time_limit_min": None,
        "engine_warmup": False, "inference": {"max_model_len": 512},
        "trainer": {"lora": False, "lr": 1e-4, "micro_batch_tokens": 2048},
    }
    asyncio.run(TrainingRun(load_config(None, cfg), progress=False).run())
    train = [r for r in read_jsonl(tmp_path / "moe-full" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2, 3]
    assert all(r["routing_coverage"] == 1.0 and r["train_routing_replayed_frac"] == 1.0 for r in train)
    assert train[0]["staleness_max"] == 0 and train[0]["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02)
    assert sum(r["staleness_mean"] for r in train[1:]) > 0, "no episode overlapped a weight update"
    assert (tmp_path / "moe-full" / "final_model" / "config.json").is_file()


def test_env_server_rollouts_return_routing(moe_server, moe_model_dir: Path, vllm_server, tmp_path: Path) -> None:
    """``POST /v1/rollouts`` with ``return_routing``: the trajectory carries the engine's routing of every fed
    position; an engine that cannot capture routing gets a 422, not a trajectory without it."""
    import httpx

    from agentrl.core.types import Trajectory
    from agentrl.tools.bench.env_server import ServerProcess

    with ServerProcess(["calc"], extra=["--tokenizer", str(moe_model_dir)], log_path=tmp_path / "s.log") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        body = {"env": "calc", "task_id": "calc-test-0", "base_url": moe_server.url, "model": "base",
                "sampling": {"temperature": 1.0, "max_context_tokens": 512}, "return_routing": True}
        r = httpx.post(server.url + "/v1/rollouts", json=body, headers=headers, timeout=300)
        assert r.status_code == 200, r.text
        traj = Trajectory.model_validate(r.json()["trajectory"])
        traj.check()
        assert not traj.failed, traj.error
        assert traj.routing is not None and (traj.routing.layers, traj.routing.top_k) == (4, 2)
        assert traj.routing.n == len(traj.prompt_ids) + len(traj.completion_ids) - 1
        r = httpx.post(server.url + "/v1/rollouts", json={**body, "base_url": vllm_server.url}, headers=headers,
                       timeout=300)
        assert r.status_code == 422 and "cannot capture MoE routing" in r.text


async def test_an_agent_program_of_a_moe_model_with_truncated_sampling_is_trained_with_replay_and_masks(
        moe_server, moe_model_dir: Path, tmp_path: Path) -> None:
    """The whole data contract through the policy endpoint: an unmodified `openai` SDK agent drives episodes of
    the tiny MoE model at top-k 20 and min-p 0.02; every recorded row carries the engine's routing of every fed
    position and the kept set of every sampled token, and the trainer, replaying both, scores what the engine
    sampled (on-policy: IS weight mean 1)."""
    import json
    import sys

    from agentrl.config.run import load_config
    from agentrl.orchestrator.metrics import read_jsonl
    from agentrl.orchestrator.run import TrainingRun
    from tests.integration.test_blackbox_train import EXAMPLES, WRAPPER

    wrapper, counters = tmp_path / "agent_with_reward.py", tmp_path / "counters"
    wrapper.write_text(WRAPPER)
    counters.mkdir()
    overrides = {
        "env": "calc", "name": "moe-agent", "output_dir": str(tmp_path), "model": str(moe_model_dir),
        "endpoints": [moe_server.url], "steps": 2, "tasks_per_step": 2, "group_size": 2, "eval_size": 2,
        "eval_every": 0, "checkpoint_every": 0, "engine_warmup": False, "time_limit_min": None,
        "sampling": {"top_k": 20, "min_p": 0.02, "max_context_tokens": 512}, "inference": {"max_model_len": 512},
        "agent": {"command": [sys.executable, str(wrapper), str(counters),
                              json.dumps([[str(EXAMPLES / "blackbox_agent.py")]])],
                  "reward": "agent", "timeout_s": 120},
        "trainer": {"micro_batch_tokens": 2048},
    }
    await TrainingRun(load_config(None, overrides), progress=False).run()
    train = [r for r in read_jsonl(tmp_path / "moe-agent" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["version"] for r in train] == [1, 2]
    for r in train:
        assert r["num_failed"] == 0, r["errors"]
        assert r["routing_coverage"] == 1.0 and r["train_routing_replayed_frac"] == 1.0, r
        # float32 on both sides, the same weights: the trainer's own routing is the engine's (0.0 measured; a
        # decision whose two experts tie to float rounding could still differ)
        assert r["train_routing_mismatch_frac"] <= 1e-3, r
        assert r["sampling_mask_coverage"] == 1.0 and r["mask_bytes_per_token"] > 0, r
        assert r["num_trained"] >= 4 and r["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02), r
