"""A run whose only engine dies stops cleanly with a checkpoint, and ``--resume`` finishes it (real parts:
a vLLM server of its own that is killed, then the session's server, torchrun, calc, ``agentrl train``)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agentrl.orchestrator.metrics import read_jsonl
from tests.conftest import require
from tests.unit.environment.test_loading import AGENTRL

pytestmark = pytest.mark.integration


def _train_steps(metrics: Path) -> list[int]:
    try:
        return [r["step"] for r in read_jsonl(metrics) if r.get("kind") == "train"]
    except (OSError, ValueError):
        return []


def test_losing_every_engine_stops_with_a_checkpoint_and_resume_finishes(vllm_server, tiny_model_dir: Path,
                                                                         tmp_path: Path) -> None:
    """The engines of the resumed run need not be the old ones: it goes on against the session's server
    (one vLLM start less than restarting the killed one)."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.inference import VLLMServer, VLLMServerConfig

    scfg = VLLMServerConfig(model=str(tiny_model_dir), dtype="float32", max_model_len=1024, max_lora_rank=16,
                            max_loras=2, startup_timeout_s=600)
    engine = VLLMServer(scfg, tmp_path / "engine")  # its own: this test kills it
    (tmp_path / "run.toml").write_text("steps = 3\ntasks_per_step = 2\ngroup_size = 2\neval_size = 2\n"
                                       "eval_every = 0\ncheckpoint_every = 0\nengine_warmup = false\n")
    run_dir = tmp_path / "runs" / "lost"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    def train(endpoint: str) -> list[str]:
        return [AGENTRL, "train", "--env", "calc", "--name", "lost", "--model", str(tiny_model_dir),
                "--endpoint", endpoint, "--config", "run.toml"]

    try:
        engine.start()
        with (tmp_path / "first.err").open("w") as err:
            driver = subprocess.Popen(train(engine.url), cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                                      start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while not _train_steps(run_dir / "metrics.jsonl"):
                assert driver.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
                assert time.monotonic() < deadline, "no training step after 600 s"
                time.sleep(0.1)
            time.sleep(0.5)  # into step 2's generation
            os.killpg(engine.pgid, signal.SIGKILL)  # the run's only engine, by its own process group
            engine.proc.wait(30)
            driver.communicate(timeout=400)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait()
        stderr = (tmp_path / "first.err").read_text()
        assert driver.returncode == 2, stderr[-3000:]
        assert "no inference engine" in stderr and "--resume" in stderr, stderr[-3000:]
        assert "Traceback" not in stderr, stderr[-3000:]
        ckpts = sorted((run_dir / "checkpoints").glob("step_*/state.json"))
        assert ckpts, "the stopped run saved a checkpoint"
        state = json.loads(ckpts[-1].read_text())
        stopped_at = _train_steps(run_dir / "metrics.jsonl")[-1]
        assert state["step"] == stopped_at and 1 <= stopped_at < 3, (state, stopped_at)
        run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    finally:
        engine.stop()
    done = subprocess.run([*train(vllm_server.url), "--resume"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1])["steps"] == 3
    recs = read_jsonl(run_dir / "metrics.jsonl")
    assert {r["run_id"] for r in recs} == {run_id}, "one run"
    train = [r for r in recs if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3], "each step once"
    assert [r["version"] for r in train] == [1, 2, 3], "the resumed run goes on from the saved policy version"
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
