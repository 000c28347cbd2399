"""``TrainingRun`` as a composition root: constructing it only checks and plans (bad configs are refused
there, before anything starts), ``open()`` does the disk and network I/O (and raises what that finds), and
``run()`` opens a run nobody opened."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.run import RunConfig, load_config
from agentrl.environment.registry import UnknownEnvironmentError
from agentrl.environment.tasks import TaskFileNotFound
from agentrl.launch.placement import PlacementError
from agentrl.moe.families import MoEInfo
from agentrl.orchestrator import run as run_mod
from agentrl.orchestrator.run import RunNotOpen, TrainingRun
from agentrl.orchestrator.rundir import RunDirError

INFO = MoEInfo(family="qwen3_moe", experts=8, top_k=2, layers=4, moe_layers=(0, 1, 2, 3), norm_topk_prob=True)


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Placement plans for a machine without GPUs (no ``nvidia-smi`` call)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


def _cfg(tmp_path: Path, **overrides: Any) -> RunConfig:
    return load_config(None, {"env": "calc", "output_dir": str(tmp_path / "runs"), **overrides})


def test_construction_does_no_io(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def io(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("construction did I/O")

    for name in ("load_env", "load_tasks", "open_run", "model_moe", "_latest_checkpoint"):
        monkeypatch.setattr(run_mod, name, io)
    run = TrainingRun(_cfg(tmp_path, env="nosuchenv", tasks=str(tmp_path / "missing.jsonl")), resume=True)
    assert not (tmp_path / "runs").exists()
    assert run.plan.trainer.nproc >= 1 and run.cfg.is_frozen  # resolved
    for attr in ("run_dir", "run_id", "env_cls", "train_tasks", "metrics", "trackers", "resources"):
        with pytest.raises(RunNotOpen):
            getattr(run, attr)


def test_a_config_that_cannot_run_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="greedy decoding"):
        TrainingRun(_cfg(tmp_path, sampling={"temperature": 0.0}))
    with pytest.raises(PlacementError, match="no GPU is visible"):
        TrainingRun(_cfg(tmp_path, placement={"trainer_gpus": "0"}))
    assert not (tmp_path / "runs").exists()


def test_open_loads_and_claims_once(tmp_path: Path) -> None:
    run = TrainingRun(_cfg(tmp_path, eval_size=3))
    # settled with the config: calc's preset trains an adapter the engines' LoRA slots serve (the output layer too)
    assert run.cfg.name is None and run.cfg.transport.transport == "shm"
    assert asyncio.run(run.open()) is run
    assert run.cfg.name == "calc" and run.cfg.transport.transport == "shm" and run.moe is None
    assert run.run_dir == tmp_path / "runs" / "calc" and (run.run_dir / "run.json").is_file()
    assert json.loads((run.run_dir / "run.json").read_text())["run_id"] == run.run_id
    assert run.env_cls.__name__ and run.train_tasks and len(run.eval_tasks) == 3
    assert run.metrics.path == run.run_dir / "metrics.jsonl" and run.resume_from is None
    asyncio.run(run.open())  # a second open claims nothing more
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["calc"]


def test_io_errors_come_from_open_and_claim_nothing(tmp_path: Path) -> None:
    run = TrainingRun(_cfg(tmp_path, env="nosuchenv"))
    with pytest.raises(UnknownEnvironmentError, match="unknown environment 'nosuchenv'"):
        asyncio.run(run.run())  # run() opens first
    run = TrainingRun(_cfg(tmp_path, tasks=str(tmp_path / "missing.jsonl")))
    with pytest.raises(TaskFileNotFound):
        asyncio.run(run.open())
    assert not (tmp_path / "runs").exists(), "nothing claimed before the environment and the tasks loaded"
    (tmp_path / "runs" / "taken").mkdir(parents=True)
    (tmp_path / "runs" / "taken" / "file").write_text("x")
    with pytest.raises(RunDirError, match="already holds a run"):
        asyncio.run(TrainingRun(_cfg(tmp_path, name="taken")).open())


def test_resume_finds_the_latest_complete_checkpoint(tmp_path: Path) -> None:
    first = asyncio.run(TrainingRun(_cfg(tmp_path, name="r")).open())
    for step, done in ((2, True), (4, True), (6, False)):
        ckpt = first.run_dir / "checkpoints" / f"step_{step:06d}"
        ckpt.mkdir(parents=True)
        if done:
            (ckpt / "state.json").write_text(json.dumps({"step": step, "version": step}))
    resumed = asyncio.run(TrainingRun(_cfg(tmp_path, name="r"), resume=True).open())
    assert resumed.run_id == first.run_id and resumed.resume_from is not None
    assert resumed.resume_from[0].name == "step_000004" and resumed.resume_from[1]["step"] == 4


def test_the_moe_shape_is_read_by_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's config is read by open(): a black-box agent of a MoE model is trained with replay (the
    policy endpoint's rows carry routing), its transport settled with the config as for agentrl's own loop."""
    monkeypatch.setattr(run_mod, "model_moe", lambda model: INFO)
    run = asyncio.run(TrainingRun(_cfg(tmp_path, agent={"command": ["python", "agent.py"]})).open())
    assert run.moe == INFO and run.cfg.trainer.routing_replay and run.cfg.transport.transport != "auto"


def test_a_driver_ends_a_run_early_without_touching_its_frozen_config(tmp_path: Path) -> None:
    run = TrainingRun(_cfg(tmp_path, steps=10))
    assert run._last_step() == 10
    run.stop_after(4)
    run.stop_after(6)  # the earliest end wins
    assert run._last_step() == 4 and run.cfg.steps == 10
    run.stop_after(50)
    assert run._last_step() == 4
