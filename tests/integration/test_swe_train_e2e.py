"""``agentrl train --env swe`` on real parts: the session vLLM server, torchrun, episodes in Docker sandboxes,
grading in fresh sandboxes, adapter sync. Two small steps. The tiny model does not fix bugs (rewards 0)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import docker
import pytest

from agentrl.config.run import load_config
from agentrl.envs.swe import SweEnv
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun
from agentrl.sandbox import engine_reachable
from tests.conftest import require

pytestmark = pytest.mark.integration


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_train_swe_two_steps(vllm_server, tiny_model_dir: Path, tmp_path: Path) -> None:
    ok, why = engine_reachable()
    require(ok, f"no Docker engine reachable ({why}); run `eval \"$(sandbox/provision.sh)\"`")
    # The session server's context is 1024 tokens; the two shortest issues leave room for a short turn.
    shortest = sorted(SweEnv.tasks("all"), key=lambda t: len(t["problem_statement"]))[:2]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in shortest))
    name = f"swe-e2e-{uuid.uuid4().hex[:6]}"
    overrides = {
        "env": "swe", "name": name, "output_dir": str(tmp_path), "model": str(tiny_model_dir),
        "endpoints": [vllm_server.url], "steps": 2, "tasks": str(tasks), "eval_tasks": str(tasks),
        "tasks_per_step": 2, "group_size": 2, "eval_size": 2, "time_limit_min": None,
        "inference": {"max_model_len": 1024}, "sampling": {"max_context_tokens": 1024},
    }
    summary = await TrainingRun(load_config(None, overrides), progress=False).run()
    run_dir = tmp_path / name
    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["version"] for r in train] == [1, 2]
    for r in train:
        assert r["num_episodes"] == 4 and r["num_failed"] == 0, r
        assert r["gen_s"] > 0 and r["sync_s"] > 0 and r["adapter_bytes"] > 0
    assert sum(r["model_tokens"] for r in train) > 0, "the model generated nothing"
    assert [r["step"] for r in evals] == [0, 2]
    for r in evals:  # graded in fresh sandboxes: partial credit recorded, never the reward
        assert r["num_failed"] == 0 and r["metric_patch_applied"] == 1.0 and 0 < r["metric_partial_credit"] < 1
    assert summary["steps"] == 2 and summary["success_after"] == 0.0
    assert (run_dir / "final_adapter" / "adapter_model.safetensors").is_file()
    assert not _alive(int((run_dir / "trainer.pid").read_text().split()[0]))
    left = [c for c in docker.from_env(timeout=30).api.containers(all=True, filters={"label": "agentrl.owner"})
            if c["Labels"]["agentrl.owner"].startswith(f"{name}-")]
    assert left == [], "the run's sandboxes must be removed when training ends"
