"""Every weight-sync transport, by name: its config class (:mod:`agentrl.config.sync`), its publisher half
(a module of this package) and its engine half (a module of :mod:`agentrl.engine.transports` of the same
name, or vLLM's own API where the engine needs no agentrl code), with the worker methods the publisher calls.

Adding a transport (say CUDA IPC, or a delta-compressed network sync) touches four places:

1. its config class in :mod:`agentrl.config.sync`, added to ``WeightSyncConfig`` (and, if a run can serve
   from it, to the rule of :func:`~agentrl.config.sync.refusal` and the candidates of
   :func:`~agentrl.config.sync.settle`);
2. its publisher half, ``agentrl/weight_sync/<name>.py``: a class with ``publish(version)`` and
   ``open_publisher(sync, target)``;
3. its engine half, ``agentrl/engine/transports/<name>.py``: a worker-extension mixin whose ``agentrl_*``
   methods apply what the publisher sends, added to :class:`agentrl.engine.extension.WorkerExtension`;
4. one line in :data:`TRANSPORTS` below.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentrl.config.errors import SettingError
from agentrl.config.sync import TRANSPORTS as CONFIGS
from agentrl.config.sync import TransportConfig
from agentrl.weight_sync import file, full, merged, nccl, network, shm
from agentrl.weight_sync.base import Publisher, PublishTarget
from agentrl.weight_sync.control import OPEN_METHOD
from agentrl.weight_sync.hosts import PROBE_METHOD


@dataclass(frozen=True)
class Transport:
    """One transport's two halves."""

    name: str
    open: Callable[[Any, PublishTarget], contextlib.AbstractAsyncContextManager[Publisher]]
    """The publisher half's ``open_publisher(sync, target)``."""
    engine: str | None
    """The engine half: the module of its worker methods (None: vLLM's own API, ``engine_api``)."""
    methods: tuple[str, ...] = ()
    """The worker methods (``collective_rpc``) of the engine half: those the publisher calls, and any other it
    offers (a whole checkpoint loaded from a path, for tests and tools)."""
    engine_api: str = ""
    """Where the engine half is vLLM's own: the API the publisher uses."""

    @property
    def config(self) -> type[TransportConfig]:
        """The transport's config class."""
        return CONFIGS[self.name]


def _engine(name: str) -> str:
    return f"agentrl.engine.transports.{name}"


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (
    Transport("shm", shm.open_publisher, _engine("shm"), (shm.UPDATE_METHOD, PROBE_METHOD, OPEN_METHOD)),
    Transport("network", network.open_publisher, _engine("network"),
              (network.UPDATE_BYTES_METHOD, network.WRITE_METHOD)),
    Transport("file", file.open_publisher, None, engine_api="POST /v1/load_lora_adapter (load_inplace)"),
    Transport("merged", merged.open_publisher, _engine("merged"),
              (merged.MERGE_METHOD, merged.MERGE_BYTES_METHOD, PROBE_METHOD, OPEN_METHOD)),
    Transport("full", full.open_publisher, _engine("full"),
              (full.DTYPE_METHOD, full.BEGIN_METHOD, full.LOAD_METHOD, full.LOAD_BYTES_METHOD, full.FINISH_METHOD,
               PROBE_METHOD, "agentrl_load_weights_from_path")),
    Transport("nccl", nccl.open_publisher, None,
              engine_api="vLLM's weight-transfer engine (POST /start_weight_update, /update_weights, "
                         "/finish_weight_update)"),
)}
"""Transport name -> its two halves (every name of :mod:`agentrl.config.sync` but ``auto``, which resolution
settles into one of them)."""


def open_publisher(sync: TransportConfig, target: PublishTarget) -> contextlib.AbstractAsyncContextManager[Publisher]:
    """The publisher of the settled transport ``sync`` over ``target``'s engines (an async context manager:
    it owns the transport's segments and control links until it exits)."""
    if sync.transport not in TRANSPORTS:
        raise SettingError(f"pipeline.weight_sync = {sync.transport!r} is not settled: resolve the config first "
                           "(RunConfig.resolved)")
    return TRANSPORTS[sync.transport].open(sync, target)
