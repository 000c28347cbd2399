"""The worker-extension methods that replace a loaded LoRA adapter's weights in place, from POSIX shared
memory (an engine on the publisher's host) or from the request body (an engine on another host), and that
write an adapter's files for an engine that cannot read the publisher's.

``POST /collective_rpc`` with ``{"method": "agentrl_update_lora", "kwargs": {...}}`` runs
:meth:`AdapterMixin.agentrl_update_lora` on every worker. The copy itself is planned by
:mod:`agentrl.engine.adapter_plan`; every vLLM internal it reads goes through :mod:`agentrl.engine.vllm_patches`.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import base64
import json
import os
import re
import tempfile
import time
from collections.abc import Callable
from typing import Any

from agentrl.core.errors import WeightSyncError
from agentrl.engine import vllm_patches
from agentrl.engine.adapter_plan import (
    AdapterNotLoaded,
    CopyPlan,
    UpdateError,
    build_plan,
    cache_after_update,
    decode_payload,
    release_slot,
)
from agentrl.engine.install import REGISTRY, STATS, needs_patches
from agentrl.weight_sync.base import SHM_UNAVAILABLE, WRITE_FAILED
from agentrl.weight_sync.worker_io import attach_segment, failure, failure_of

_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A file or directory name sent by the publisher: one path segment, no traversal."""


def label_and_reset(core: Any, version: str, reset: str) -> dict[str, Any]:
    """On the in-process engine core ``core``: label the served weights ``version`` (if given) and reset the
    prefix cache (``reset``: "1", or "running": also preempt running requests; "": no reset). Reports
    ``version_set``, ``prefix_reset`` (vLLM's success flag) and ``reset_ms``."""
    t0 = time.perf_counter()
    if version:
        core.set_weight_version(version)
    ok = bool(core.reset_prefix_cache(reset_running_requests=reset == "running")) if reset else False
    return {"version_set": bool(version), "prefix_reset": ok, "reset_ms": (time.perf_counter() - t0) * 1e3}


class AdapterWriteError(WeightSyncError, ValueError):
    """The adapter files sent to the engine cannot be written: a name that is not one path segment.
    ``agentrl_write_adapter`` returns it as a failure record carrying its ``code``."""

    code = WRITE_FAILED


class AdapterMixin:
    """The in-place adapter methods of the worker extension (called through ``collective_rpc``, string args)."""

    def _agentrl_manager(self) -> Any:
        manager = vllm_patches.lora_adapter_manager(self)
        if manager is None:
            raise UpdateError("LoRA is not enabled on this worker")
        return manager

    def _agentrl_resolve(self, adapter: str) -> tuple[int, str | None]:
        if adapter in REGISTRY:
            return REGISTRY[adapter]
        if adapter.isdigit():
            return int(adapter), None
        raise AdapterNotLoaded(f"adapter {adapter!r} was never loaded on this worker (load it once from a file)")

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

    @needs_patches
    def agentrl_update_lora_bytes(self, adapter: str, payload_b64: str, meta_json: str, layout_id: str = "",
                                  weight_version: str = "", reset_prefix_cache: str = "") -> dict[str, Any]:
        """As :meth:`agentrl_update_lora`, with the packed tensors in the call itself (base64 of the same
        layout), for an engine that cannot map the publisher's shared memory (another host). The bytes are
        decoded into a buffer of this worker that is reused while the layout stays the same, so the copy
        plan is built once. The result also carries ``decode_ms``."""
        t0 = time.perf_counter()
        try:
            key = f"net:{layout_id or meta_json}"
            buf, new = decode_payload(self.__dict__.setdefault("_agentrl_netbufs", {}), key, payload_b64,
                                      int(json.loads(meta_json)["nbytes"]))
            if new:
                self.__dict__["_agentrl_plans"] = {}  # plans hold views into the older buffer
        except (UpdateError, ValueError) as exc:
            return failure_of(exc)
        decode_ms = (time.perf_counter() - t0) * 1e3
        out = self._agentrl_apply(time.perf_counter(), adapter, key, lambda meta: buf, meta_json, layout_id,
                                  weight_version, reset_prefix_cache)
        out["decode_ms"] = decode_ms
        return out

    def agentrl_write_adapter(self, dir_name: str, files_json: str) -> dict[str, Any]:
        """Write an adapter directory sent in the call (``{file name: base64}``) under this host's temporary
        directory and return its path, for ``load_lora_adapter`` on an engine that cannot read the
        publisher's files. ``dir_name`` and the file names are single path segments."""
        try:
            files = json.loads(files_json)
            names = [dir_name, *files]
            if not all(isinstance(n, str) and _SEGMENT.match(n) for n in names):
                raise AdapterWriteError(f"names must be single path segments: {names}")
            root = os.path.join(tempfile.gettempdir(), "agentrl-adapters", dir_name)
            os.makedirs(root, exist_ok=True)
            for name, data in files.items():
                tmp = os.path.join(root, f".{name}.{os.getpid()}.tmp")
                with open(tmp, "wb") as f:
                    f.write(base64.b64decode(data, validate=True))
                os.replace(tmp, os.path.join(root, name))  # workers of one host may write the same files
        except (ValueError, OSError) as exc:
            return failure(WRITE_FAILED, f"cannot write the adapter: {exc}")
        return {"ok": True, "path": root}

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

    def _agentrl_apply(self, t0: float, adapter: str, source: str, get_buf: Callable[[dict[str, Any]], Any],
                       meta_json: str, layout_id: str, weight_version: str, reset_prefix_cache: str) -> dict[str, Any]:
        """Copy from ``source`` (its bytes from ``get_buf(meta)``, asked only when a plan is built) into the
        adapter's live slot and its cached copy; the engine-core ops after."""
        try:
            import torch

            with torch.inference_mode():  # vLLM's LoRA buffers are inference tensors
                plan = self._agentrl_plan(adapter, source, get_buf, meta_json, layout_id)
                t1 = time.perf_counter()
                copies = plan.copy()
                for scale, views in plan.scales.items():
                    torch._foreach_mul_(views, scale)
                t2 = time.perf_counter()
                cache_after_update(plan)  # the CPU copy follows when the slot is released
                for layer, lw in plan.set_lora:
                    layer.set_lora(plan.slot, lw.lora_a, lw.lora_b)
        except UpdateError as exc:
            return failure_of(exc)
        t3 = time.perf_counter()
        out: dict[str, Any] = {"ok": True, "engine_ms": (t3 - t0) * 1e3, "plan_ms": (t1 - t0) * 1e3,
                               "live_ms": (t2 - t1) * 1e3, "cache_ms": (t3 - t2) * 1e3, "slot": plan.slot,
                               "tensors": len(plan.src), "copies": copies, "version_set": False,
                               "prefix_reset": False}
        if weight_version or reset_prefix_cache:
            out.update(self._agentrl_engine_core_ops(weight_version, reset_prefix_cache))
        return out

    def _agentrl_engine_core_ops(self, version: str, reset: str) -> dict[str, Any]:
        """Set the weight version / reset the prefix cache on the engine core when it is in this process
        (in-process executor: a caller of this method, found on the stack; atomic with the copy). Workers in
        processes of their own (tensor parallelism, or the ``mp`` backend) return {} and the caller uses HTTP."""
        core = self._agentrl_core()
        return {} if core is None else label_and_reset(core, version, reset)

    def _agentrl_core(self) -> Any:
        cached = getattr(self, "_agentrl_core_ref", None)
        if cached is not None:
            return cached or None
        self._agentrl_core_ref: Any = False  # searched once: workers in processes of their own have none
        core = vllm_patches.find_engine_core()
        if core is not None:
            self._agentrl_core_ref = core
        return core

    def _agentrl_segment(self, name: str, nbytes: int) -> Any:
        segs: dict[str, tuple[Any, Any]] = self.__dict__.setdefault("_agentrl_segs", {})
        if name in segs and segs[name][1].numel() >= nbytes:
            return segs[name][1]
        self.__dict__["_agentrl_plans"] = {}  # plans hold views into older segments
        segs.clear()  # older mappings are unmapped once their last view is gone
        try:
            segs[name] = attach_segment(name, nbytes)
        except (OSError, ValueError) as exc:
            raise UpdateError(f"cannot map shared memory {name!r}: {exc}") from exc
        return segs[name][1]

    def _agentrl_plan(self, adapter: str, source: str, get_buf: Callable[[dict[str, Any]], Any], meta_json: str,
                      layout_id: str) -> CopyPlan:
        manager = self._agentrl_manager()
        lora_id, path = self._agentrl_resolve(adapter)
        lora_model = manager.get_adapter(lora_id)
        if lora_model is None:
            raise AdapterNotLoaded(f"adapter {adapter!r} (id {lora_id}) is not loaded on this worker")
        slot = manager.lora_index_to_id.index(lora_id) if lora_id in manager.lora_index_to_id else None
        plans: dict[tuple, CopyPlan] = self.__dict__.setdefault("_agentrl_plans", {})
        key = (adapter, source, layout_id or meta_json, slot)
        plan = plans.get(key)
        if plan is not None and plan.lora_model is lora_model:
            return plan
        meta = json.loads(meta_json)
        plan = build_plan(manager, lora_model, slot, get_buf(meta), meta, path)
        plans.clear()
        plans[key] = plan
        return plan

    def agentrl_lora_stats(self) -> dict[str, float]:
        """Worker-side counters: ``file_loads`` and ``last_file_load_ms`` (for the file-vs-shm benchmark)."""
        return dict(STATS)

    def agentrl_lora_checksum(self, adapter: str) -> dict[str, Any]:
        """Sums of the adapter's cached (CPU) and live (slot) weights, for tests: they must agree once the cache is
        brought up to date (as vLLM's release of the slot would)."""
        manager = self._agentrl_manager()
        lora_id, _ = self._agentrl_resolve(adapter)
        release_slot(manager, lora_id)
        slot = manager.lora_index_to_id.index(lora_id) if lora_id in manager.lora_index_to_id else None
        cached = live = 0.0
        for name, lw in manager.get_adapter(lora_id).loras.items():
            a_list, b_list = (lw.lora_a, lw.lora_b) if isinstance(lw.lora_a, list) else ([lw.lora_a], [lw.lora_b])
            for s, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
                if a is None:
                    continue
                cached += float(a.double().abs().sum() + b.double().abs().sum())
                if slot is not None:
                    layer = manager.modules[name]
                    live += float(sum(t[s][slot].double().abs().sum()
                                      for t in (layer.lora_a_stacked, layer.lora_b_stacked)))
        return {"ok": True, "cached": cached, "live": live, "slot": slot}
