"""Weight sync over the network: the adapter travels in the request body, for engines on other hosts.

An engine on another host can map neither this host's shared memory nor its files. The trainer's LoRA
tensors are packed in the same layout as the shared-memory segment (:func:`agentrl.weight_sync.inplace.pack_layout`),
base64-encoded into one ``POST /collective_rpc`` per engine, and every worker decodes them into a buffer of
its own (reused while the layout stays the same) and copies them into the adapter's live slot with the
same copy plan as the shared-memory path (``agentrl_update_lora_bytes`` in
:mod:`agentrl.engine.adapter`). An engine that has no slot yet gets the adapter's files in the call
(``agentrl_write_adapter`` writes them under the engine host's temporary directory) and loads them from
there once. Nothing needs a shared filesystem. The engine half is :mod:`agentrl.engine.transports.network`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import secrets
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch

from agentrl.config.sync import NetworkSync
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import ADAPTER_NOT_LOADED, Publisher, PublishTarget
from agentrl.weight_sync.inplace import (
    SyncError,
    after_copy,
    applied,
    fill,
    layout_meta,
    layout_views,
    pack_layout,
    worker_failures,
)

UPDATE_BYTES_METHOD = "agentrl_update_lora_bytes"
WRITE_METHOD = "agentrl_write_adapter"


class NetworkAdapterSync:
    """Publish adapters in the HTTP body: gather (trainer) → pack + base64 → decode + in-place copy (engines).

    ``engine`` is an :class:`~agentrl.inference.client.InferenceClient` or one of its
    :class:`~agentrl.inference.client.EngineSubset` s; ``trainer`` hands out the adapter's tensors and
    saves its files (for a slot that does not exist yet); ``work_dir`` holds those files on this host.
    """

    def __init__(self, trainer: Any, engine: Any, name: str, work_dir: Path, *, set_version: bool = True,
                 reset: str = "1", rpc_timeout_s: float = 120.0, b_scale: float | None = None) -> None:
        self.trainer = trainer
        self.b_scale = b_scale
        """The adapter's scaling, when known: B goes pre-scaled (as :class:`SharedMemoryAdapterSync` sends it)."""
        self.engine = engine
        self.name = name
        self.work_dir = Path(work_dir)
        self.set_version = set_version
        self.reset = reset
        self.rpc_timeout_s = rpc_timeout_s
        self._layout: list[Any] = []
        self._buf: torch.Tensor | None = None
        self._views: list[torch.Tensor] = []
        self._meta_json = ""
        self._nbytes = 0
        self._layout_id = ""
        self._run = secrets.token_hex(4)

    def pack(self, tensors: dict[str, torch.Tensor]) -> str:
        """The base64 payload of ``tensors`` (the packing buffer is reused while the layout stays the same)."""
        layout, nbytes = pack_layout(tensors)
        if layout != self._layout or self._buf is None:
            self._buf = torch.zeros(max(nbytes, 1), dtype=torch.uint8)
            self._views = layout_views(self._buf, layout)
            self._layout = layout
            self._meta_json = layout_meta(layout, nbytes, self.b_scale)
            self._nbytes = nbytes
            self._layout_id = f"{self._run}-{secrets.token_hex(4)}"
        fill(self._views, layout, tensors, self.b_scale)
        return base64.b64encode(self._buf[:nbytes].numpy().tobytes()).decode("ascii")

    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine of ``engine``; returns each stage's time in ms."""
        t0 = time.perf_counter()
        tensors = await self.trainer.get_adapter_tensors()
        t1 = time.perf_counter()
        payload = await asyncio.to_thread(self.pack, tensors)
        t2 = time.perf_counter()
        kwargs = {"adapter": self.name, "payload_b64": payload, "meta_json": self._meta_json,
                  "layout_id": self._layout_id, "reset_prefix_cache": self.reset,
                  "weight_version": engine_label(version) if self.set_version else ""}
        results = await self.engine.collective_rpc(UPDATE_BYTES_METHOD, kwargs=kwargs, timeout=self.rpc_timeout_s)
        t3 = time.perf_counter()
        urls = self.engine.endpoints
        missing = [url for url, workers in zip(urls, results, strict=True)
                   if any(_not_loaded(w) for w in workers)]
        failed = [f"{url}: {why}" for url, workers in zip(urls, results, strict=True) if url not in missing
                  for why in worker_failures(workers)]
        if failed:
            raise SyncError(f"network LoRA update refused: {'; '.join(failed)}")
        if missing:
            await self._create_slots(version, missing)
        copied = [w for url, workers in zip(urls, results, strict=True) if url not in missing
                  for w in applied(workers)]
        reset_ok = await after_copy(self.engine, copied, version, set_version=self.set_version, reset=self.reset)
        t4 = time.perf_counter()
        return {
            "trainer_gather_ms": (t1 - t0) * 1e3,
            "network_pack_ms": (t2 - t1) * 1e3,
            "network_rpc_ms": (t3 - t2) * 1e3,
            "network_engine_ms": max((float(w["engine_ms"]) for w in copied), default=0.0),
            "network_engine_copies": max((float(w.get("copies", 0)) for w in copied), default=0.0),
            "network_decode_ms": max((float(w.get("decode_ms", 0.0)) for w in copied), default=0.0),
            "network_ms": (t4 - t0) * 1e3,
            "network_prefix_reset_ok": reset_ok,
            "network_payload_bytes": float(len(payload)),
            "network_slots_created": float(len(missing)),
            "sync_s": t4 - t0,
            "adapter_bytes": float(self._nbytes),
        }

    async def _create_slots(self, version: int, urls: list[str]) -> None:
        """Ship the adapter's files to engines without a slot and load them there (once per engine)."""
        local = self.work_dir / f"v{version:06d}"
        await self.trainer.save_adapter(local)
        files = {p.name: base64.b64encode(p.read_bytes()).decode("ascii") for p in sorted(local.iterdir())
                 if p.is_file()}
        shutil.rmtree(local, ignore_errors=True)
        body = {"dir_name": f"{self.name}-{self._run}-v{version:06d}", "files_json": json.dumps(files)}

        async def one(url: str) -> None:
            engine = self.engine.subset([url])
            workers = (await engine.collective_rpc(WRITE_METHOD, kwargs=body, timeout=self.rpc_timeout_s))[0]
            bad = worker_failures(workers)
            if bad:
                raise SyncError(f"{url}: cannot receive the adapter: {'; '.join(bad)}")
            await engine.load_lora_adapter(self.name, str(workers[0]["path"]), inplace=True)
            if self.set_version:
                await engine.set_weight_version(engine_label(version))

        await asyncio.gather(*(one(url) for url in urls))


def _not_loaded(worker: Any) -> bool:
    """Whether ``worker`` refused because the adapter has no slot there (by the record's code, never its text)."""
    return isinstance(worker, dict) and not worker.get("ok") and worker.get("code") == ADAPTER_NOT_LOADED


@contextlib.asynccontextmanager
async def open_publisher(sync: NetworkSync, target: PublishTarget) -> AsyncIterator[Publisher]:
    """The ``network`` transport over every engine of ``target`` (no shared memory, no shared filesystem)."""
    yield NetworkAdapterSync(target.trainer, target.engines, target.adapter_name, target.adapter_dir / "network",
                             reset="", b_scale=target.b_scale)
