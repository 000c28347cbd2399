"""What replacing a loaded LoRA adapter's weights in place takes in the worker, whichever transport brought
them (shared memory: :mod:`agentrl.engine.transports.shm`; the call body:
:mod:`agentrl.engine.transports.network`): the adapter's slot, the copy into it (planned by
:mod:`agentrl.engine.adapter_plan`), the label and the prefix-cache reset after it, and the worker's mappings of
the publisher's segments. Every vLLM internal it reads goes through :mod:`agentrl.engine.vllm_patches`.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from agentrl.engine import adapter_labels, vllm_patches
from agentrl.engine.adapter_plan import (
    AdapterNotLoaded,
    CopyPlan,
    UpdateError,
    build_plan,
    cache_after_update,
    release_slot,
)
from agentrl.engine.install import REGISTRY, STATS
from agentrl.engine.slot_layout import slices
from agentrl.weight_sync.worker_io import attach_segment, failure_of


def label_and_reset(core: Any, version: str, reset: str, adapter: str = "") -> dict[str, Any]:
    """On the in-process engine core ``core``: label the served weights ``version`` (if given) and reset the
    prefix cache (``reset``: "1", or "running": also preempt running requests; "": no reset). Reports
    ``version_set``, ``prefix_reset`` (vLLM's success flag) and ``reset_ms``.

    ``adapter``: the LoRA adapter (name or int id) whose weights were just replaced in place; where the API
    server reads per-adapter labels (:mod:`agentrl.engine.adapter_labels`) the label is that adapter's alone,
    else (and without ``adapter``, or for an id of no known name) it is the engine-wide one."""
    t0 = time.perf_counter()
    name = adapter_labels.adapter_name(adapter, REGISTRY) if version and adapter_labels.enabled() else ""
    if name:
        adapter_labels.set_label(core, name, version)
    elif version:
        core.set_weight_version(version)
    ok = bool(core.reset_prefix_cache(reset_running_requests=reset == "running")) if reset else False
    return {"version_set": bool(version), "prefix_reset": ok, "reset_ms": (time.perf_counter() - t0) * 1e3}


class SlotsMixin:
    """What the in-place adapter transports share in the worker (:mod:`agentrl.engine.transports.shm`,
    :mod:`~agentrl.engine.transports.network`): the adapter's slot, its cached copy plan, the copy and the
    engine-core ops after it, and the mapping of the publisher's segments."""

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
            out.update(self._agentrl_engine_core_ops(weight_version, reset_prefix_cache, adapter))
        return out

    def _agentrl_engine_core_ops(self, version: str, reset: str, adapter: str = "") -> dict[str, Any]:
        """Set the weight version (``adapter``'s own, where labels are kept per adapter) / reset the prefix
        cache on the engine core when it is in this process (in-process executor: a caller of this method,
        found on the stack; atomic with the copy). Workers in processes of their own (tensor parallelism, or
        the ``mp`` backend) return {} and the caller uses HTTP (the engine-wide label)."""
        core = self._agentrl_core()
        return {} if core is None else label_and_reset(core, version, reset, adapter)

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
        """Worker-side counters: ``file_loads`` and ``last_file_load_ms`` (for the file-vs-shm benchmark), the
        CPU fast path's (``cpu_lora_fast``, ``cpu_lora_native``) and ``cpu_lora_compiled_calls``: LoRA layers
        run as the compiled model's op (:func:`agentrl.engine.cpu_lora.compiled_linear_op`)."""
        from agentrl.engine import cpu_lora

        return {**STATS, "cpu_lora_compiled_calls": float(cpu_lora.CALLS["compiled"])}

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
                                      for t in (slices(layer, True), slices(layer, False))))
        return {"ok": True, "cached": cached, "live": live, "slot": slot}
