"""The routing-capture methods of agentrl's vLLM worker extension (called through ``collective_rpc``).

``agentrl_routing_enable`` installs :class:`agentrl.engine.capture.RoutingCapture` once (idempotent) and says
what the engine serves; ``agentrl_routing_take`` hands one request's routing to its client. Both return a
record rather than raising: a dict crosses vLLM's route as JSON, an exception only as an HTTP 500. Both need
the router tap (patch 7 of :mod:`agentrl.engine.vllm_patches`): when the patches were refused they answer with
the refusal's record (code ``inference.vllm_version_refused``).

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import base64
from typing import Any

from agentrl.engine.install import needs_patches

ROUTING_UNAVAILABLE = "routing.unavailable"
"""The engine cannot capture routing (a dense model, or MoE layers without a capturable router)."""
ROUTING_MISSING = "routing.missing"
"""No routing is held for the request (never seen by this worker, already taken, or expired)."""


class RoutingCaptureMixin:
    """Mixed into vLLM's worker class with the weight-sync methods."""

    @needs_patches
    def agentrl_routing_enable(self) -> dict[str, Any]:
        """Start capturing routing (once); ``{"ok", "layers", "top_k", "experts", "moe_layers", "dtype", "new"}``
        (``new``: this call turned it on, so the prefix cache may hold blocks computed without capture)."""
        cap = self.__dict__.get("_agentrl_routing")
        new = cap is None
        if cap is None:
            from agentrl.engine.capture import RoutingCapture, RoutingNotCapturable

            try:
                cap = RoutingCapture.install(self.model_runner)
            except (RoutingNotCapturable, AttributeError, ImportError) as exc:
                return {"ok": False, "code": ROUTING_UNAVAILABLE, "error": f"{type(exc).__name__}: {exc}"}
            self.__dict__["_agentrl_routing"] = cap
        return {"ok": True, "layers": cap.layers, "top_k": cap.top_k, "experts": cap.experts,
                "moe_layers": cap.moe_layers, "dtype": cap.dtype.name, "new": new}

    @needs_patches
    def agentrl_routing_take(self, request_id: str, start: str = "0") -> dict[str, Any]:
        """The routing of request ``request_id`` from position ``start`` on, and forget the request:
        ``{"ok", "n", "start", "shape", "dtype", "data"}`` (``data``: base64 of the row-major array)."""
        cap = self.__dict__.get("_agentrl_routing")
        if cap is None:
            return {"ok": False, "code": ROUTING_UNAVAILABLE, "error": "routing capture is not enabled"}
        got = cap.take(request_id, int(start))
        if got is None:
            return {"ok": False, "code": ROUTING_MISSING, "error": f"no routing held for request {request_id!r}"}
        n, rows = got
        return {"ok": True, "n": n, "start": n - len(rows), "shape": list(rows.shape), "dtype": rows.dtype.name,
                "data": base64.b64encode(rows.tobytes()).decode("ascii")}
