"""Full-weight sync on GPUs through vLLM's own NCCL weight-transfer engine (trainer side).

Rank 0 opens one NCCL group per engine (the engine's workers join it at ``init_weight_transfer_engine``) and
drives the engine's ``start_weight_update`` / ``update_weights`` / ``finish_weight_update`` routes while it
broadcasts the weights; every rank takes part in the FSDP2 gather (``full_tensor()``) of each parameter. The
groups are opened on the first sync and reused. The engines must run with ``--weight-transfer-config
'{"backend": "nccl"}'`` (``inference.weight_transfer_backend``) and the trainer needs vLLM importable.

This path never ran in this project's measurements (the CPU build of vLLM has no weight-transfer engine);
the shared-memory and network paths (:mod:`agentrl.trainer.weights`) are the ones that ran.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import httpx
import torch.distributed as dist
from torch import nn

from agentrl.core.errors import ConfigError


class NcclSyncUnavailable(ConfigError, RuntimeError):
    """``pipeline.weight_sync = 'nccl'`` needs vLLM (its NCCL weight-transfer engine) in the trainer's environment."""

    code = "config.nccl_sync_needs_vllm"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _engine_world_size(url: str) -> int:
    """Workers of the engine at ``url`` (vLLM's ``GET /get_world_size``)."""
    r = httpx.get(f"{url}/get_world_size", timeout=30)
    r.raise_for_status()
    return int(r.json()["world_size"])


class NcclSender:
    """This rank's NCCL weight-transfer engines, one per inference engine URL (opened on first use)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.engines: dict[str, Any] = {}

    def _open(self, url: str, master_address: str) -> Any:
        try:
            from vllm.distributed.weight_transfer.base import ModuleSource
            from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
            from vllm.distributed.weight_transfer.nccl_engine import (
                NCCLTrainerInitInfo,
                NCCLTrainerWeightTransferEngine,
            )
        except ImportError as exc:
            raise NcclSyncUnavailable("pipeline.weight_sync = 'nccl' needs vLLM installed in the trainer's environment "
                               f"(its NCCL weight-transfer engine): {exc}") from exc
        rank = dist.get_rank()
        info = NCCLTrainerInitInfo(rank=rank, master_address=master_address,
                                   master_port=_free_port(master_address) if rank == 0 else 0,
                                   world_size=1 + _engine_world_size(url) if rank == 0 else 1)
        return NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=HTTPVLLMWeightSyncClient(url), source=ModuleSource(self.model))

    def send(self, urls: list[str], master_address: str) -> dict[str, Any]:
        """Collective: the current weights into every engine of ``urls``, one after the other."""
        t0 = time.perf_counter()
        for url in urls:
            if url not in self.engines:
                self.engines[url] = self._open(url, master_address)
            self.engines[url].send_weights()
        return {"nccl_send_ms": (time.perf_counter() - t0) * 1e3, "engines": len(urls)}
