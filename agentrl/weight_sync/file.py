"""The ``file`` transport: the portable baseline. The trainer writes the LoRA adapter to disk and every engine
reloads it in place under the same adapter name (``/v1/load_lora_adapter`` with ``load_inplace``). Its engine
half is vLLM's own runtime LoRA loading (the server runs with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``), with no
agentrl code in the engine.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

from agentrl.config.sync import FileSync
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import AdapterLoader, AdapterSaver, Publisher, PublishTarget


class FileAdapterSync:
    """Publish adapters through files: save (trainer) → load in place (every engine)."""

    def __init__(self, trainer: AdapterSaver, engine: AdapterLoader, adapter_dir: Path, name: str, keep: int = 2,
                 set_version: bool = True) -> None:
        self.trainer = trainer
        self.engine = engine
        self.adapter_dir = Path(adapter_dir)
        self.name = name
        self.keep = keep
        self.set_version = set_version

    async def publish(self, version: int) -> dict[str, float]:
        """Make ``version`` live in every engine; returns the time of each stage in seconds."""
        path = self.adapter_dir / f"v{version:06d}"
        t0 = time.perf_counter()
        info = await self.trainer.save_adapter(path)
        t1 = time.perf_counter()
        await self.engine.load_lora_adapter(self.name, str(path.resolve()), inplace=True)
        if self.set_version:  # label the served weights: later tokens carry this version
            await self.engine.set_weight_version(engine_label(version))
        t2 = time.perf_counter()
        self._prune()
        return {
            "sync_save_s": t1 - t0,
            "sync_load_s": t2 - t1,
            "sync_s": t2 - t0,
            "adapter_bytes": float(info.get("bytes", 0)),
        }

    def _prune(self) -> None:
        versions = sorted(p for p in self.adapter_dir.glob("v*") if p.is_dir())
        for old in versions[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.asynccontextmanager
async def open_publisher(sync: FileSync, target: PublishTarget) -> AsyncIterator[Publisher]:
    """The ``file`` transport over ``target``'s engines (they must read this host's ``adapter_dir``)."""
    yield FileAdapterSync(target.trainer, target.engines, target.adapter_dir, target.adapter_name)
