"""The newcomer's path on real parts: an environment file in the user's own directory, trained with the
installed ``agentrl`` command (the session vLLM server, real torchrun), no install and no PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentrl.orchestrator.metrics import read_jsonl
from tests.unit.environment.test_loading import AGENTRL, write_env

pytestmark = pytest.mark.integration


def test_train_an_environment_from_the_users_own_directory(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    home = tmp_path / "my_project"
    stem, _ = write_env(home)
    (home / "run.toml").write_text("steps = 1\ntasks_per_step = 2\ngroup_size = 2\neval_size = 2\neval_every = 0\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([AGENTRL, "train", "--env", f"{stem}.py:Echo", "--model", str(tiny_model_dir),
                          "--endpoint", vllm_server.url, "--config", "run.toml"],
                         cwd=home, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = home / "runs" / "echo"
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1] and train[0]["num_episodes"] == 4 and train[0]["num_failed"] == 0
    assert json.loads((run_dir / "config.json").read_text())["env"] == f"{home / stem}.py:Echo"
    assert json.loads(out.stdout.splitlines()[-1])["steps"] == 1
