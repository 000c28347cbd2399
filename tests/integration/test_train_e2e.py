"""A whole synchronous training run on real parts: vLLM (the session server), torchrun, calc; then resume."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.config.run import load_config
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_train_two_steps_then_resume(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = {
        "env": "calc", "name": "e2e", "output_dir": str(tmp_path), "model": str(tiny_model_dir),
        "endpoints": [vllm_server.url], "steps": 2, "tasks_per_step": 4, "group_size": 4,
        "eval_size": 8, "eval_every": 0, "checkpoint_every": 1, "time_limit_min": None,
    }
    summary = await TrainingRun(load_config(None, overrides), progress=False).run()
    run_dir = tmp_path / "e2e"
    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["version"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2]
    warm = [r for r in recs if r["kind"] == "warmup"]  # the engine warm-up ran on the adapter, before eval 0
    assert len(warm) == 1 and warm[0]["warmup_failed"] == 0 and warm[0]["warmup_s"] > 0
    assert recs.index(warm[0]) < recs.index(evals[0])
    for r in train:
        assert r["num_episodes"] == 16 and r["num_failed"] == 0
        assert 0.0 <= r["trainer_idle_frac"] <= 1.0 and 0.0 <= r["inference_idle_frac"] <= 1.0
        assert r["gen_s"] > 0 and r["sync_s"] > 0 and r["adapter_bytes"] > 0
        if r["num_trained"]:
            assert r["train_num_tokens"] > 0 and r["train_loss"] == r["train_loss"]  # not NaN
            # sync mode is on-policy: behaviour (vLLM) and trainer logprobs agree, so IS weights are ~1
            assert r["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02)
            # one policy version: the trainer trained the version the orchestrator names, then published +1
            assert r["train_policy_version"] == r["trained_on_version"] == r["version"] - 1
            assert r["train_staleness_max"] == 0
        assert r["mode"] == "sync" and r["staleness_max"] == 0 and r["groups_interrupted"] == 0
    assert summary["steps"] == 2 and 0.0 <= summary["success_after"] <= 1.0
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    trainer_pid = int((run_dir / "trainer.pid").read_text().split()[0])
    assert not _alive(trainer_pid), "the trainer process must be stopped at the end of the run"

    # Resume: continues from step 2 to step 3 with the same version counter.
    overrides["steps"] = 3
    summary = await TrainingRun(load_config(None, overrides), resume=True, progress=False).run()
    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3] and train[-1]["version"] == 3
    assert [r["kind"] for r in recs].count("warmup") == 1, "a resumed run has no eval 0 to warm up for"
    assert summary["steps"] == 3
