"""Rollout workers: run GRPO groups of episodes concurrently, with a bound on episodes in flight."""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections.abc import Callable, Sequence

from agentrl.config.run import SamplingConfig
from agentrl.core.types import Routing, Trajectory
from agentrl.environment.base import Environment, Task
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.generator import Generator
from agentrl.rollout.loop import run_episode


class RolloutWorkers:
    """Runs episodes of one environment class against an inference client.

    ``max_concurrency`` bounds the number of episodes in flight across all groups.
    """

    def __init__(
        self,
        env_cls: type[Environment],
        client: Generator,
        chat: ChatFormat,
        sampling: SamplingConfig,
        *,
        max_concurrency: int = 64,
        model: str | None = None,
        policy_version: Callable[[], int] = lambda: 0,
        routing: Routing | None = None,
        sampling_masks: bool = False,
    ) -> None:
        self.env_cls = env_cls
        self.routing = routing
        """MoE models: the empty routing every episode starts from (routing capture on), else None."""
        self.sampling_masks = sampling_masks
        """Record each sampled token's kept set where sampling truncates (the engines' capture on)."""
        self.client = client
        self.chat = chat
        self.sampling = sampling
        self.model = model
        self.policy_version = policy_version
        self._slots = asyncio.Semaphore(max_concurrency)

    def with_sampling(self, sampling: SamplingConfig) -> RolloutWorkers:
        """These workers with other sampling settings (an evaluation's temperature), sharing the client, the
        chat format and the bound on episodes in flight; ``self`` keeps its own (the producer's episodes that
        start meanwhile sample as before)."""
        other = copy.copy(self)
        other.sampling = sampling
        return other

    async def run_one(self, task: Task, group_id: str = "") -> Trajectory:
        """One episode, waiting for a free slot first."""
        async with self._slots:
            return await run_episode(
                self.env_cls, task, self.client, self.chat, self.sampling,
                model=self.model, group_id=group_id, policy_version=self.policy_version,
                routing=self.routing, sampling_masks=self.sampling_masks,
            )

    async def run_group(self, task: Task, group_size: int) -> list[Trajectory]:
        """``group_size`` episodes of the same task, sharing a group id."""
        gid = f"{task.get('id', '')}#{uuid.uuid4().hex[:8]}"
        return list(await asyncio.gather(*(self.run_one(task, gid) for _ in range(group_size))))

    async def run_groups(
        self,
        tasks: Sequence[Task],
        group_size: int,
        on_done: Callable[[list[Trajectory]], None] | None = None,
    ) -> list[list[Trajectory]]:
        """One group per task, all in flight together (bounded by the concurrency limit)."""

        async def one(task: Task) -> list[Trajectory]:
            group = await self.run_group(task, group_size)
            if on_done is not None:
                on_done(group)
            return group

        self.env_cls.upcoming(tasks)
        return list(await asyncio.gather(*(one(t) for t in tasks)))
