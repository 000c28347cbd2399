"""Engine-side capture of MoE expert routing, per request, where vLLM cannot return it itself.

vLLM returns ``routed_experts`` natively only with its V2 model runner (``enable_return_routed_experts``),
which needs Triton; its CPU build has neither. This capture gives the same layout from any model runner
whose MoE layers route through a ``BaseRouter`` (the routers of Qwen2/3-MoE, Mixtral, OLMoE):

* every router's capture hook (``router.set_capture_fn``, the hook vLLM's own capturer uses) writes the
  step's top-k ids into one step tensor ``[tokens, layers, top_k]`` (:class:`RouterTap`). The tap is set
  when the model loads, before vLLM compiles it: the CPU build traces the MoE layers into its compiled
  graph, which keeps a hook set later out of it. Writing a tensor is all the compiled graph does;
* the runner's ``_prepare_inputs`` is wrapped to learn the step's token layout (the request and position
  of every scheduled token), and ``execute_model`` to hand the step's rows to their requests once the
  forward pass has run (per instance, :func:`agentrl.engine.vllm_patches.wrap_runner_step`);
* each request keeps its rows by position, **first write wins**: a request preempted by a weight update and
  recomputed under the new weights keeps the routing its earlier tokens were sampled with;
* every row is also written to a slot store indexed like the KV cache (``block_id * block_size + offset``),
  so a request whose prefix hits the prefix cache (no forward for those positions) gets their routing from
  the request that computed them.

A request's routing covers positions ``0 .. len(prompt) + len(output) - 2``: the last sampled token was never
fed forward. ``take(request_id, start)`` returns positions ``start ..`` and forgets the request (a multi-turn
episode asks only for the positions it does not hold yet). Rows of requests nobody takes are dropped a while
after the request finished.

This module runs inside a vLLM worker. Every vLLM internal it touches (the routers, the runner's step layout
and its wrapped methods) goes through :mod:`agentrl.engine.vllm_patches`; it imports neither vLLM nor torch
at module level.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentrl.core.errors import EngineError
from agentrl.engine import vllm_patches

UNCLAIMED_TTL_S = 120.0
"""Seconds a finished request's routing is kept for its client to take."""


def pop_request(held: dict[str, Any], request_id: str) -> Any:
    """Remove and return the record of the request whose engine id is ``request_id`` or contains it (vLLM
    suffixes the ids it is given); None when ``held`` has none."""
    key = request_id if request_id in held else next((k for k in held if request_id in k), None)
    return None if key is None else held.pop(key)


class RoutingNotCapturable(EngineError, ValueError):
    """The engine cannot capture expert routing: a dense model, or MoE layers without a router that can be
    tapped. ``agentrl_routing_enable`` reports it as a ``routing.unavailable`` record
    (:data:`agentrl.engine.routing.ROUTING_UNAVAILABLE`)."""

    code = "inference.routing_not_capturable"


@dataclass
class _Held:
    """The routing one request holds: rows for positions ``0 .. n-1`` (a growing buffer)."""

    rows: np.ndarray
    n: int = 0
    finished_at: float | None = None


class RouterTap:
    """The MoE routers of a loaded model, each writing its step's top-k ids into one tensor."""

    def __init__(self, model: Any, layers: int, top_k: int, experts: int, max_tokens: int) -> None:
        import torch

        self.layers, self.top_k, self.experts = layers, top_k, experts
        self.step = torch.zeros((max_tokens, layers, top_k), dtype=torch.int32)
        self.moe_layers = vllm_patches.tap_moe_routers(model, self._writer)
        if not self.moe_layers:
            raise RoutingNotCapturable(f"no MoE router with a capture hook in {type(model).__name__}")

    def _writer(self, layer_id: int) -> Any:
        step = self.step

        def write(topk_ids: Any) -> None:  # traced into the compiled graph: tensor ops only
            step[: topk_ids.shape[0], layer_id] = topk_ids

        return write

    @classmethod
    def attach(cls, runner: Any) -> RouterTap | None:
        """Tap the routers of ``runner``'s freshly loaded model (None for a dense model, or one whose MoE
        layers have no capturable router)."""
        experts, top_k, layers, max_tokens = vllm_patches.moe_geometry(runner)
        if experts <= 0 or top_k <= 0:
            return None
        try:
            return cls(vllm_patches.runner_model(runner), layers, top_k, experts, max_tokens + 64)
        except RoutingNotCapturable:
            return None


class RoutingCapture:
    """Per-request routing capture inside one vLLM worker (see the module docstring)."""

    def __init__(self, tap: RouterTap) -> None:
        self.tap = tap
        self.layers, self.top_k, self.experts = tap.layers, tap.top_k, tap.experts
        self.moe_layers = tap.moe_layers
        self.dtype = np.dtype(np.uint8 if tap.experts <= 256 else np.uint16)
        self.slots = np.zeros((0, self.layers, self.top_k), self.dtype)
        self.held: dict[str, _Held] = {}
        self._layout: list[tuple[str, np.ndarray, np.ndarray, int]] = []
        """This step's chunks: (request id, positions, block-table row, block size)."""
        self._steps = 0

    # -- hooks -------------------------------------------------------------------------------------------

    def on_layout(self, runner: Any, num_scheduled: np.ndarray) -> None:
        """After ``_prepare_inputs``: which request and position each of the step's tokens is."""
        self._layout = vllm_patches.step_layout(runner, num_scheduled)

    def on_step_done(self, finished: Any) -> None:
        """After the forward pass: give the step's rows to their requests and to the slot store."""
        off = 0
        now = time.monotonic()
        total = sum(len(p) for _, p, _, _ in self._layout)
        step = self.tap.step[:total].to("cpu").numpy().astype(self.dtype) if total else None
        chunks = []
        for req_id, positions, blocks, block_size in self._layout:  # every slot first: a request may hit
            n = len(positions)                                      # blocks another computes in this step
            rows = step[off: off + n]
            off += n
            slots = blocks[positions // block_size].astype(np.int64) * block_size + positions % block_size
            self._store_slots(slots, rows)
            chunks.append((req_id, positions, rows, blocks, block_size))
        for req_id, positions, rows, blocks, block_size in chunks:
            self._give(req_id, positions, rows, blocks, block_size)
        self._layout = []
        for req_id in finished or ():
            h = self.held.get(req_id)
            if h is not None and h.finished_at is None:
                h.finished_at = now
        self._steps += 1
        if self._steps % 256 == 0:
            stale = [k for k, h in self.held.items() if h.finished_at is not None
                     and now - h.finished_at > UNCLAIMED_TTL_S]
            for k in stale:
                del self.held[k]

    # -- stores ------------------------------------------------------------------------------------------

    def _store_slots(self, slots: np.ndarray, rows: np.ndarray) -> None:
        need = int(slots.max()) + 1 if len(slots) else 0
        if need > len(self.slots):
            grown = np.zeros((max(need, 2 * len(self.slots), 4096), self.layers, self.top_k), self.dtype)
            grown[: len(self.slots)] = self.slots
            self.slots = grown
        self.slots[slots] = rows

    def _give(self, req_id: str, positions: np.ndarray, rows: np.ndarray, blocks: np.ndarray,
              block_size: int) -> None:
        h = self.held.get(req_id)
        if h is None:
            h = self.held[req_id] = _Held(np.zeros((max(256, int(positions[-1]) + 1), self.layers, self.top_k),
                                                   self.dtype))
        start = int(positions[0])
        if start > h.n:  # positions served from the prefix cache: computed by an earlier request
            gap = np.arange(h.n, start)
            self._grow(h, start)
            h.rows[h.n: start] = self.slots[blocks[gap // block_size].astype(np.int64) * block_size
                                            + gap % block_size]
            h.n = start
        end = int(positions[-1]) + 1
        if end <= h.n:
            return  # recomputed positions (a preemption): the first computation's routing stays
        keep = positions >= h.n
        self._grow(h, end)
        h.rows[positions[keep]] = rows[keep]
        h.n = end

    @staticmethod
    def _grow(h: _Held, n: int) -> None:
        if n > len(h.rows):
            grown = np.zeros((max(n, 2 * len(h.rows)), *h.rows.shape[1:]), h.rows.dtype)
            grown[: h.n] = h.rows[: h.n]
            h.rows = grown

    def take(self, request_id: str, start: int = 0) -> tuple[int, np.ndarray] | None:
        """The routing of the request whose id contains ``request_id``, positions ``start ..`` (and forget
        the request): ``(number of positions it covers, rows)``; None when no such request is held."""
        h = pop_request(self.held, request_id)
        if h is None:
            return None
        return h.n, np.ascontiguousarray(h.rows[min(start, h.n): h.n])

    # -- installation ------------------------------------------------------------------------------------

    @classmethod
    def install(cls, runner: Any) -> RoutingCapture:
        """Start capturing on ``runner``, whose routers were tapped at load (:class:`RoutingNotCapturable`, a
        ``ValueError``, otherwise)."""
        tap = getattr(runner, "_agentrl_router_tap", None)
        if tap is None:
            mc = vllm_patches.model_config(runner)
            kind = "is not a mixture-of-experts model" if mc.get_num_experts() <= 0 else (
                "has no MoE router whose decisions can be captured")
            raise RoutingNotCapturable(f"{mc.model} {kind}")
        cap = cls(tap)
        vllm_patches.wrap_runner_step(runner, lambda num_scheduled: cap.on_layout(runner, np.asarray(num_scheduled)),
                                      cap.on_step_done)
        return cap
