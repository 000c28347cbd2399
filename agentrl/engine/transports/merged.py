"""The ``merged`` transport's engine half: the worker merges a LoRA adapter into the served base weights, from
the publisher's shared-memory segment (the in-place copy's packed layout) or from the call body, planned by
:mod:`agentrl.engine.merge` and loaded with vLLM's own weight loading (:class:`~agentrl.engine.transports.full.
FullEngine`). The publisher half is :mod:`agentrl.weight_sync.merged`: it pauses the engine (``keep``) around the
call, or sends it over the engine core's control socket to run between two steps.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import json
import time
from typing import Any

from agentrl.engine import vllm_patches
from agentrl.engine.adapter_plan import UpdateError, decode_payload
from agentrl.engine.install import needs_patches
from agentrl.engine.merge import Checkpoint, MergePlan, build_merge_plan
from agentrl.engine.slots import SlotsMixin
from agentrl.engine.transports.full import FullEngine
from agentrl.weight_sync.worker_io import failure, failure_of


class MergedEngine(SlotsMixin, FullEngine):
    """The ``merged`` transport's worker methods (called through ``collective_rpc``, string args)."""

    @needs_patches
    def agentrl_merge_lora(self, shm_name: str, meta_json: str, layout_id: str = "") -> dict[str, Any]:
        """Merge the adapter described by ``meta_json`` (the in-place copy's layout, plus ``peft_config``: the
        adapter's ``adapter_config.json``, for each module's scaling) from segment ``shm_name`` into the served
        weights. The engine must be paused (``keep``). Returns ``{"ok", "engine_ms", "plan_ms", "tensors",
        "merged", "whole"}`` or a failure record. Tensors the adapter carries whole (trained norms, under their
        peft names without ``lora_``) replace the served ones."""
        t0 = time.perf_counter()
        try:
            meta = json.loads(meta_json)
            buf = self._agentrl_segment(shm_name, int(meta["nbytes"]))
        except UpdateError as exc:
            return failure_of(exc)
        except (ValueError, KeyError, TypeError) as exc:
            return failure(UpdateError.code, f"bad adapter description: {exc}")
        return self._agentrl_merge(t0, f"shm:{shm_name}:{layout_id or meta_json}", meta, buf)

    @needs_patches
    def agentrl_merge_lora_bytes(self, payload_b64: str, meta_json: str, layout_id: str = "") -> dict[str, Any]:
        """As :meth:`agentrl_merge_lora`, with the packed tensors in the call (base64 of the same layout), for
        an engine that cannot map the publisher's shared memory. The result also carries ``decode_ms``."""
        t0 = time.perf_counter()
        try:
            meta = json.loads(meta_json)
            key = f"net:{layout_id or meta_json}"
            buf, _ = decode_payload(self.__dict__.setdefault("_agentrl_merge_bufs", {}), key, payload_b64,
                                    int(meta["nbytes"]))
        except UpdateError as exc:
            return failure_of(exc)
        except (ValueError, KeyError, TypeError) as exc:
            return failure(UpdateError.code, f"bad adapter payload: {exc}")
        decode_ms = (time.perf_counter() - t0) * 1e3
        out = self._agentrl_merge(t0, key, meta, buf)
        out["decode_ms"] = decode_ms
        return out

    def _agentrl_merge(self, t0: float, key: str, meta: dict[str, Any], buf: Any) -> dict[str, Any]:
        try:
            plan = self._agentrl_merge_plan(key, meta, buf)
        except UpdateError as exc:
            return failure_of(exc)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            return failure(UpdateError.code, f"cannot plan the merge: {type(exc).__name__}: {exc}")
        t1 = time.perf_counter()
        out = self._agentrl_load_whole(t1, plan.merged())
        if not out["ok"]:
            return out
        return {**out, "engine_ms": (time.perf_counter() - t0) * 1e3, "plan_ms": (t1 - t0) * 1e3,
                "merged": len(plan.terms), "whole": len(plan.whole)}

    def _agentrl_merge_plan(self, key: str, meta: dict[str, Any], buf: Any) -> MergePlan:
        plans: dict[str, MergePlan] = self.__dict__.setdefault("_agentrl_merge_plans", {})
        if key in plans:
            return plans[key]
        model = vllm_patches.served_model(self)
        state: dict[str, Any] = self.__dict__.setdefault("_agentrl_merge_state", {})
        if "checkpoint" not in state:
            state["checkpoint"] = Checkpoint(str(vllm_patches.model_config(self).model))
            state["kept"] = {}
        if not isinstance(meta.get("peft_config"), dict):
            raise UpdateError("the adapter description has no peft_config (its adapter_config.json): the scalings")
        # vLLM's reading of the config refuses modules_to_save other than a classifier's; here they are the
        # tensors the adapter carries whole, and the scalings do not depend on them
        peft = vllm_patches.peft_helper_from_dict({k: v for k, v in meta["peft_config"].items()
                                                   if k != "modules_to_save"})
        plan = build_merge_plan(meta, buf, vllm_patches.packed_modules(model), state["checkpoint"], state["kept"],
                                next(model.parameters()).dtype, lambda m: peft.get_rank_and_scaling(m)[1])
        plans.clear()  # plans hold views into the older buffer
        plans[key] = plan
        return plan
