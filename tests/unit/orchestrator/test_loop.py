"""The orchestrator's loop with fake parts: sync is strictly alternating, async overlaps within η,
weight updates pause in-flight generation, failures never stop training."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from agentrl.config.run import PipelineConfig
from agentrl.core.types import StopReason, Trajectory
from agentrl.orchestrator.loop import Activity, Orchestrator


class FakeEngine:
    """Serves a version; a paused engine makes generation wait (like ``pause(mode=keep)``)."""

    def __init__(self) -> None:
        self.version = 0
        self.running = asyncio.Event()
        self.running.set()
        self.calls: list[str] = []
        self.active = 0

    async def pause(self, mode: str = "keep") -> None:
        self.calls.append(f"pause:{mode}")
        self.running.clear()

    async def resume(self) -> None:
        self.calls.append("resume")
        self.running.set()

    async def tokens(self, n: int, delay: float) -> list[int]:
        """``n`` tokens, one per ``delay``; each carries the version live when it was produced."""
        out = []
        self.active += 1
        try:
            for _ in range(n):
                await self.running.wait()
                await asyncio.sleep(delay)
                out.append(self.version)
        finally:
            self.active -= 1
        return out


class FakeRunner:
    def __init__(self, engine: FakeEngine, delay: float = 0.002, fail_every: int = 0) -> None:
        self.engine = engine
        self.delay = delay
        self.fail_every = fail_every
        self.started = 0
        self.max_concurrent = 0
        self._live = 0

    async def run_group(self, task: dict[str, Any], group_size: int) -> list[Trajectory]:
        self.started += 1
        if self.fail_every and self.started % self.fail_every == 0:
            raise RuntimeError("runner bug")
        self._live += 1
        self.max_concurrent = max(self.max_concurrent, self._live)
        try:
            versions = await asyncio.gather(*(self.engine.tokens(4, self.delay) for _ in range(group_size)))
        finally:
            self._live -= 1
        return [
            Trajectory(task_id=str(task["id"]), env="fake", group_id=f"{task['id']}", prompt_ids=[1],
                       completion_ids=[2, 3, 4, 5], loss_mask=[1] * 4, logprobs=[-0.5] * 4, versions=v,
                       reward=float(i % 2), stop_reason=StopReason.COMPLETED)
            for i, v in enumerate(versions)
        ]


class FakeTrainer:
    def __init__(self, delay: float = 0.01) -> None:
        self.delay = delay
        self.batches: list[int] = []
        self.policy_versions: list[int] = []

    async def train(self, samples: list[Any], policy_version: int) -> dict[str, Any]:
        self.batches.append(len(samples))
        self.policy_versions.append(policy_version)
        await asyncio.sleep(self.delay)
        return {"loss": 0.0}


class FakePublisher:
    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.in_flight_at_publish: list[int] = []
        self.paused_at_publish: list[bool] = []

    async def publish(self, version: int) -> dict[str, float]:
        self.in_flight_at_publish.append(self.engine.active)
        self.paused_at_publish.append(not self.engine.running.is_set())
        self.engine.version = version
        return {"engine_ms": 0.1}


def make(mode: str, eta: int = 1, runner_kw: dict[str, Any] | None = None, trainer_delay: float = 0.01,
         update_mode: str = "keep", version: int = 0) -> tuple[Orchestrator, FakeEngine, FakeRunner, FakeTrainer, FakePublisher]:
    engine = FakeEngine()
    engine.version = version
    runner = FakeRunner(engine, **(runner_kw or {}))
    trainer = FakeTrainer(trainer_delay)
    pub = FakePublisher(engine)
    counter = itertools.count()
    orch = Orchestrator(
        runner=runner, trainer=trainer, publisher=pub, engine=engine,
        sample_task=lambda: {"id": next(counter)},
        pipeline=PipelineConfig(max_staleness=0 if mode == "sync" else eta, update_mode=update_mode),
        groups_per_step=4, group_size=2, version=version,
    )
    return orch, engine, runner, trainer, pub


async def run_steps(orch: Orchestrator, n: int) -> list[dict[str, Any]]:
    async with orch:
        return [await asyncio.wait_for(orch.step(), timeout=10) for _ in range(n)]


async def test_sync_mode_never_updates_under_running_rollouts() -> None:
    orch, engine, runner, trainer, pub = make("sync")
    recs = await run_steps(orch, 5)
    assert pub.in_flight_at_publish == [0] * 5 and engine.calls == []
    assert [r["staleness_max"] for r in recs] == [0] * 5
    assert all(r["mixed_version_episodes"] == 0 for r in recs)
    assert orch.version == 5 and len(trainer.batches) == 5
    assert runner.max_concurrent <= 4  # only the current step's groups may run


async def test_sync_mode_from_a_resumed_version_is_still_sync() -> None:
    orch, _, runner, _, pub = make("sync", version=7, runner_kw={"delay": 0.01}, trainer_delay=0.05)
    recs = await run_steps(orch, 3)
    assert pub.in_flight_at_publish == [0] * 3 and runner.max_concurrent <= 4
    assert orch.version == 10 and all(r["inference_idle_frac"] > 0.3 for r in recs[1:])


async def test_async_mode_overlaps_and_respects_eta() -> None:
    orch, engine, runner, _, pub = make("async", eta=1, runner_kw={"delay": 0.02})
    recs = await run_steps(orch, 6)
    # generation ran while the trainer trained, so updates landed under running rollouts, paused
    assert any(n > 0 for n in pub.in_flight_at_publish)
    assert all(p for n, p in zip(pub.in_flight_at_publish, pub.paused_at_publish, strict=True) if n > 0)
    assert engine.calls.count("resume") == engine.calls.count("pause:keep") > 0
    assert max(r["staleness_max"] for r in recs) <= 1
    assert recs[-1]["interrupted_groups_total"] > 0
    assert runner.max_concurrent > 4  # the next step's groups started before the current one trained
    assert recs[-1]["dropped_groups_total"] == 0  # block policy: nothing dropped
    assert recs[-1]["dropped_tokens_total"] == 0


async def test_partial_rollouts_carry_two_versions() -> None:
    orch, *_ = make("async", eta=2, runner_kw={"delay": 0.02})
    recs = await run_steps(orch, 6)
    assert sum(r["mixed_version_episodes"] for r in recs) > 0


async def test_wait_update_mode_pauses_with_wait() -> None:
    orch, engine, *_ = make("async", eta=1, update_mode="wait", runner_kw={"delay": 0.02})
    await run_steps(orch, 3)
    assert "pause:wait" in engine.calls and "pause:keep" not in engine.calls


async def test_runner_failures_are_counted_and_training_goes_on() -> None:
    orch, *_ = make("async", runner_kw={"fail_every": 3})
    recs = await run_steps(orch, 4)
    assert recs[-1]["failed_groups_total"] > 0 and orch.version == 4


async def test_stop_cancels_in_flight_groups() -> None:
    orch, engine, runner, *_ = make("async", eta=3, runner_kw={"delay": 0.05})
    async with orch:
        await asyncio.sleep(0.05)
        assert runner.started > 0
    assert engine.active == 0 and not orch._groups


def test_activity_accounts_overlapping_users() -> None:
    now = [0.0]
    act = Activity(clock=lambda: now[0])
    act.enter()
    now[0] = 1.0
    act.enter()
    now[0] = 2.0
    act.exit()
    now[0] = 3.0
    act.exit()
    now[0] = 10.0
    assert act.busy_s() == pytest.approx(3.0)
    act.enter()
    now[0] = 11.0
    assert act.busy_s() == pytest.approx(4.0)


async def test_the_trainer_trains_the_orchestrators_version() -> None:
    """One policy version: each train request names the version the orchestrator then publishes past."""
    orch, engine, _, trainer, _ = make("async", eta=1, version=3)
    recs = await run_steps(orch, 3)
    assert trainer.policy_versions == [3, 4, 5] and orch.version == engine.version == 6
    assert [r["trained_on_version"] for r in recs] == [3, 4, 5]


async def test_the_orchestrator_bumps_the_runs_one_version_and_the_buffer_reads_it() -> None:
    """A run's PolicyVersion passed in is the orchestrator's: no copies (its buffer reads the same object)."""
    from agentrl.core.versions import PolicyVersion

    version = PolicyVersion(2)
    engine = FakeEngine()
    engine.version = 2
    counter = itertools.count()
    orch = Orchestrator(runner=FakeRunner(engine), trainer=FakeTrainer(), publisher=FakePublisher(engine),
                        engine=engine, sample_task=lambda: {"id": next(counter)},
                        pipeline=PipelineConfig(max_staleness=1), groups_per_step=2, group_size=2, version=version)
    assert orch.policy is version and orch.buffer.core.policy is version
    recs = await run_steps(orch, 3)
    assert version.value == orch.version == orch.buffer.core.version == engine.version == 5
    assert [r["trained_on_version"] for r in recs] == [2, 3, 4]


async def test_step_record_keys_are_assembled_in_one_place() -> None:
    """The metric names of a step (what ``metrics.jsonl`` and the docs rely on), in their order."""
    from agentrl.orchestrator.metrics import train_record

    orch, *_ = make("sync")
    (rec,) = await run_steps(orch, 1)
    assert list(rec) == [
        "num_episodes", "num_rows", "num_failed", "num_trained", "num_zero_advantage", "age_capped_tokens", "reward_mean",
        "success", "model_tokens",
        "total_tokens", "turns_mean", "malformed_tool_calls", "stop_completed", "errors", "train_loss", "engine_ms", "update_s",
        "engines_waited_s_total", "groups_interrupted", "trained_on_version", "wait_s", "gen_s", "train_s", "sync_s", "step_s", "tokens_per_s",
        "trainer_idle_frac", "inference_idle_frac", "staleness_mean", "staleness_max", "mixed_version_episodes",
        "groups_in_flight", "interrupted_groups_total", "dropped_groups_total", "dropped_tokens_total",
        "failed_groups_total", "skipped_groups", "skipped_groups_total", "skipped_tokens_total",
        "producer_wait_s_total", "staleness_hist"]
    line = train_record(rec, step=1, version=1, mode="sync", engines_rejoined=0, engines_live=1, wall_s=2.0,
                        wall_train_s=1.0)
    assert list(line)[:4] == ["kind", "step", "version", "mode"] and line["kind"] == "train"
    assert list(line)[-4:] == ["engines_rejoined", "engines_live", "wall_s", "wall_train_s"]
    assert {k: line[k] for k in rec} == rec


async def test_an_update_that_finds_no_engine_waits_for_one_and_publishes_again() -> None:
    """The second step's weight update finds every engine out of rotation: the step waits in
    ``engines_back`` (which returns once an engine is back), publishes the new version again and completes;
    while it waits, the run's version says the trainer's weights are the next one. Without ``engines_back``
    the step fails."""
    from agentrl.inference.wire import NoEnginesError

    published: list[int] = []

    def losing_once(pub: FakePublisher) -> None:
        publish = pub.publish

        async def lost_once(version: int) -> dict[str, float]:
            published.append(version)
            if published.count(2) == 1 and version == 2:
                raise NoEnginesError("every inference endpoint is out of rotation")
            return await publish(version)

        pub.publish = lost_once  # type: ignore[method-assign]

    orch, engine, _, _, pub = make("sync")
    losing_once(pub)
    weights_while_waiting: list[tuple[int, int]] = []

    async def engines_back() -> list[str]:
        weights_while_waiting.append((orch.policy.value, orch.policy.weights))
        return ["http://e"]

    orch.engines_back = engines_back
    recs = await run_steps(orch, 3)
    assert published == [1, 2, 2, 3] and orch.version == engine.version == 3
    assert weights_while_waiting == [(1, 2)] and orch.policy.weights == 3
    assert recs[1]["engines_waited_s_total"] > 0 and [r["trained_on_version"] for r in recs] == [0, 1, 2]
    published.clear()
    orch, _, _, _, pub = make("sync")
    losing_once(pub)
    with pytest.raises(NoEnginesError):
        await run_steps(orch, 2)


class UniformRunner(FakeRunner):
    """Every ``uniform_every``-th group's episodes all score 0 (no advantage); ``uniform_every`` 1: every group."""

    def __init__(self, engine: FakeEngine, uniform_every: int) -> None:
        super().__init__(engine)
        self.uniform_every = uniform_every

    async def run_group(self, task: dict[str, Any], group_size: int) -> list[Trajectory]:
        number = self.started + 1  # this group's; others start while it runs
        group = await super().run_group(task, group_size)
        if number % self.uniform_every == 0:
            for t in group:
                t.reward = 0.0
        return group


def make_skipping(uniform_every: int, max_skips: int, mode: str = "sync") -> tuple[Orchestrator, UniformRunner]:
    orch, engine, *_ = make(mode)
    runner = UniformRunner(engine, uniform_every)
    orch.runner = runner
    orch.max_skips_per_step = max_skips
    return orch, runner


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_dynamic_sampling_trains_only_groups_with_signal(mode: str) -> None:
    from agentrl.orchestrator.samples import carries_signal

    orch, _ = make_skipping(uniform_every=3, max_skips=8, mode=mode)
    async with orch:
        recs = []
        for _ in range(4):
            recs.append(await asyncio.wait_for(orch.step(), timeout=10))
            assert len(orch.last_batch) == 4 and all(carries_signal(g) for g in orch.last_batch)
    assert sum(r["skipped_groups"] for r in recs) == recs[-1]["skipped_groups_total"] > 0
    assert recs[-1]["skipped_tokens_total"] == recs[-1]["skipped_groups_total"] * 2 * 4  # 2 episodes x 4 tokens
    assert all(r["num_zero_advantage"] == 0 for r in recs)
    books = orch.buffer.stats()
    assert books["released"] >= recs[-1]["skipped_groups_total"]  # a skipped group's slot was freed


async def test_dynamic_sampling_gives_up_after_its_budget() -> None:
    """Every group is uniform: each step skips its budget, then trains on uniform groups instead of stalling."""
    orch, _ = make_skipping(uniform_every=1, max_skips=3)
    recs = await run_steps(orch, 3)
    assert [r["skipped_groups"] for r in recs] == [3, 3, 3]
    assert all(r["num_zero_advantage"] == 8 for r in recs)  # 4 uniform groups of 2 kept, no gradient
    # the trainer never ran, and the records still carry the train keys a step with samples has
    assert all(r["train_num_samples"] == 0 and r["train_num_tokens"] == 0 for r in recs)
    assert all(r["train_staleness_max"] == 0 and r["train_staleness_mean"] == 0.0 for r in recs)


async def test_without_dynamic_sampling_uniform_groups_are_kept() -> None:
    orch, _ = make_skipping(uniform_every=2, max_skips=0)
    recs = await run_steps(orch, 2)
    assert all(r["skipped_groups"] == 0 for r in recs) and recs[-1]["skipped_groups_total"] == 0
    assert sum(r["num_zero_advantage"] for r in recs) == 8  # 4 of the 8 groups, 2 episodes each


async def test_the_step_masks_tokens_older_than_the_cap_and_counts_them() -> None:
    """The orchestrator hands its version and ``pipeline.max_token_age`` to ``to_samples``: with the cap at 0,
    every token generated before the version it is trained as leaves the loss and is counted."""
    orch, *_ = make("async", eta=1)
    orch.max_token_age = 0
    recs = await run_steps(orch, 4)
    assert recs[0]["age_capped_tokens"] == 0  # step 1 trains version-0 tokens as version 0
    assert sum(r["age_capped_tokens"] for r in recs[1:]) > 0
