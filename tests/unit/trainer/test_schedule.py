"""The learning-rate schedule, a pure function of the optimizer step, and how a run config ends it."""

from __future__ import annotations

import itertools
import math

import pytest

from agentrl.config.run import RunConfig
from agentrl.config.trainer import TrainerConfig
from agentrl.trainer.schedule import lr_at


def cfg(**kw: object) -> TrainerConfig:
    return TrainerConfig(model_path="m", lr=1e-3, **kw)  # type: ignore[arg-type]


def test_constant_is_the_default_and_warms_up_linearly() -> None:
    assert [lr_at(s, cfg()) for s in (0, 10, 1000)] == [1e-3] * 3
    warm = cfg(lr_warmup_steps=4)
    assert [lr_at(s, warm) for s in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


@pytest.mark.parametrize("shape", ["cosine", "linear"])
def test_decay_reaches_its_floor_at_the_decay_step_and_stays(shape: str) -> None:
    c = cfg(lr_schedule=shape, lr_decay_steps=10, lr_min_ratio=0.1)
    lrs = [lr_at(s, c) for s in range(14)]
    assert lrs[0] == pytest.approx(1e-3)
    assert all(b <= a for a, b in itertools.pairwise(lrs))
    assert lrs[10:] == pytest.approx([1e-4] * 4)
    mid = 0.5 * (1 + math.cos(math.pi * 0.5)) if shape == "cosine" else 0.5
    assert lrs[5] == pytest.approx(1e-3 * (0.1 + 0.9 * mid))


def test_warmup_then_cosine() -> None:
    c = cfg(lr_schedule="cosine", lr_warmup_steps=2, lr_decay_steps=12)
    assert lr_at(0, c) == pytest.approx(5e-4) and lr_at(2, c) == pytest.approx(1e-3)
    assert lr_at(7, c) == pytest.approx(5e-4) and lr_at(12, c) == 0.0


def test_a_run_ends_the_decay_at_its_last_optimizer_step_unless_told() -> None:
    run = RunConfig(steps=30, trainer={"num_minibatches": 2, "ppo_epochs": 2})
    assert run.resolved().trainer.lr_decay_steps == 120
    told = RunConfig(steps=30, trainer={"lr_decay_steps": 50})
    assert told.resolved().trainer.lr_decay_steps == 50


def test_a_context_longer_than_the_token_budget_is_refused_before_the_run() -> None:
    run = RunConfig(trainer={"micro_batch_tokens": 1024}, sampling={"max_context_tokens": 2048},
                    inference={"max_model_len": 4096})
    problems = run.training_problems()
    assert any("max_context_tokens = 2048" in p and "micro_batch_tokens = 1024" in p for p in problems), problems
    fits = RunConfig(trainer={"micro_batch_tokens": 2048}, sampling={"max_context_tokens": 2048})
    assert fits.training_problems() == []
