"""What a weight-sync publisher needs from the trainer and the engines, and what it offers the orchestrator
(typing protocols, one place, so they cannot drift).

The real implementations are :class:`agentrl.inference.InferenceClient` (adapter loading and the engines'
worker RPC), :class:`agentrl.trainer.client.TrainerProcess` (adapter files and tensors), and the publishers of
the transports (:mod:`agentrl.weight_sync.registry`). Unit tests pass small fakes that satisfy them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover
    import torch

# The engine half (:mod:`agentrl.engine`, called through vLLM's ``POST /collective_rpc``)
# reports a failure as a per-worker record ``{"ok": False, "code": <one of these>, "error": <message>}``:
# vLLM passes a dict result through as JSON, while an exception would only come back as an HTTP 500 with
# its text. Publishers branch on ``code``, never on ``error`` (for people; its wording may change).
# An engine whose vLLM is not the version agentrl's patches were written for also answers
# ``inference.vllm_version_refused`` (:mod:`agentrl.engine.version_gate`) unless overridden.
ADAPTER_NOT_LOADED = "weight_sync.adapter_not_loaded"
"""The adapter has no slot on that engine yet (never loaded there, or evicted): load it once from a file."""
UPDATE_REFUSED = "weight_sync.update_refused"
"""Any other reason the in-place copy cannot be applied (LoRA disabled, a layout that does not fit the
loaded adapter, shared memory that cannot be mapped): reload from a file or give up."""
BAD_REQUEST = "weight_sync.bad_request"
"""The call's arguments cannot be read (a payload that is not base64 or not the announced size, bad JSON)."""
WRITE_FAILED = "weight_sync.write_failed"
"""The adapter files sent in the call could not be written on the engine's host."""
LOAD_FAILED = "weight_sync.load_failed"
"""A full-weight load step failed on the engine (a bucket whose names or shapes the model does not have, a
load not begun): the engine holds a mix of two versions and must leave the rotation until a complete load."""
SHM_UNAVAILABLE = "weight_sync.shm_unavailable"
"""The engine cannot map the publisher's shared-memory segment (another host): use the network path."""


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


class Engines(Protocol):
    """The engines a publisher serves, as the inference client offers them: their URLs, and every admin call
    (adapter loading, worker RPC, labels) restricted to a subset of them (one group per sync path)."""

    @property
    def endpoints(self) -> list[str]: ...

    def subset(self, urls: list[str]) -> Any: ...


class LoadingEngines(Engines, Protocol):
    """What a full-weight publisher needs of a group of engines: worker RPC, labels and prefix-cache resets as
    for adapters, plus pausing (the load happens while they are paused) and taking an engine out of
    rotation (one whose load failed holds a mix of two versions)."""

    async def collective_rpc(self, method: str, args: list[str] | None = None,
                             kwargs: dict[str, str] | None = None, timeout: float | None = None) -> list[list[Any]]: ...

    async def pause(self, mode: str = "keep") -> None: ...

    async def resume(self) -> None: ...

    async def set_weight_version(self, version: str) -> None: ...

    async def reset_prefix_cache(self, running: bool = False) -> None: ...

    def take_out(self, url: str, reason: str) -> None: ...


class AdapterSaver(Protocol):
    """Writes the trained adapter to a directory (file-based weight sync)."""

    async def save_adapter(self, path: Path) -> dict[str, Any]: ...


class AdapterSource(Protocol):
    """Hands out the trained adapter's tensors (shared-memory weight sync)."""

    async def get_adapter_tensors(self) -> dict[str, torch.Tensor]: ...


class Publisher(Protocol):
    """One transport's publisher half: makes policy ``version`` live in every engine it serves, and returns
    the stages of that sync, each timed (``*_ms``, and ``sync_s`` for the whole), with the counts it reports
    (bytes moved, engines on each path, engines that failed)."""

    async def publish(self, version: int) -> dict[str, float]: ...


@dataclass(frozen=True)
class PublishTarget:
    """What a transport publishes from and into (:func:`agentrl.weight_sync.registry.open_publisher`)."""

    trainer: Any
    """The trainer (:class:`agentrl.trainer.client.TrainerProcess`): adapter tensors and files, weight buckets,
    or the NCCL broadcast, as its transport needs."""
    engines: Any
    """The engines to serve: an :class:`~agentrl.inference.client.InferenceClient` or a subset of one."""
    adapter_name: str = "policy"
    """The LoRA slot's name in the engines (the adapter transports)."""
    adapter_dir: Path = Path("adapters")
    """Where the adapter's files go on this host (the file transport, and an engine's first slot)."""
    b_scale: float | None = None
    """The adapter's scaling (``lora_alpha / r``): the in-place transports send B pre-scaled with it."""
