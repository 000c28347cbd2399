"""What a run does for a mixture-of-experts model: turning on routing capture so every trajectory carries the
experts the engine chose (replayed by the trainer). Which weight-sync transport its engines need is settled
with the config (:mod:`agentrl.config.sync`)."""

from __future__ import annotations

import logging

from agentrl.core.errors import EngineError
from agentrl.core.types import Routing
from agentrl.moe.families import MoEInfo

log = logging.getLogger(__name__)


class RoutingCaptureError(EngineError, RuntimeError):
    """The engines cannot capture MoE routing for replay, or route another shape than the trainer's model."""

    code = "inference.routing_capture"


async def routing_template(client: object, info: MoEInfo | None, replay: bool) -> Routing | None:
    """Turn on routing capture on every engine (a MoE model) and return the empty :class:`Routing` each
    episode starts from; None for a dense model. An engine that cannot capture routing stops the run
    unless replay is off (``trainer.routing_replay = false``): a MoE model is never trained silently with
    routing the trainer cannot replay."""
    if info is None:
        return None
    recs = await client.enable_routing_capture()  # type: ignore[attr-defined]
    bad = {url: rec.get("error") for url, rec in recs.items() if not rec.get("ok")}
    if bad:
        msg = "; ".join(f"{u}: {e}" for u, e in bad.items())
        if replay:
            raise RoutingCaptureError(f"MoE routing capture is unavailable on engine(s) {msg}; routing replay "
                                      "needs it (set trainer.routing_replay = false to train without replay)")
        log.warning("MoE routing capture unavailable (%s): training without routing replay", msg)
        return None
    if any(rec.get("new") for rec in recs.values()):  # blocks cached before capture have no routing
        await client.reset_prefix_cache()  # type: ignore[attr-defined]
    first = next(iter(recs.values()))
    if (first["layers"], first["top_k"]) != (info.layers, info.top_k):
        raise RoutingCaptureError(f"the engines route {first['layers']} layers x top-{first['top_k']}, the "
                                  f"trainer's model {info.layers} x top-{info.top_k}: not the same model")
    log.info("MoE routing capture on: %d experts, top-%d, %d MoE layers", first["experts"], first["top_k"],
             len(first["moe_layers"]))
    return Routing(layers=info.layers, top_k=info.top_k, dtype=first["dtype"])
