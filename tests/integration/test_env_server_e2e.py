"""The environment server with a real model (the session's vLLM server): an external agent that knows only
``openai`` and ``httpx``, whole rollouts run server-side, and ``agentrl train --env-url``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentrl.core.types import Trajectory
from agentrl.tools.bench.env_server import ServerProcess

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_external_agent_example(vllm_server, tmp_path: Path) -> None:
    with ServerProcess(["calc"], log_path=tmp_path / "server.log") as server:
        env = {**os.environ, "AGENTRL_ENV_TOKEN": server.token}
        cmd = [
            sys.executable,
            str(ROOT / "examples" / "external_agent.py"),
            "--env-url",
            server.url,
            "--base-url",
            f"{vllm_server.url}/v1",
            "--model",
            "base",
            "--episodes",
            "3",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-3000:] + server.log_tail()
        lines = [json.loads(x) for x in r.stdout.strip().splitlines()]
        summary, episodes = lines[-1], lines[:-1]
        assert summary["episodes"] == 3 and len(episodes) == 3
        assert all(e["stop_reason"] in ("completed", "max_turns") and e["turns"] >= 1 for e in episodes)
        assert all(e["reward"] in (0.0, 1.0) for e in episodes)
        metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {server.token}"}).text
        assert 'agentrl_env_sessions_closed_total{reason="client"} 3' in metrics
        assert httpx.get(server.url + "/health").json()["sessions"] == 0


def test_whole_rollouts_server_side(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    extra = ["--tokenizer", str(tiny_model_dir)]
    with ServerProcess(["calc"], extra=extra, log_path=tmp_path / "server.log") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        body = {
            "env": "calc",
            "task_id": "calc-test-0",
            "base_url": vllm_server.url,
            "model": "base",
            "sampling": {"temperature": 1.0, "max_context_tokens": 1024},
            "group_id": "g1",
        }
        r = httpx.post(server.url + "/v1/rollouts", json=body, headers=headers, timeout=300)
        assert r.status_code == 200, r.text
        traj = Trajectory.model_validate(r.json()["trajectory"])
        traj.check()
        assert not traj.failed, traj.error
        assert traj.task_id == "calc-test-0" and traj.group_id == "g1" and traj.env == "calc"
        assert traj.prompt_ids and sum(traj.loss_mask) > 0 and traj.num_turns >= 1
        assert all(lp <= 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m)
        # The example's server-side mode uses the same route.
        env = {**os.environ, "AGENTRL_ENV_TOKEN": server.token}
        cmd = [
            sys.executable,
            str(ROOT / "examples" / "external_agent.py"),
            "--env-url",
            server.url,
            "--base-url",
            f"{vllm_server.url}/v1",
            "--model",
            "base",
            "--episodes",
            "2",
            "--server-side",
        ]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["episodes"] == 2
        # An unreachable engine is data (a failed trajectory), not an HTTP error.
        r = httpx.post(
            server.url + "/v1/rollouts",
            json={**body, "base_url": "http://127.0.0.1:9"},
            headers=headers,
            timeout=300,
        )
        assert r.status_code == 200 and r.json()["trajectory"]["stop_reason"] == "inference_error"


def test_train_one_step_against_a_remote_env(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'output_dir = "{tmp_path}"\ntasks_per_step = 4\ngroup_size = 4\neval_size = 8\n'
        "eval_every = 0\ncheckpoint_every = 0\n"
        "[trainer]\nlora_train_embedding = false\n"  # the adapter path: the engine is shared
    )
    with ServerProcess(["calc"], log_path=tmp_path / "server.log") as server:
        env = {**os.environ, "AGENTRL_ENV_TOKEN": server.token}
        cmd = [
            sys.executable,
            "-m",
            "agentrl.cli",
            "train",
            "--env",
            "calc",
            "--env-url",
            server.url,
            "--endpoint",
            vllm_server.url,
            "--model",
            str(tiny_model_dir),
            "--config",
            str(toml),
            "--steps",
            "1",
            "--name",
            "remote",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-4000:] + server.log_tail()
        summary = json.loads(r.stdout.strip().splitlines()[-1])
        assert summary["steps"] == 1
        metrics = httpx.get(server.url + "/metrics", headers={"Authorization": f"Bearer {server.token}"}).text
    recs = [json.loads(x) for x in (tmp_path / "remote" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in recs if x["kind"] == "train"]
    assert len(train) == 1 and train[0]["num_episodes"] == 16 and train[0]["num_failed"] == 0
    created = sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("agentrl_env_sessions_created_total")
    )
    assert created >= 16 + 2 * 8, "training and both evaluations ran on the env server"
    assert server.token not in (tmp_path / "remote" / "config.json").read_text()
