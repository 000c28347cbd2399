"""Which engines are on the publisher's host: the transports that carry weights through shared memory
(``shm``, ``merged``, ``full``) probe every engine once at start. The publisher writes a random nonce into a
small shared-memory segment and asks each engine's workers to read it back (``agentrl_probe_shm``). Engines
that can are on this host (and share its ``/dev/shm``): they map the publisher's segments. The others get the
weights in the call body. :class:`RoutedAdapterSync` publishes over one group of engines per path.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from multiprocessing import shared_memory
from typing import Literal

from agentrl.core.errors import EngineError
from agentrl.weight_sync.base import Engines, Publisher
from agentrl.weight_sync.inplace import worker_failures

PROBE_METHOD = "agentrl_probe_shm"


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


async def call_body_engines(carrier: Literal["shm", "network"], client: Engines) -> list[str]:
    """The endpoints that get the weights in the call body: every one for the ``network`` carrier, else those
    that cannot read this host's shared memory (the others map the publisher's segment)."""
    if carrier == "network":
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
