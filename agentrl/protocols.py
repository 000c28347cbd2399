"""What the pieces of a run need from each other, as typing protocols (one place, so they cannot drift).

The real implementations are :class:`agentrl.inference.InferenceClient` (generator, engine control and
adapter loading), :class:`agentrl.trainer.client.TrainerProcess` (trainer), the publishers in
:mod:`agentrl.sync` and :mod:`agentrl.sync_shm`, and :class:`agentrl.workers.RolloutWorkers` (group
runner). Unit tests pass small fakes that satisfy them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from agentrl.environment import Task
    from agentrl.inference.protocol import Generation
    from agentrl.types import Trajectory


class Generator(Protocol):
    """Samples completions of token-id prompts (the agent loop's view of an inference client)."""

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop_token_ids: list[int] | None = None,
        model: str | None = None,
        key: str | None = None,
        cache_salt: str | None = None,
    ) -> Generation: ...


class EngineControl(Protocol):
    """Pauses and resumes generation on every engine around a weight update."""

    async def pause(self, mode: str = "keep") -> None: ...

    async def resume(self) -> None: ...


class AdapterLoader(Protocol):
    """Loads adapter files into every engine and labels the served weights with a policy version."""

    async def load_lora_adapter(self, name: str, path: str, inplace: bool = True) -> float: ...

    async def set_weight_version(self, version: str) -> None: ...


class EngineRPC(Protocol):
    """Runs worker methods in every engine (the in-place adapter update) and labels the served weights."""

    async def collective_rpc(self, method: str, args: list[str] | None = None,
                             kwargs: dict[str, str] | None = None, timeout: float | None = None) -> list[list[Any]]: ...

    async def reset_prefix_cache(self) -> None: ...

    async def set_weight_version(self, version: str) -> None: ...


class Trainer(Protocol):
    """Trains on a batch of samples generated (mostly) by policy ``policy_version``."""

    async def train(self, samples: Sequence[Any], policy_version: int) -> dict[str, Any]: ...


class AdapterSaver(Protocol):
    """Writes the trained adapter to a directory (file-based weight sync)."""

    async def save_adapter(self, path: Path) -> dict[str, Any]: ...


class AdapterSource(Protocol):
    """Hands out the trained adapter's tensors (shared-memory weight sync)."""

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]: ...


class Publisher(Protocol):
    """Makes policy ``version`` live in every engine; returns the sync's timings."""

    async def publish(self, version: int) -> dict[str, float]: ...


class GroupRunner(Protocol):
    """Runs one GRPO group: ``group_size`` episodes of one task."""

    async def run_group(self, task: Task, group_size: int) -> list[Trajectory]: ...
