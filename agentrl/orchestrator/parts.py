"""What the orchestrator needs from the engines, the trainer and the group runner (typing protocols).

The real implementations are :class:`agentrl.inference.InferenceClient` (engine control),
:class:`agentrl.trainer.client.TrainerProcess` (trainer; a training run's also checkpoints and saves the final
policy: :class:`RunTrainer`) and :class:`agentrl.rollout.groups.RolloutWorkers` (group runner); the publisher
is :class:`agentrl.weight_sync.base.Publisher`. Unit tests pass small fakes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.config.run import SamplingConfig
    from agentrl.core.types import Trajectory
    from agentrl.environment.base import Task


class EngineControl(Protocol):
    """Pauses and resumes generation on every engine around a weight update."""

    async def pause(self, mode: str = "keep") -> None: ...

    async def resume(self) -> None: ...


class Trainer(Protocol):
    """Trains on a batch of samples generated (mostly) by policy ``policy_version``."""

    async def train(self, samples: Sequence[Any], policy_version: int) -> dict[str, Any]: ...


class RunTrainer(Trainer, Protocol):
    """What a training run needs of its trainer besides ``train``: checkpoints (written every
    ``checkpoint_every`` steps, restored by ``--resume``) and the final policy directory. (The run hands the
    same trainer to its weight publisher, which needs the sources of :mod:`agentrl.weight_sync`.)"""

    async def save_checkpoint(self, path: str | Path) -> dict[str, Any]: ...

    async def load_checkpoint(self, path: str | Path) -> dict[str, Any]: ...

    async def save_adapter(self, path: str | Path) -> dict[str, Any]: ...


class GroupRunner(Protocol):
    """Runs one GRPO group: ``group_size`` episodes of one task."""

    async def run_group(self, task: Task, group_size: int) -> list[Trajectory]: ...


class EpisodeRunner(GroupRunner, Protocol):
    """Runs groups of episodes at its ``sampling`` settings, and gives views of itself at others (an
    evaluation's temperature) that share its engines and its bound on episodes in flight."""

    sampling: SamplingConfig

    def with_sampling(self, sampling: SamplingConfig) -> EpisodeRunner: ...

    async def run_groups(self, tasks: Sequence[Task], group_size: int) -> list[list[Trajectory]]: ...
