"""A mid-run evaluation samples at its own temperature without changing the training episodes' sampling."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason, Trajectory
from agentrl.orchestrator import evaluate as evaluation
from agentrl.rollout import groups


async def test_episodes_started_during_an_evaluation_keep_the_training_temperature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[tuple[str, float]] = []

    async def episode(env_cls: Any, task: dict, client: Any, chat: Any, sampling: SamplingConfig,
                      **_: Any) -> Trajectory:
        seen.append((task["id"], sampling.temperature))
        await asyncio.sleep(0.01)
        return Trajectory(task_id=task["id"], env="fake", prompt_ids=[1], completion_ids=[2], loss_mask=[1],
                          logprobs=[-0.1], versions=[0], reward=1.0, stop_reason=StopReason.COMPLETED)

    monkeypatch.setattr(groups, "run_episode", episode)
    env = SimpleNamespace(upcoming=lambda tasks: None)
    workers = groups.RolloutWorkers(env, client=None, chat=None, sampling=SamplingConfig(temperature=1.0))

    async def train() -> None:  # the producer keeps starting groups while the evaluation runs
        for i in range(10):
            await workers.run_group({"id": f"train-{i}"}, 2)

    evaluating = evaluation.evaluate(workers, [{"id": f"eval-{i}"} for i in range(10)], temperature=0.0)
    summary, _ = await asyncio.gather(evaluating, train())
    assert summary["success"] == 1.0 and summary["num_episodes"] == 10
    assert {t for k, t in seen if k.startswith("eval")} == {0.0}
    assert {t for k, t in seen if k.startswith("train")} == {1.0}, "a training episode sampled at 0"
    assert workers.sampling.temperature == 1.0
