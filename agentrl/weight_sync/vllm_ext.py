"""vLLM worker extension: replace a loaded LoRA adapter's weights in place, from POSIX shared memory (an
engine on the publisher's host) or from the request body (an engine on another host).

Start vLLM with ``--worker-extension-cls agentrl.inference.lora_ext.LoRAInPlaceExtension`` (the default of
``VLLMServerConfig.worker_extension``) and ``VLLM_SERVER_DEV_MODE=1``; then ``POST /collective_rpc`` with
``{"method": "agentrl_update_lora", "kwargs": {...}}`` runs :meth:`LoRAInPlaceExtension.agentrl_update_lora`
on every worker.

How vLLM 0.32 holds an active adapter (TP=1): every LoRA-wrapped layer owns per-slice stacked buffers
``lora_a_stacked[s]`` of shape ``(max_loras, 1, max_rank, in)`` and ``lora_b_stacked[s]`` of shape
``(max_loras, 1, out, max_rank)``; an adapter in GPU slot ``i`` lives in ``[i, 0, :r, :in]`` /
``[i, 0, :out, :r]`` (no transposes: peft's ``lora_A.weight`` is ``(r, in)``, ``lora_B.weight`` is
``(out, r)``). Packed layers (``qkv_proj``, ``gate_up_proj``) have one slice per sub-projection
(q=0, k=1, v=2). The peft scaling (``alpha/r``, or ``alpha/sqrt(r)`` for rsLoRA, per-module patterns) is
folded into B at load (``LoRALayerWeights.optimize``). The CPU-side ``LoRAModel`` cache keeps the same
(scaled) tensors, from which a slot is refilled after an eviction, so both are updated here.

Every patch of vLLM internals (the LoRA manager hooks, the engine-core lookup) is in
:mod:`agentrl.weight_sync.vllm_patches`, with the vLLM version it was written for.

This module must import without vLLM (the launcher checks it): vLLM is only touched inside a worker.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import tempfile
import time
from typing import Any

from agentrl.errors import WeightSyncError
from agentrl.weight_sync import vllm_patches
from agentrl.weight_sync.base import (
    ADAPTER_NOT_LOADED,
    SHM_UNAVAILABLE,
    UPDATE_REFUSED,
    WRITE_FAILED,
)
from agentrl.weight_sync.vllm_full import FullWeightsMixin
from agentrl.weight_sync.worker_io import attach_segment as _attach
from agentrl.weight_sync.worker_io import failure as _failure
from agentrl.weight_sync.worker_io import failure_of as _failure_of

_REGISTRY: dict[str, tuple[int, str]] = {}
"""lora_name -> (lora_int_id, lora_path) of every adapter this worker loaded (filled by vllm_patches' load hook)."""
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""A file or directory name sent by the publisher: one path segment, no traversal."""
_STATS: dict[str, float] = {"file_loads": 0.0}
"""``file_loads`` count and ``last_file_load_ms``: the worker-side time of the last load from disk."""


if "vllm" in sys.modules:  # inside a vLLM worker (vLLM imports this module): hook before any adapter loads
    try:
        vllm_patches.install_patches(_REGISTRY, _STATS)
    except Exception as exc:  # pragma: no cover - a vLLM layout change; updates by int id still work
        print(f"agentrl.lora_ext: vLLM hooks not installed: {exc!r}", file=sys.stderr)


class UpdateError(WeightSyncError, RuntimeError):
    """The in-place update cannot be applied (adapter not loaded, different shapes): reload from a file.
    The update methods return it as a failure record carrying its ``code`` (:func:`_failure_of`)."""

    code = UPDATE_REFUSED


class AdapterNotLoaded(UpdateError):
    """The adapter has no slot on this worker (never loaded here, or evicted): load it once from a file."""

    code = ADAPTER_NOT_LOADED


class AdapterWriteError(WeightSyncError, ValueError):
    """The adapter files sent to the engine cannot be written: a name that is not one path segment.
    ``agentrl_write_adapter`` returns it as a failure record carrying its ``code``."""

    code = WRITE_FAILED


class _Plan:
    """Precomputed views for one (adapter object, slot, shm layout): the update is a few foreach ops."""

    def __init__(self, lora_model: Any, slot: int | None) -> None:
        self.lora_model = lora_model  # strong ref: `is` check stays valid
        self.slot = slot
        self.src: list[Any] = []     # shm views
        self.live: list[Any] = []    # slot views in the stacked buffers (or the cache when not active)
        self.cache: list[Any] = []   # LoRAModel tensors (only when a slot is live)
        self.scales: dict[float, list[Any]] = {}  # scaling -> live B views
        self.set_lora: list[tuple[Any, Any]] = []  # (layer, layer weights): TP>1 layers re-sliced by vLLM


class LoRAInPlaceExtension(FullWeightsMixin):
    """Mixed into vLLM's worker class; methods are called through ``collective_rpc`` (string args only).
    The full-weight methods (``agentrl_load_weights``...) come from :class:`FullWeightsMixin`."""

    def _agentrl_manager(self) -> Any:
        manager = vllm_patches.lora_adapter_manager(self)
        if manager is None:
            raise UpdateError("LoRA is not enabled on this worker")
        return manager

    def _agentrl_resolve(self, adapter: str) -> tuple[int, str | None]:
        if adapter in _REGISTRY:
            return _REGISTRY[adapter]
        if adapter.isdigit():
            return int(adapter), None
        raise AdapterNotLoaded(f"adapter {adapter!r} was never loaded on this worker (load it once from a file)")

    def agentrl_update_lora(self, adapter: str, shm_name: str, meta_json: str, layout_id: str = "",
                            weight_version: str = "", reset_prefix_cache: str = "") -> dict[str, Any]:
        """Copy the tensors described by ``meta_json`` from segment ``shm_name`` into adapter ``adapter``.

        ``adapter`` is the LoRA name (or its int id). ``meta_json``: ``{"nbytes": int, "tensors": [[peft
        name, dtype, shape, byte offset], ...]}``; ``layout_id`` names that layout (plans are cached per
        layout). ``weight_version`` / ``reset_prefix_cache`` ("1", or "running": also preempt running requests) are applied in the engine core when it
        runs in this process (reported back; otherwise the caller does them over HTTP). Returns
        ``{"ok", "engine_ms", "slot", "version_set", "prefix_reset", "reset_ms", ...}`` or ``{"ok": False, "code",
        "error"}`` (``code``: one of :mod:`agentrl.weight_sync.base`'s failure codes).
        """
        return self._agentrl_apply(time.perf_counter(), adapter, shm_name,
                                   lambda meta: self._agentrl_segment(shm_name, int(meta["nbytes"])),
                                   meta_json, layout_id, weight_version, reset_prefix_cache)

    def agentrl_update_lora_bytes(self, adapter: str, payload_b64: str, meta_json: str, layout_id: str = "",
                                  weight_version: str = "", reset_prefix_cache: str = "") -> dict[str, Any]:
        """As :meth:`agentrl_update_lora`, with the packed tensors in the call itself (base64 of the same
        layout), for an engine that cannot map the publisher's shared memory (another host). The bytes are
        decoded into a buffer of this worker that is reused while the layout stays the same, so the copy
        plan is built once. The result also carries ``decode_ms``."""
        t0 = time.perf_counter()
        try:
            import torch

            nbytes = int(json.loads(meta_json)["nbytes"])
            raw = base64.b64decode(payload_b64, validate=True)
            if len(raw) != nbytes:
                raise UpdateError(f"payload is {len(raw)} bytes, the layout says {nbytes}")
            key = f"net:{layout_id or meta_json}"
            bufs: dict[str, Any] = self.__dict__.setdefault("_agentrl_netbufs", {})
            if key not in bufs:
                bufs.clear()
                self.__dict__["_agentrl_plans"] = {}  # plans hold views into the older buffer
                bufs[key] = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            buf = bufs[key]
            buf[:nbytes].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
        except (UpdateError, ValueError) as exc:
            return _failure_of(exc)
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
            return _failure(WRITE_FAILED, f"cannot write the adapter: {exc}")
        return {"ok": True, "path": root}

    def agentrl_probe_shm(self, shm_name: str, nonce: str) -> dict[str, Any]:
        """Whether this worker can map the publisher's segment ``shm_name`` and read ``nonce`` from it:
        the test that picks shared memory (same host) or the network for this engine."""
        data = nonce.encode()
        try:
            mm, _ = _attach(shm_name, len(data))
        except (OSError, ValueError) as exc:
            return _failure(SHM_UNAVAILABLE, f"cannot map shared memory {shm_name!r}: {exc}")
        try:
            return {"ok": bytes(mm[: len(data)]) == data}
        finally:
            mm.close()

    def _agentrl_apply(self, t0: float, adapter: str, source: str, get_buf: Any, meta_json: str, layout_id: str,
                       weight_version: str, reset_prefix_cache: str) -> dict[str, Any]:
        """Copy from ``source`` (its bytes from ``get_buf(meta)``, asked only when a plan is built) into the
        adapter's live slot and its cached copy; the engine-core ops after."""
        try:
            import torch

            with torch.inference_mode():  # vLLM's LoRA buffers are inference tensors
                plan = self._agentrl_plan(adapter, source, get_buf, meta_json, layout_id)
                t1 = time.perf_counter()
                torch._foreach_copy_(plan.live, plan.src)
                for scale, views in plan.scales.items():
                    torch._foreach_mul_(views, scale)
                t2 = time.perf_counter()
                if plan.cache:
                    torch._foreach_copy_(plan.cache, plan.live)
                for layer, lw in plan.set_lora:
                    layer.set_lora(plan.slot, lw.lora_a, lw.lora_b)
        except UpdateError as exc:
            return _failure_of(exc)
        t3 = time.perf_counter()
        out: dict[str, Any] = {"ok": True, "engine_ms": (t3 - t0) * 1e3, "plan_ms": (t1 - t0) * 1e3,
                               "live_ms": (t2 - t1) * 1e3, "cache_ms": (t3 - t2) * 1e3, "slot": plan.slot,
                               "tensors": len(plan.src), "version_set": False, "prefix_reset": False}
        if weight_version or reset_prefix_cache:
            out.update(self._agentrl_engine_core_ops(weight_version, reset_prefix_cache))
        return out

    def _agentrl_engine_core_ops(self, version: str, reset: str) -> dict[str, Any]:
        """Set the weight version / reset the prefix cache on the engine core when it is in this process
        (in-process executor: a caller of this method, found on the stack; atomic with the copy). Multi-process
        workers (vLLM CPU always, GPU with TP>1) return {} and the caller uses HTTP."""
        t0, core = time.perf_counter(), self._agentrl_core()
        if core is None:
            return {}
        if version:
            core.set_weight_version(version)
        ok = bool(core.reset_prefix_cache(reset_running_requests=reset == "running")) if reset else False
        return {"version_set": bool(version), "prefix_reset": ok, "reset_ms": (time.perf_counter() - t0) * 1e3}

    def _agentrl_core(self) -> Any:
        cached = getattr(self, "_agentrl_core_ref", None)
        if cached is not None:
            return cached or None
        self._agentrl_core_ref: Any = False  # searched once: multi-process workers have none
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
            segs[name] = _attach(name, nbytes)
        except (OSError, ValueError) as exc:
            raise UpdateError(f"cannot map shared memory {name!r}: {exc}") from exc
        return segs[name][1]

    def _agentrl_plan(self, adapter: str, source: str, get_buf: Any, meta_json: str, layout_id: str) -> _Plan:
        manager = self._agentrl_manager()
        lora_id, path = self._agentrl_resolve(adapter)
        lora_model = manager.get_adapter(lora_id)
        if lora_model is None:
            raise AdapterNotLoaded(f"adapter {adapter!r} (id {lora_id}) is not loaded on this worker")
        slot = manager.lora_index_to_id.index(lora_id) if lora_id in manager.lora_index_to_id else None
        plans: dict[tuple, _Plan] = self.__dict__.setdefault("_agentrl_plans", {})
        key = (adapter, source, layout_id or meta_json, slot)
        plan = plans.get(key)
        if plan is not None and plan.lora_model is lora_model:
            return plan
        meta = json.loads(meta_json)
        plan = _build_plan(manager, lora_model, slot, get_buf(meta), meta, path)
        plans.clear()
        plans[key] = plan
        return plan

    def agentrl_lora_stats(self) -> dict[str, float]:
        """Worker-side counters: ``file_loads`` and ``last_file_load_ms`` (for the file-vs-shm benchmark)."""
        return dict(_STATS)

    def agentrl_lora_checksum(self, adapter: str) -> dict[str, Any]:
        """Sums of the adapter's cached (CPU) and live (slot) weights, for tests: they must agree."""
        manager = self._agentrl_manager()
        lora_id, _ = self._agentrl_resolve(adapter)
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


def _build_plan(manager: Any, lora_model: Any, slot: int | None, buf: Any, meta: dict[str, Any],
                path: str | None) -> _Plan:
    """Map every peft tensor name onto (layer, slice, A/B) and build the copy lists."""
    import torch
    from vllm.lora.utils import parse_fine_tuned_lora_name

    mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
    mapper = mapper.get_rename_mapper() if mapper is not None else None
    sub_to_packed = {sub: (packed, i) for packed, subs in manager.packed_modules.items()
                     for i, sub in enumerate(subs)}
    helper = None
    if path is not None:
        from vllm.lora.peft_helper import PEFTHelper

        helper = PEFTHelper.from_local_dir(path, None)
    plan = _Plan(lora_model, slot)
    set_lora: dict[str, tuple[Any, Any]] = {}
    for name, dtype, shape, offset in meta["tensors"]:
        module, is_a = parse_fine_tuned_lora_name(name, mapper)
        target, s = sub_to_packed.get(module, (module, None))
        layer, lw = manager.modules.get(target), lora_model.loras.get(target)
        if layer is None or lw is None:
            raise UpdateError(f"{name}: module {target} has no LoRA in the loaded adapter")
        cached = (lw.lora_a if is_a else lw.lora_b)
        cached = cached[s] if s is not None else cached
        if cached is None or list(cached.shape) != list(shape):
            got = None if cached is None else list(cached.shape)
            raise UpdateError(f"{name}: shape {list(shape)} differs from the loaded adapter's {got}")
        tdtype = getattr(torch, dtype)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=tdtype).element_size()
        src = buf[offset:offset + nbytes].view(tdtype).view(shape)
        live = cached
        if slot is not None and getattr(layer, "tp_size", 1) == 1:
            stacked = (layer.lora_a_stacked if is_a else layer.lora_b_stacked)[s or 0]
            live = stacked[slot, 0, : shape[0], : shape[1]]
        elif slot is not None:
            set_lora[target] = (layer, lw)  # sharded layer: copy into the cache, vLLM slices it into the slot
        plan.src.append(src)
        plan.live.append(live)
        if live is not cached:
            plan.cache.append(cached)
        if is_a:
            continue
        if helper is not None:
            scale = helper.get_rank_and_scaling(parse_fine_tuned_lora_name(name)[0])[1]
        elif "scaling" in meta:
            scale = float(meta["scaling"])
        else:
            raise UpdateError("adapter path unknown on this worker: pass meta['scaling']")
        if scale != 1.0:
            plan.scales.setdefault(scale, []).append(live)
    if plan.cache and len(plan.cache) != len(plan.live):
        raise UpdateError("mixed sharded/unsharded layers are not supported")
    plan.set_lora = list(set_lora.values())
    return plan
