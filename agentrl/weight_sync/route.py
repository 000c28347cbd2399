"""Which weight-sync path each engine gets: shared memory on this host, the network for the others (LoRA
adapters and full weights alike).

``pipeline.weight_sync = "shm"`` (the default) probes every engine once at start: the publisher writes a
random nonce into a small shared-memory segment and asks each engine's workers to read it back
(``agentrl_probe_shm``). Engines that can are on this host (and share its ``/dev/shm``): they get the
shared-memory path, with files as the fallback. The others get the network path
(:class:`agentrl.weight_sync.network.NetworkAdapterSync`). ``"network"`` forces the network path for every engine
(for tests, or hosts that share ``/dev/shm`` names but should not be trusted to), and ``"file"`` uses files.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any, Literal

from agentrl.core.errors import ConfigError, EngineError
from agentrl.weight_sync.base import Engines, Publisher
from agentrl.weight_sync.control import controlled
from agentrl.weight_sync.file import FileAdapterSync
from agentrl.weight_sync.network import NetworkAdapterSync
from agentrl.weight_sync.shm import SharedMemoryAdapterSync, worker_failures

PROBE_METHOD = "agentrl_probe_shm"


class WeightSyncModeError(ConfigError, ValueError):
    """``pipeline.weight_sync`` names a path that cannot carry this run's weights (files for full weights,
    NCCL for a LoRA adapter)."""

    code = "config.weight_sync_mode"


async def engines_on_this_host(client: Engines, timeout_s: float = 30.0) -> dict[str, bool]:
    """Per endpoint: whether every worker of it can read a shared-memory segment written here."""
    nonce = secrets.token_hex(16)
    shm = shared_memory.SharedMemory(name=f"agentrl_probe_{secrets.token_hex(6)}", create=True, size=len(nonce))
    try:
        shm.buf[: len(nonce)] = nonce.encode()

        async def one(url: str) -> bool:
            try:
                workers = (await client.subset([url]).collective_rpc(
                    PROBE_METHOD, kwargs={"shm_name": shm.name, "nonce": nonce}, timeout=timeout_s))[0]
            except EngineError:
                return False  # no worker extension there, or no answer: it cannot take shared memory either
            return bool(workers) and not worker_failures(workers)

        urls = client.endpoints
        return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls)), strict=True))
    finally:
        shm.close()
        shm.unlink()


async def call_body_engines(mode: str, client: Engines) -> list[str]:
    """The endpoints that get the weights in the call body: every one for ``"network"``, else those that
    cannot read this host's shared memory (the others map the publisher's segment)."""
    if mode == "network":
        return list(client.endpoints)
    return [u for u, ok in (await engines_on_this_host(client)).items() if not ok]


class RoutedAdapterSync:
    """One publish over several publishers, each on its own group of engines; the timings are merged
    (``sync_s`` is the slowest group's) and ``engines_shm`` / ``engines_network`` say how many took each path."""

    def __init__(self, groups: list[tuple[str, Publisher, int]]) -> None:
        self.groups = groups

    @property
    def atomic(self) -> bool:
        """Whether every group applies a publish between engine steps, labelled (no pause needed)."""
        return all(getattr(p, "atomic", False) for _, p, _ in self.groups)

    async def publish(self, version: int) -> dict[str, float]:
        """Publish ``version`` through every group at once."""
        t0 = time.perf_counter()
        outs = await asyncio.gather(*(p.publish(version) for _, p, _ in self.groups))
        merged: dict[str, float] = {}
        for out in outs:
            merged.update(out)
        merged["sync_s"] = time.perf_counter() - t0
        for kind, _, n in self.groups:
            merged[f"engines_{kind}"] = float(n)
        return merged


@contextlib.asynccontextmanager
async def adapter_publisher(mode: Literal["shm", "network", "file"], trainer: Any, client: Engines,
                            name: str, adapter_dir: Path, control: bool = True,
                            b_scale: float | None = None) -> AsyncIterator[Publisher]:
    """The publisher ``mode`` asks for, over ``client``'s engines (see the module docstring). Its first
    ``publish`` creates the engines' LoRA slots. No prefix-cache resets: rollouts salt the cache with the
    policy version instead. ``control``: the engines on this host take each sync over their local control
    socket (:mod:`agentrl.weight_sync.control`) where they can open one. ``b_scale``: the adapter's scaling
    (``lora_alpha / r``), with which the in-place paths send B pre-scaled."""
    if mode == "file":
        yield FileAdapterSync(trainer, client, adapter_dir, name)
        return
    net_dir = adapter_dir / "network"
    if mode == "network":
        yield NetworkAdapterSync(trainer, client, name, net_dir, reset="", b_scale=b_scale)
        return
    local = await engines_on_this_host(client)
    here = [u for u, ok in local.items() if ok]
    away = [u for u, ok in local.items() if not ok]
    groups: list[tuple[str, Publisher, int]] = []
    async with contextlib.AsyncExitStack() as stack:
        if here:
            sub = client.subset(here)
            fast = await stack.enter_async_context(controlled(sub, enabled=control))
            shm = SharedMemoryAdapterSync(trainer, fast, name, reset="", b_scale=b_scale,
                                          fallback=FileAdapterSync(trainer, sub, adapter_dir, name))
            groups.append(("shm", stack.enter_context(shm), len(here)))
        if away:
            groups.append(("network", NetworkAdapterSync(trainer, client.subset(away), name, net_dir, reset="",
                                                         b_scale=b_scale), len(away)))
        yield groups[0][1] if len(groups) == 1 else RoutedAdapterSync(groups)


@contextlib.asynccontextmanager
async def full_weight_publisher(mode: Literal["shm", "network", "file", "nccl"], trainer: Any, client: Any,
                                nccl_addr: str = "127.0.0.1") -> AsyncIterator[Publisher]:
    """The full-weight publisher over ``client``'s engines: shared memory for the engines on this host, the
    call body for the others (``"network"``: for every engine), or vLLM's NCCL weight-transfer engine
    (``"nccl"``, rendezvous at ``nccl_addr``). Files are refused: they carry adapters only."""
    from agentrl.weight_sync.full import FullWeightSync

    if mode == "nccl":
        from agentrl.weight_sync.nccl import NcclWeightSync

        yield NcclWeightSync(trainer, client, nccl_addr)
        return
    if mode == "file":
        raise WeightSyncModeError("pipeline.weight_sync = 'file' reloads LoRA adapters; full weights go through shared "
                         "memory or the network ('shm' or 'network')")
    with FullWeightSync(trainer, client, remote=await call_body_engines(mode, client)) as publisher:
        yield publisher


@contextlib.asynccontextmanager
async def merged_adapter_publisher(mode: Literal["shm", "network", "file", "nccl"], trainer: Any,
                                   client: Any, control: bool = True) -> AsyncIterator[Publisher]:
    """The merged-adapter publisher over ``client``'s engines: the adapter through shared memory to the engines
    on this host, in the call body to the others (``"network"``: to every engine), merged by each engine
    (``control``: those on this host over their local control socket where they can open one)."""
    from agentrl.weight_sync.merged import MergedAdapterSync

    if mode in ("file", "nccl"):
        raise WeightSyncModeError(f"pipeline.weight_sync = {mode!r} cannot carry a merged adapter "
                                  "(pipeline.lora_sync = 'merged'): use 'shm' or 'network'")
    remote = await call_body_engines(mode, client)
    here = [u for u in client.endpoints if u not in remote]
    async with controlled(client, here, enabled=control and bool(here)) as fast:
        with MergedAdapterSync(trainer, fast, remote=remote) as publisher:
            yield publisher


def weight_publisher(mode: Literal["shm", "network", "file", "nccl"], trainer: Any, client: Any, *, lora: bool,
                     name: str, adapter_dir: Path, merged: bool = False, nccl_addr: str = "127.0.0.1",
                     control: bool = True, b_scale: float | None = None,
                     ) -> contextlib.AbstractAsyncContextManager[Publisher]:
    """The publisher of a run: LoRA adapters into the engines' LoRA slots (:func:`adapter_publisher`), merged
    by the engines into their weights (``merged``: :func:`merged_adapter_publisher`), or full weights
    (:func:`full_weight_publisher`). ``control``: LoRA syncs to engines on this host over their local control
    sockets (``pipeline.sync_control``); ``b_scale``: the adapter's scaling, B sent pre-scaled (LoRA slots)."""
    if merged:
        return merged_adapter_publisher(mode, trainer, client, control)
    if lora:
        if mode == "nccl":
            raise WeightSyncModeError("weight sync 'nccl' carries full weights; a LoRA adapter uses 'shm', 'network' or 'file'")
        return adapter_publisher(mode, trainer, client, name, adapter_dir, control, b_scale)
    return full_weight_publisher(mode, trainer, client, nccl_addr)
