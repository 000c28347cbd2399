"""Producers → bounded buffer → trainer: the one training loop behind both modes.

Two named long-running pieces talk through the :class:`~agentrl.orchestrator.buffer.RolloutBuffer`:

* the **producer** task keeps starting GRPO groups (one task, ``group_size`` episodes) as fast as the
  buffer admits them, and puts each finished group into the buffer;
* the **trainer** side (:meth:`Orchestrator.step`) takes a batch of ``groups_per_step`` groups, trains
  on it, and publishes the new adapter to the engines.

The modes differ only in the staleness bound η. ``sync`` is η = 0: admission lets only the current
step's groups start, so generation of step k+1 waits for the weights of step k (generate → train →
sync, with nothing in flight during the update). ``async`` is η ≥ 1: the producer keeps generating for
the next steps while the trainer trains, and a weight update lands under running rollouts.

**Partial rollouts.** With ``update_mode = "keep"`` an update pauses the engines with in-flight
requests frozen (their KV cache kept), copies the adapter in place, relabels the served weight
version and resumes: those requests continue under the new weights, and the engine's per-token
``weight_versions`` spans tag each token with the version that produced it. ``"wait"`` drains running
requests first (no token of a request spans versions; the engine idles during the drain). The
rollout loop salts the prefix cache with the policy version, so a *new* request never reuses KV
computed by old weights.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentrl.config.run import PipelineConfig
from agentrl.core.types import Trajectory
from agentrl.core.versions import PolicyVersion
from agentrl.environment.base import Task
from agentrl.inference.wire import NoEnginesError
from agentrl.orchestrator.buffer import RolloutBuffer
from agentrl.orchestrator.metrics import nothing_trained, step_metrics
from agentrl.orchestrator.parts import EngineControl, GroupRunner, Trainer
from agentrl.orchestrator.samples import carries_signal, to_samples
from agentrl.weight_sync.base import Publisher

log = logging.getLogger(__name__)


async def live_update(engine: EngineControl, publisher: Publisher, version: int, *, paused: bool = True,
                      mode: str = "keep") -> dict[str, Any]:
    """Make ``version`` live in the engines. With ``paused``, generation is paused (``mode`` keep:
    in-flight requests frozen with their KV; wait: drained) around the copy and the version relabel,
    so no token is produced by a half-updated adapter or tagged with the wrong version. A publisher whose
    engines apply each update between two of their steps with its label (``atomic``: local control sockets)
    needs no ``keep`` pause: nothing runs in between."""
    if paused and mode == "keep" and getattr(publisher, "atomic", False):
        paused = False
    if paused:
        await engine.pause(mode)
    try:
        t = time.perf_counter()
        out = dict(await publisher.publish(version))
        out["update_s"] = time.perf_counter() - t
    finally:
        if paused:
            await engine.resume()
    return out


class Activity:
    """Busy-time accounting for a resource that is busy while at least one user holds it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.active = 0
        self._busy = 0.0
        self._since = 0.0

    def enter(self) -> None:
        if self.active == 0:
            self._since = self.clock()
        self.active += 1

    def exit(self) -> None:
        self.active -= 1
        if self.active == 0:
            self._busy += self.clock() - self._since

    def busy_s(self) -> float:
        """Total busy seconds so far (including the current busy spell)."""
        return self._busy + (self.clock() - self._since if self.active else 0.0)


class Orchestrator:
    """Runs the producer task and performs training steps; use as ``async with``."""

    def __init__(
        self,
        *,
        runner: GroupRunner,
        trainer: Trainer,
        publisher: Publisher,
        engine: EngineControl,
        sample_task: Callable[[], Task],
        pipeline: PipelineConfig,
        groups_per_step: int,
        group_size: int,
        version: PolicyVersion | int = 0,
        normalize_std: bool = True,
        keep_failed: bool = False,
        engines_back: Callable[[], Awaitable[object]] | None = None,
        max_skips_per_step: int = 0,
    ) -> None:
        self.runner = runner
        self.trainer = trainer
        self.publisher = publisher
        self.engine = engine
        self.sample_task = sample_task
        self.group_size = group_size
        self.policy = version if isinstance(version, PolicyVersion) else PolicyVersion(version)
        """The policy version's owner (a run's, or one of its own from an integer): the one version every
        part of the run reads (see ``agentrl.core.versions``); trained on, published as ``version + 1``, then
        bumped here, which the buffer sees."""
        self.update_mode = pipeline.update_mode
        self.max_token_age = pipeline.token_age_cap()
        """Loss tokens older than this (versions behind the policy trained) are masked out and counted."""
        self.normalize_std = normalize_std
        self.keep_failed = keep_failed
        self.engines_back = engines_back
        """Awaited when a weight update finds no engine in rotation; returns once one is back in rotation
        (the run bounds the wait), and the update is published again. None: the ``NoEnginesError`` ends
        the step."""
        self.max_skips_per_step = max_skips_per_step
        """Dynamic sampling: finished groups with no advantage (all rewards equal) skipped per step at most,
        their slots going to new groups (0: every group is kept)."""
        self.skips = {"step": 0, "total": 0, "tokens": 0}
        """Skipped groups this step and in all, and the model tokens they held (generated, never trained)."""
        self.engines_waited_s = 0.0
        """Seconds weight updates have waited for an engine to return, in total."""
        self.buffer = RolloutBuffer(pipeline, groups_per_step, self.policy)
        self.generating = Activity()
        self.training = Activity()
        self.interrupted_groups = 0
        self.failed_groups = 0
        self._groups: set[asyncio.Task[None]] = set()
        self._producer: asyncio.Task[None] | None = None
        self._last_step_end = time.perf_counter()
        self._last_busy = 0.0
        self._tokens_total = 0
        self.last_batch: list[list[Trajectory]] = []
        """The groups the last :meth:`step` trained on (for sample tables)."""

    @property
    def version(self) -> int:
        """The current policy version (read-only: its owner is :attr:`policy`)."""
        return self.policy.value

    async def __aenter__(self) -> Orchestrator:
        self._producer = asyncio.create_task(self._produce(), name="rollout-producer")
        self._last_step_end = time.perf_counter()
        self._last_busy = self.generating.busy_s()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop producing and cancel the groups in flight (their episodes end as ``aborted``)."""
        self.buffer.close()
        pending = [t for t in (self._producer, *self._groups) if t is not None and not t.done()]
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        self._groups.clear()

    # -- producer -------------------------------------------------------------------------------

    async def _produce(self) -> None:
        """Start one group whenever the buffer admits one; forever (until the buffer closes)."""
        from agentrl.orchestrator.buffer import BufferClosed

        try:
            while True:
                admitted = await self.buffer.admit(1)
                task = self.sample_task()
                t = asyncio.create_task(self._group(task, admitted), name=f"group-{task.get('id', '')}")
                self._groups.add(t)
                t.add_done_callback(self._groups.discard)
        except BufferClosed:
            return

    async def _group(self, task: Task, admitted: int) -> None:
        self.generating.enter()
        try:
            group = await self.runner.run_group(task, self.group_size)
        except asyncio.CancelledError:
            self.buffer.release(admitted)
            raise
        except Exception as e:  # the runner records episode failures itself; this is a bug, not data
            log.exception("rollout group for task %s failed: %s", task.get("id"), e)
            self.failed_groups += 1
            self.buffer.release(admitted)
            return
        finally:
            self.generating.exit()
        if self.skips["step"] < self.max_skips_per_step and not carries_signal(group, keep_failed=self.keep_failed):
            self.skips["step"] += 1
            self.skips["total"] += 1
            self.skips["tokens"] += sum(t.num_model_tokens for t in group)
            self.buffer.release(admitted)  # its slot goes to a new group
            return
        self.buffer.put(group, admitted)

    # -- trainer --------------------------------------------------------------------------------

    async def step(self) -> dict[str, Any]:
        """One optimizer step: wait for a batch, train on it, publish the new version; its metrics."""
        t0 = time.perf_counter()
        batch = await self.buffer.get_batch(self.version)
        t1 = time.perf_counter()
        self.last_batch = batch
        samples, stats = to_samples(batch, normalize_std=self.normalize_std, keep_failed=self.keep_failed,
                                    age_cap=(self.version, self.max_token_age))
        self.training.enter()
        try:
            train_metrics = await self.trainer.train(samples, self.version) if samples else nothing_trained()
        finally:
            self.training.exit()
        t2 = time.perf_counter()
        trained_on = self.version
        in_flight = self.generating.active
        self.interrupted_groups += in_flight
        self.policy.updating()  # the trainer now holds version trained_on + 1
        update: dict[str, Any] = {}
        while not update:
            try:
                update = await live_update(self.engine, self.publisher, trained_on + 1, paused=bool(in_flight),
                                           mode=self.update_mode)
            except NoEnginesError:  # every engine is out of rotation: wait for one, then publish again
                if self.engines_back is None:
                    raise
                t_wait = time.perf_counter()
                await self.engines_back()
                self.engines_waited_s += time.perf_counter() - t_wait
        update["engines_waited_s_total"] = self.engines_waited_s
        self.policy.bump()  # the one version change: the buffer wakes producers waiting on the bound
        skipped, self.skips["step"] = self.skips["step"], 0
        t3 = time.perf_counter()
        step_s = t3 - self._last_step_end
        busy = self.generating.busy_s()
        gen_s = busy - self._last_busy
        self._last_step_end, self._last_busy = t3, busy
        self._tokens_total += stats.total_tokens
        return step_metrics(
            batch, stats, train=train_metrics, update=update, groups_interrupted=in_flight, trained_on=trained_on,
            times=(t0, t1, t2, t3), step_s=step_s, gen_s=gen_s, groups_in_flight=self.generating.active,
            interrupted_groups_total=self.interrupted_groups, failed_groups_total=self.failed_groups,
            buffer=self.buffer.stats(), skipped={"groups": skipped, "total": self.skips["total"],
                                                 "tokens": self.skips["tokens"]})
