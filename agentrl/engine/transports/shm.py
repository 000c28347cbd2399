"""The ``shm`` transport's engine half: the worker copies a LoRA adapter's tensors in place into the adapter's
live slot from the publisher's POSIX shared-memory segment (an engine on the publisher's host), and answers the
probe that tells an engine on this host from one on another (:mod:`agentrl.weight_sync.hosts`).

``POST /collective_rpc`` with ``{"method": "agentrl_update_lora", "kwargs": {...}}`` runs
:meth:`ShmEngine.agentrl_update_lora` on every worker; the publisher half is :mod:`agentrl.weight_sync.shm`.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import time
from typing import Any

from agentrl.engine.install import needs_patches
from agentrl.engine.slots import SlotsMixin
from agentrl.weight_sync.base import SHM_UNAVAILABLE
from agentrl.weight_sync.worker_io import attach_segment, failure


class ShmEngine(SlotsMixin):
    """The ``shm`` transport's worker methods (called through ``collective_rpc``, string args)."""

    @needs_patches
    def agentrl_update_lora(self, adapter: str, shm_name: str, meta_json: str, layout_id: str = "",
                            weight_version: str = "", reset_prefix_cache: str = "") -> dict[str, Any]:
        """Copy the tensors described by ``meta_json`` from segment ``shm_name`` into adapter ``adapter``.

        ``adapter`` is the LoRA name (or its int id). ``meta_json``: ``{"nbytes": int, "tensors": [[peft
        name, dtype, shape, byte offset], ...]}``; ``layout_id`` names that layout (plans are cached per
        layout). ``weight_version`` / ``reset_prefix_cache`` ("1", or "running": also preempt running requests)
        are applied in the engine core when it runs in this process (reported back; otherwise the caller does
        them over HTTP). Returns ``{"ok", "engine_ms", "slot", "version_set", "prefix_reset", "reset_ms", ...}``
        or ``{"ok": False, "code", "error"}`` (``code``: one of :mod:`agentrl.weight_sync.base`'s failure codes,
        or ``inference.vllm_version_refused`` when the patches were refused).
        """
        return self._agentrl_apply(time.perf_counter(), adapter, shm_name,
                                   lambda meta: self._agentrl_segment(shm_name, int(meta["nbytes"])),
                                   meta_json, layout_id, weight_version, reset_prefix_cache)

    def agentrl_probe_shm(self, shm_name: str, nonce: str) -> dict[str, Any]:
        """Whether this worker can map the publisher's segment ``shm_name`` and read ``nonce`` from it:
        the test that picks shared memory (same host) or the network for this engine."""
        data = nonce.encode()
        try:
            mm, _ = attach_segment(shm_name, len(data))
        except (OSError, ValueError) as exc:
            return failure(SHM_UNAVAILABLE, f"cannot map shared memory {shm_name!r}: {exc}")
        try:
            return {"ok": bytes(mm[: len(data)]) == data}
        finally:
            mm.close()
