"""Run directories on real parts (vLLM servers, torchrun): two runs of the same command keep both outputs
byte for byte, and a driver killed mid-step leaves no process behind and resumes into one consistent run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentrl.config.run import load_config
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun
from tests.procs import command_line, descendants, start_time
from tests.unit.environment.test_loading import AGENTRL

pytestmark = [pytest.mark.integration, pytest.mark.long]


def _digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*"))
            if p.is_file()}


async def test_the_same_command_twice_keeps_both_runs_intact(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = {"env": "calc", "output_dir": str(tmp_path), "model": str(tiny_model_dir),
                 "endpoints": [vllm_server.url], "steps": 1, "tasks_per_step": 2, "group_size": 2,
                 "eval_size": 2, "eval_every": 0, "checkpoint_every": 1, "engine_warmup": False,
                 "trainer": {"lora_train_embedding": False}}  # the adapter path: the engine is shared
    first = await TrainingRun(load_config(None, overrides), progress=False).run()
    before = _digests(tmp_path / "calc")
    second = await TrainingRun(load_config(None, overrides), progress=False).run()
    assert (Path(first["run_dir"]).name, Path(second["run_dir"]).name) == ("calc", "calc-2")
    assert _digests(tmp_path / "calc") == before, "the second run changed the first run's files"
    ids = [{r["run_id"] for r in read_jsonl(tmp_path / n / "metrics.jsonl")} for n in ("calc", "calc-2")]
    assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]


def test_a_driver_killed_mid_step_leaves_nothing_and_resumes_into_one_run(vllm_server, tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """The killed run starts its own engine; the resumed one goes on against the session's (one vLLM start
    less than starting its own again)."""
    # the adapter path: the resumed run syncs into the session's engine, and a merge would change its weights for
    # the tests after this one
    (tmp_path / "run.toml").write_text("steps = 3\ntasks_per_step = 2\ngroup_size = 2\neval_size = 2\n"
                                       "eval_every = 0\ncheckpoint_every = 1\nengine_warmup = false\n"
                                       "[trainer]\nlora_train_embedding = false\n")
    cmd = [AGENTRL, "train", "--env", "calc", "--name", "killed", "--model", str(tiny_model_dir),
           "--config", "run.toml"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_dir = tmp_path / "runs" / "killed"
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (run_dir / "checkpoints" / "step_000001" / "state.json").is_file():
            assert driver.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint after 600 s"
            time.sleep(0.05)
        started = {p: start_time(p) for p in descendants(driver.pid)}
        driver.send_signal(signal.SIGKILL)  # in step 2: the driver gets no chance to clean up
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert not (run_dir / "checkpoints" / "step_000002" / "state.json").is_file(), "the kill landed too late"
    names = {p: command_line(p) for p in started}
    # the vLLM server with its engine core and worker, torchrun with its rank, the warden
    assert len(started) >= 5, names
    t0 = time.monotonic()
    while left := [p for p, s in started.items() if s and start_time(p) == s]:
        assert time.monotonic() - t0 < 10, f"still running 10 s after the driver's SIGKILL: {[names[p] for p in left]}"
        time.sleep(0.1)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]

    cmd += ["--endpoint", vllm_server.url]
    fresh = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 2 and "already holds a run" in fresh.stderr and "--resume" in fresh.stderr
    done = subprocess.run([*cmd, "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    recs = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in recs if r["kind"] == "train"] == [1, 2, 3], "each step once: one run"
    assert {r["run_id"] for r in recs} == {run_id}
    assert [r["version"] for r in recs if r["kind"] == "train"] == [1, 2, 3]
    assert json.loads(done.stdout.splitlines()[-1])["steps"] == 3
