"""The ``nccl`` transport: full-weight sync on GPUs through vLLM's own NCCL weight-transfer engine (its engine
half is vLLM's, started by ``inference.weight_transfer_backend``, which resolution sets for this transport).

The engines pause with ``keep``; the trainer broadcasts its weights into every engine over NCCL (rank 0
drives each engine's ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``:
:mod:`agentrl.trainer.nccl_sync`); then the engines get the new version's label, drop their prefix cache and
resume, as with :class:`agentrl.weight_sync.full.FullWeightSync`. A failed transfer leaves every engine it
reached with an unknown mix of weights: all of them leave the rotation until a complete load.

Never ran in this project's measurements: the CPU build of vLLM has no weight-transfer engine, and the GPU
machine the project could borrow has no vLLM. The unit tests check the sequence with fakes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from agentrl.config.sync import NcclSync
from agentrl.weight_sync.base import LoadingEngines, Publisher, PublishTarget
from agentrl.weight_sync.rotation import abandon, go_live, live_urls


class NcclSource(Protocol):
    """The trainer, as this publisher needs it (:class:`agentrl.trainer.client.TrainerProcess`)."""

    async def nccl_send_weights(self, urls: list[str], master_address: str) -> dict[str, Any]: ...


class NcclWeightSync:
    """Publish full weights with vLLM's NCCL weight-transfer engine. ``master_address``: an address of the
    trainer's rank-0 node that every engine's workers can reach (the NCCL rendezvous)."""

    def __init__(self, trainer: NcclSource, engine: LoadingEngines, master_address: str, *,
                 set_version: bool = True) -> None:
        self.trainer = trainer
        self.engine = engine
        self.master_address = master_address
        self.set_version = set_version

    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine in rotation; returns each stage's time in ms."""
        t0 = time.perf_counter()
        await self.engine.pause("keep")
        live = live_urls(self.engine)
        t1 = time.perf_counter()
        try:
            out = await self.trainer.nccl_send_weights(live, self.master_address)
        except BaseException as exc:
            await abandon(self.engine, {u: f"NCCL transfer failed: {exc}" for u in live})
            raise
        t2 = time.perf_counter()
        live_ms = await go_live(self.engine, live, version, set_version=self.set_version)
        t3 = time.perf_counter()
        return {"full_pause_ms": (t1 - t0) * 1e3, "full_nccl_ms": (t2 - t1) * 1e3,
                "nccl_send_ms": float(out.get("nccl_send_ms", 0.0)), **live_ms,
                "total_ms": (t3 - t0) * 1e3, "sync_s": t3 - t0, "engines_failed": 0.0}


@contextlib.asynccontextmanager
async def open_publisher(sync: NcclSync, target: PublishTarget) -> AsyncIterator[Publisher]:
    """The ``nccl`` transport over ``target``'s engines, with its rendezvous at ``sync.addr``."""
    yield NcclWeightSync(target.trainer, target.engines, sync.addr)
