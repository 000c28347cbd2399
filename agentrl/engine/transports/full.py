"""The ``full`` transport's engine half (its publisher half is :mod:`agentrl.weight_sync.full`): load one bucket of the trainer's weights into the
running model, in place, with vLLM's own ``model.load_weights`` (which knows the model's packed and sharded
layouts: q/k/v into ``qkv_proj``, tensor-parallel slices...).

The bucket comes from the publisher's POSIX shared memory (an engine on the publisher's host: the trainer wrote
it there) or in the call itself (an engine on another host). The publisher pauses the engine (``keep``) before
the first bucket and labels the new version, resets the prefix cache and resumes it after the last, so no
request is ever scheduled on a mix of two versions' weights.

Mixed into :class:`agentrl.engine.extension.WorkerExtension`; every vLLM internal it touches goes through
:mod:`agentrl.engine.vllm_patches` (lookups 6 and patch 8). This module must import without vLLM and torch:
vLLM is only touched inside a worker.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentrl.core.errors import WeightSyncError
from agentrl.engine import vllm_patches
from agentrl.engine.install import needs_patches
from agentrl.weight_sync.base import BAD_REQUEST, LOAD_FAILED, SHM_UNAVAILABLE
from agentrl.weight_sync.buckets import DTYPE_BYTES, Layout
from agentrl.weight_sync.worker_io import attach_segment, failure, failure_of


class LoadError(WeightSyncError, RuntimeError):
    """A bucket cannot be loaded (unknown parameter names, shapes the model does not have)."""

    code = LOAD_FAILED


def _views(buf: Any, layout: Layout, *, own: bool = False) -> Iterator[tuple[str, Any]]:
    """(name, typed view) of each tensor of ``layout`` in the uint8 tensor ``buf``; ``own``: a copy instead.

    vLLM's layerwise reload keeps the tensors of a layer that is not complete yet (one split over two
    buckets, an embedding padded past the checkpoint's rows) until it is, or until the load finishes: views
    into a shared-memory slot that the publisher reuses two buckets later would be overwritten by then."""
    import torch

    for name, dtype, shape, offset in layout:
        if dtype not in DTYPE_BYTES:
            raise LoadError(f"{name}: dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        n = 1
        for d in shape:
            n *= int(d)
        view = buf[offset:offset + n * DTYPE_BYTES[dtype]].view(getattr(torch, dtype)).view(shape)
        yield name, view.clone() if own else view


class FullEngine:
    """The ``full`` transport's worker methods (called through ``collective_rpc``): loading full weights."""

    def _agentrl_load(self, t0: float, weights: Iterator[tuple[str, Any]]) -> dict[str, Any]:
        """Load ``weights`` inside a load begun by :meth:`agentrl_begin_weights`."""
        import torch

        if not self.__dict__.get("_agentrl_loading"):
            return failure(LOAD_FAILED, "no weight load in progress: call agentrl_begin_weights first")
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for item in weights:
                count += 1
                yield item

        from agentrl.moe.checkpoint import to_checkpoint

        model_type = str(getattr(vllm_patches.model_config(self).hf_text_config, "model_type", ""))
        try:
            with torch.inference_mode():  # fused MoE experts (transformers' layout) split to checkpoint names
                vllm_patches.load_weight_bucket(self, to_checkpoint(counted(), model_type))
        except LoadError as exc:  # raised by the bucket's views as vLLM reads them
            return failure_of(exc)
        except (KeyError, ValueError, RuntimeError, AssertionError) as exc:
            return failure(LOAD_FAILED, f"load_weights failed after {count} tensors: "
                                           f"{type(exc).__name__}: {exc}")
        return {"ok": True, "tensors": count, "engine_ms": (time.perf_counter() - t0) * 1e3}

    @needs_patches
    def agentrl_begin_weights(self) -> dict[str, Any]:
        """Start a full-weight load: every layer takes checkpoint-format weights until
        :meth:`agentrl_finish_weights` (the engine must be paused meanwhile)."""
        t0 = time.perf_counter()
        try:
            vllm_patches.begin_weight_load(self)
        except (RuntimeError, ValueError, AttributeError) as exc:
            return failure(LOAD_FAILED, f"cannot start a weight load: {type(exc).__name__}: {exc}")
        self.__dict__["_agentrl_loading"] = True
        return {"ok": True, "engine_ms": (time.perf_counter() - t0) * 1e3}

    @needs_patches
    def agentrl_finish_weights(self) -> dict[str, Any]:
        """Finish the load begun by :meth:`agentrl_begin_weights`: process the layers still pending."""
        t0 = time.perf_counter()
        if not self.__dict__.pop("_agentrl_loading", False):
            return failure(LOAD_FAILED, "no weight load in progress")
        try:
            import torch

            with torch.inference_mode():
                vllm_patches.finish_weight_load(self)
        except (RuntimeError, ValueError, AttributeError, AssertionError) as exc:
            return failure(LOAD_FAILED, f"cannot finish the weight load: {type(exc).__name__}: {exc}")
        return {"ok": True, "engine_ms": (time.perf_counter() - t0) * 1e3}

    def agentrl_weight_dtype(self) -> dict[str, Any]:
        """The dtype the model's weights are served in (the publisher casts to it before sending)."""
        p = next(vllm_patches.served_model(self).parameters())
        return {"ok": True, "dtype": str(p.dtype).removeprefix("torch.")}

    @needs_patches
    def agentrl_load_weights(self, shm_name: str, segment_bytes: str, offset: str, meta_json: str) -> dict[str, Any]:
        """Load the bucket described by ``meta_json`` (``{"tensors": layout}``) from ``offset`` in the
        publisher's segment ``shm_name`` of ``segment_bytes`` bytes (mapped once, kept while it is the same).
        Returns ``{"ok", "tensors", "engine_ms"}`` or a failure record."""
        t0 = time.perf_counter()
        try:
            layout = json.loads(meta_json)["tensors"]
            size, base = int(segment_bytes), int(offset)
        except (ValueError, KeyError, TypeError) as exc:
            return failure(BAD_REQUEST, f"bad bucket description: {exc}")
        segs: dict[str, tuple[Any, Any]] = self.__dict__.setdefault("_agentrl_full_segs", {})
        if shm_name not in segs or segs[shm_name][1].numel() < size:
            segs.clear()
            try:
                segs[shm_name] = attach_segment(shm_name, size)
            except (OSError, ValueError) as exc:
                return failure(SHM_UNAVAILABLE, f"cannot map shared memory {shm_name!r}: {exc}")
        buf = segs[shm_name][1][base:]
        return self._agentrl_load(t0, _views(buf, layout, own=True))

    @needs_patches
    def agentrl_load_weights_bytes(self, payload_b64: str, meta_json: str) -> dict[str, Any]:
        """As :meth:`agentrl_load_weights`, with the bucket's bytes in the call (base64 of the same layout),
        for an engine that cannot map the publisher's shared memory. The result also carries ``decode_ms``."""
        t0 = time.perf_counter()
        try:
            import torch

            layout = json.loads(meta_json)["tensors"]
            raw = bytearray(base64.b64decode(payload_b64, validate=True))
            buf = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        except (ValueError, KeyError, TypeError) as exc:
            return failure(BAD_REQUEST, f"bad bucket payload: {exc}")
        decode_ms = (time.perf_counter() - t0) * 1e3
        out = self._agentrl_load(t0, _views(buf, layout))
        out["decode_ms"] = decode_ms
        return out

    @needs_patches
    def agentrl_load_weights_from_path(self, path: str) -> dict[str, Any]:
        """Load every ``*.safetensors`` file of the Hugging Face directory ``path`` into the running model (a
        model's original weights back into an engine that served other ones, e.g. after tests)."""
        t0 = time.perf_counter()
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            return failure(BAD_REQUEST, f"no safetensors files in {path!r}")

        def weights() -> Iterator[tuple[str, Any]]:
            from safetensors.torch import safe_open

            for f in files:
                with safe_open(str(f), framework="pt") as fh:
                    for name in fh.keys():
                        yield name, fh.get_tensor(name)

        return self._agentrl_load_whole(t0, weights())

    def _agentrl_load_whole(self, t0: float, weights: Iterator[tuple[str, Any]]) -> dict[str, Any]:
        """One complete load of ``weights`` (begin, load, finish; the finish runs even after a failed load):
        the failure record of the first step that failed, else ``{"ok", "tensors", "engine_ms"}`` (since
        ``t0``)."""
        begun = self.agentrl_begin_weights()
        if not begun["ok"]:
            return begun
        out = self._agentrl_load(t0, weights)
        done = self.agentrl_finish_weights()
        return out if not out["ok"] else {**done, "tensors": out["tensors"],
                                          "engine_ms": (time.perf_counter() - t0) * 1e3}
