"""A whole synchronous training run on real parts: vLLM (the session server), torchrun, calc; then resume.

The run reports to every built-in tracker (wandb offline, MLflow and Trackio on local stores) and to one that
raises on every log, trains on tasks from a parquet file whose question column is named differently, and
evaluates on a saved Hugging Face dataset: each tracker's own reader finds the series of ``metrics.jsonl``,
the failing tracker costs one warning and nothing else, and the resumed run continues the same tracker runs.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.run import load_config
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun
from agentrl.tracking.base import Tracker
from agentrl.tracking.records import TrackerRecord
from tests import tracker_readers as read

pytestmark = [pytest.mark.integration, pytest.mark.long]

TRACKERS = ["tensorboard", "wandb", "mlflow", "trackio"]
RAISING = f"{__name__}:RaisesOnLog"


class RaisesOnLog(Tracker):
    """A tracker whose service is down: every log raises."""

    def log(self, record: TrackerRecord) -> None:
        raise ConnectionError("tracker service unreachable")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _task_files(tmp_path: Path) -> tuple[Path, Path]:
    """Train tasks as parquet, held-out tasks as a saved dataset (``question`` stored as ``prompt`` in both)."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from agentrl.envs.calc import CalcEnv

    def renamed(tasks: list[dict]) -> list[dict]:
        return [{"prompt": t["question"], **{k: v for k, v in t.items() if k != "question"}} for t in tasks]

    pq.write_table(pa.Table.from_pylist(renamed(CalcEnv.tasks("train")[:64])), tmp_path / "train.parquet")
    datasets.Dataset.from_list(renamed(CalcEnv.tasks("test")[:8])).save_to_disk(tmp_path / "heldout")
    return tmp_path / "train.parquet", tmp_path / "heldout"


def _series(recs: list[dict[str, Any]], kind: str, key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in recs if r["kind"] == kind and key in r]


def _close(series: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    return [s for s, _ in series] == [s for s, _ in expected] and all(
        v == pytest.approx(e, rel=1e-5) for (_, v), (_, e) in zip(series, expected, strict=True))


async def test_train_two_steps_then_resume(vllm_server, tiny_model_dir: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    mlruns = f"file://{tmp_path / 'mlruns'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlruns)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for var in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(var, raising=False)
    train_tasks, heldout = _task_files(tmp_path)
    overrides = {
        "env": "calc", "name": "e2e", "output_dir": str(tmp_path), "model": str(tiny_model_dir),
        "endpoints": [vllm_server.url], "steps": 2, "tasks_per_step": 4, "group_size": 4,
        "eval_size": 8, "eval_every": 0, "checkpoint_every": 1, "time_limit_min": None,
        "tasks": str(train_tasks), "eval_tasks": str(heldout), "task_columns": {"question": "prompt"},
        "tracking": {"report_to": [*TRACKERS, RAISING], "project": "agentrl-e2e", "samples_every": 1},
        "trainer": {"lora_train_embedding": False},  # the adapter path: synced in place into the shared engine
    }
    with caplog.at_level(logging.WARNING, logger="agentrl.tracking.hub"):
        summary = await TrainingRun(load_config(None, overrides), progress=False).run()
    run_dir = tmp_path / "e2e"
    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["version"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 2] and all(r["num_episodes"] == 8 for r in evals)
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
            # and per token: the trainer's logprobs of the sampled tokens are the engine's, after every sync of
            # the adapter into the engine's live slot (step 2 samples from the adapter step 1 synced in place)
            assert abs(r["train_behav_logp_diff"]) < 0.02, r["train_behav_logp_diff"]
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

    # The failing tracker: one warning, switched off; every other tracker and metrics.jsonl unharmed.
    assert summary["trackers"] == {**dict.fromkeys(TRACKERS, "ok"),
                                   RAISING: "failed: ConnectionError: tracker service unreachable"}
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if RAISING in w]) == 1, warnings
    # Each tracker's own reader finds the reward and loss series at the steps of metrics.jsonl.
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    mlflow_run = json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"]
    readers = {
        "tensorboard": lambda key: read.tensorboard_scalars(run_dir / "tensorboard", key),
        "wandb": lambda key: read.wandb_series(run_dir / "wandb", run_id, key),
        "mlflow": lambda key: read.mlflow_series(mlruns, mlflow_run, key),
        "trackio": lambda key: read.trackio_series("agentrl-e2e", "e2e", key),
    }
    expected = {"train/reward_mean": _series(recs, "train", "reward_mean"),
                "train/train_loss": _series(recs, "train", "train_loss"),
                "eval/success": _series(recs, "eval", "success")}
    assert [s for s, _ in expected["train/reward_mean"]] == [1, 2] and expected["train/train_loss"]
    for name, series_of in readers.items():
        for key, want in expected.items():
            assert _close(series_of(key), want), (name, key, series_of(key), want)

    # Sample episodes of every step (samples_every = 1), with the messages of real episodes.
    for step in (1, 2):
        rows = [json.loads(line) for line in (run_dir / "samples" / f"step_{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 4 and all(r["step"] == step and r["versions"] == [step - 1] for r in rows)
        assert all(r["messages"][0]["role"] in ("system", "user") and len(r["messages"]) >= 2 for r in rows)
        assert {r["task_id"] for r in rows} <= {f"calc-train-{i}" for i in range(64)}  # the parquet file's tasks
    # The model card names the run's real figures.
    card = (run_dir / "final_adapter" / "README.md").read_text()
    assert f"| before training (step 0) | {evals[0]['success']:.3f}" in card
    assert f"| after training (step 2) | {evals[-1]['success']:.3f}" in card
    assert "library_name: peft" in card and "PeftModel.from_pretrained" in card and str(tiny_model_dir) in card
    # The saved adapter describes itself (what `agentrl eval --adapter` alone serves it with), and its run's figures.
    from agentrl.launch.described import EVALUATED, POLICY_FILE, read_policy
    from agentrl.launch.fit import fingerprint

    policy = read_policy(run_dir)
    assert policy.path == run_dir / "final_adapter" and policy.source.endswith(POLICY_FILE)
    assert (policy.base, policy.base_digest) == (str(tiny_model_dir), fingerprint(tiny_model_dir))
    described = policy.settings(EVALUATED)
    assert (described["env"], described["eval_tasks"], described["sampling.max_context_tokens"]) == (
        "calc", str(heldout), 1024)
    assert policy.figures["last_eval"]["success"] == evals[-1]["success"] and policy.figures["steps"] == 2

    # Resume: continues from step 2 to step 3 with the same version counter, in the same tracker runs.
    overrides["steps"] = 3
    overrides["tracking"]["report_to"] = TRACKERS
    summary = await TrainingRun(load_config(None, overrides), resume=True, progress=False).run()
    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3] and train[-1]["version"] == 3
    assert [r["kind"] for r in recs].count("warmup") == 1, "a resumed run has no eval 0 to warm up for"
    assert summary["steps"] == 3 and summary["trackers"] == dict.fromkeys(TRACKERS, "ok")
    assert json.loads((run_dir / "trackers.json").read_text())["mlflow"]["run_id"] == mlflow_run
    want = _series(recs, "train", "reward_mean")
    for name, series_of in readers.items():
        assert _close(series_of("train/reward_mean")[-3:], want), (name, series_of("train/reward_mean"), want)
    card = (run_dir / "final_adapter" / "README.md").read_text()
    assert f"| before training (step 0) | {evals[0]['success']:.3f}" in card, "the first attempt's eval 0"
