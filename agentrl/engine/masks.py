"""Engine-side capture of sampling masks, per request (the worker extension's ``agentrl_masks_*`` methods).

vLLM 0.32 returns a sampled position's mask natively only on its GPU model runner (``return_sampling_mask``);
the CPU build has none. This capture records the same thing from any runner: the sampler's ``sample`` is
wrapped on the runner's instance (:func:`agentrl.engine.vllm_patches.wrap_sampler`), and what it returns
beside the sampled ids, the processed logprobs of every row (``--logprobs-mode processed_logprobs``: after
temperature, min-p, top-k and top-p, in vLLM's order, ``-inf`` outside the kept set), gives each row's kept
set. Each request keeps one encoded row (:func:`agentrl.core.masks.encode_row`) per sampled token, in order:

* a sample vLLM discards (a prefill split between engine steps) is skipped, as vLLM skips it;
* a request preempted by a weight update and recomputed samples its next token once its recompute is done,
  so its masks stay one per output token;
* a row where nothing was cut is stored as count 0 (no bytes).

``agentrl_masks_take(request_id)`` hands a finished request's masks to its client and forgets them; masks
nobody takes are dropped :data:`UNCLAIMED_TTL_S` after their request last sampled. The capture costs one pass
over the step's ``rows x vocabulary`` processed logprobs (which vLLM computed anyway) and runs only once
enabled: a run without truncation never enables it.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.core.errors import EngineError
from agentrl.core.masks import encode_row
from agentrl.engine import vllm_patches
from agentrl.engine.capture import pop_request
from agentrl.engine.install import needs_patches

UNCLAIMED_TTL_S = 900.0
"""Seconds a request's masks are kept after its last sample for its client to take (longer than a request's
timeout, so a request preempted and waiting keeps what it sampled)."""
MASKS_UNAVAILABLE = "masks.unavailable"
"""The engine cannot capture sampling masks (capture not enabled, or logprobs that are not processed)."""
MASKS_MISSING = "masks.missing"
"""No masks are held for the request (never seen by this worker, already taken, or expired)."""


class MaskCaptureRefused(EngineError, ValueError):
    """The engine cannot capture sampling masks: its sampler does not compute the processed logprobs."""

    code = "inference.mask_capture_refused"


@dataclass
class _Held:
    counts: list[int] = field(default_factory=list)
    data: bytearray = field(default_factory=bytearray)
    touched: float = 0.0


class MaskCapture:
    """Per-request sampling-mask capture inside one vLLM worker (see the module docstring)."""

    def __init__(self) -> None:
        self.held: dict[str, _Held] = {}
        self.vocab = 0
        self.rows_seen = 0
        self.rows_cut = 0
        self.active = True
        """Off: the wrap stays and records nothing (``bench logprobs`` measures the capture's cost this way)."""
        self._steps = 0

    def on_sample(self, runner: Any, processed_logprobs: Any) -> None:
        """After the sampler ran: record each kept row's set (``processed_logprobs``: ``[rows, vocab]``)."""
        if processed_logprobs is None or not self.active:
            return
        import torch

        req_ids, discarded = vllm_patches.sampled_rows(runner)
        finite = torch.isfinite(processed_logprobs[: len(req_ids)]).to("cpu")
        self.vocab = int(finite.shape[1])
        cut = (finite.sum(dim=1) < self.vocab).tolist()
        now = time.monotonic()
        for i, req_id in enumerate(req_ids):
            if req_id is None or discarded[i]:
                continue
            h = self.held.get(req_id)
            if h is None:
                h = self.held[req_id] = _Held()
            count, data = encode_row(finite[i].numpy(), self.vocab) if cut[i] else (0, b"")
            h.counts.append(count)
            h.data += data
            h.touched = now
            self.rows_seen += 1
            self.rows_cut += bool(count)
        self._steps += 1
        if self._steps % 256 == 0:
            for k in [k for k, h in self.held.items() if now - h.touched > UNCLAIMED_TTL_S]:
                del self.held[k]

    def take(self, request_id: str) -> _Held | None:
        """The masks of the request whose id contains ``request_id`` (and forget them); None when none is
        held."""
        return pop_request(self.held, request_id)

    @classmethod
    def install(cls, runner: Any) -> MaskCapture:
        """Start capturing on ``runner`` (a ``ValueError`` when its logprobs are not the processed ones)."""
        mode = vllm_patches.logprobs_mode(runner)
        if mode != "processed_logprobs":
            raise MaskCaptureRefused(f"the engine reports {mode}, not processed_logprobs: its sampler does not see the "
                             "truncated distribution (start it with --logprobs-mode processed_logprobs)")
        cap = cls()
        vllm_patches.wrap_sampler(runner, lambda processed: cap.on_sample(runner, processed))
        return cap


class SamplingMaskMixin:
    """Mixed into vLLM's worker class with the weight-sync methods (called through ``collective_rpc``; a
    record, not an exception, answers every call)."""

    @needs_patches
    def agentrl_masks_enable(self, active: str = "1") -> dict[str, Any]:
        """Start capturing sampling masks (installed once; ``active = "0"`` pauses the recording): ``{"ok",
        "new", "rows_seen", "rows_cut"}``, or ``{"ok": False, "code", "error"}``."""
        cap = self.__dict__.get("_agentrl_masks")
        new = cap is None
        if cap is None:
            try:
                cap = MaskCapture.install(self.model_runner)
            except (MaskCaptureRefused, AttributeError, ImportError) as exc:
                return {"ok": False, "code": MASKS_UNAVAILABLE, "error": f"{type(exc).__name__}: {exc}"}
            self.__dict__["_agentrl_masks"] = cap
        cap.active = active != "0"
        return {"ok": True, "new": new, "rows_seen": cap.rows_seen, "rows_cut": cap.rows_cut}

    @needs_patches
    def agentrl_masks_take(self, request_id: str) -> dict[str, Any]:
        """The masks of request ``request_id``, one per sampled token, and forget them: ``{"ok", "vocab",
        "counts", "data"}`` (``data``: base64 of the encoded rows, :class:`agentrl.core.masks.SamplingMask`)."""
        cap = self.__dict__.get("_agentrl_masks")
        if cap is None:
            return {"ok": False, "code": MASKS_UNAVAILABLE, "error": "sampling-mask capture is not enabled"}
        got = cap.take(request_id)
        if got is None:
            return {"ok": False, "code": MASKS_MISSING, "error": f"no sampling masks held for request {request_id!r}"}
        return {"ok": True, "vocab": cap.vocab, "counts": got.counts,
                "data": base64.b64encode(bytes(got.data)).decode("ascii")}
