"""What a weight-sync publisher needs from the trainer and the engines, and what it offers the orchestrator
(typing protocols, one place, so they cannot drift).

The real implementations are :class:`agentrl.inference.InferenceClient` (adapter loading and the engines'
worker RPC), :class:`agentrl.trainer.client.TrainerProcess` (adapter files and tensors), and the publishers
in :mod:`agentrl.weight_sync.file`, :mod:`agentrl.weight_sync.shm` and :mod:`agentrl.weight_sync.network`.
Unit tests pass small fakes that satisfy them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch


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


class AdapterSaver(Protocol):
    """Writes the trained adapter to a directory (file-based weight sync)."""

    async def save_adapter(self, path: Path) -> dict[str, Any]: ...


class AdapterSource(Protocol):
    """Hands out the trained adapter's tensors (shared-memory weight sync)."""

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]: ...


class Publisher(Protocol):
    """Makes policy ``version`` live in every engine; returns the sync's timings."""

    async def publish(self, version: int) -> dict[str, float]: ...
