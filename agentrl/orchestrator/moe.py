"""What a run does for a mixture-of-experts model: which LoRA sync path its engines need, and turning on
routing capture so every trajectory carries the experts the engine chose (replayed by the trainer)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from agentrl.config.run import RunConfig
from agentrl.core.errors import EngineError
from agentrl.core.types import Routing
from agentrl.moe.families import MoEInfo, moe_info

log = logging.getLogger(__name__)


class RoutingCaptureError(EngineError, RuntimeError):
    """The engines cannot capture MoE routing for replay, or route another shape than the trainer's model."""

    code = "inference.routing_capture"


def model_moe(model: str) -> MoEInfo | None:
    """The MoE shape of the model directory ``model`` (None: dense, or no local ``config.json`` yet, as for
    the embedded model before its first build); raises ``UnsupportedMoE`` for a family agentrl cannot replay."""
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    return moe_info(json.loads(path.read_text()))


def plan_moe(cfg: RunConfig, info: MoEInfo | None) -> RunConfig:
    """``cfg`` with ``pipeline.lora_sync`` settled: ``merged`` for a LoRA run of a MoE model on an engine build
    that cannot serve LoRA on MoE layers (vLLM's CPU build), or of an adapter with tensors trained whole (its
    norms, the embedding: vLLM's LoRA slots hold none), else ``adapter``. Logs the path taken. (A black-box
    agent's rows carry routing like agentrl's own loop: the policy endpoint records it per row.)"""
    if cfg.pipeline.lora_sync != "auto":
        return cfg
    from agentrl.inference.server import _is_cpu_build

    merged = info is not None and cfg.trainer.lora and _is_cpu_build()
    whole = cfg.trainer.lora_trains_whole  # vLLM's LoRA slots hold no norms, no embedding
    cfg = cfg.with_changes({"pipeline.lora_sync": "merged" if merged or whole else "adapter"})
    if merged:
        log.info("MoE model on vLLM's CPU build, which cannot run LoRA on MoE layers: the engines run without "
                 "LoRA and merge each published adapter into the weights it touches (pipeline.lora_sync = "
                 "'merged')")
    elif whole:
        log.info("the adapter carries tensors trained whole (trainer.lora_train_norms, trainer.lora_train_embedding), "
                 "which vLLM's LoRA slots cannot hold: the engines merge each published adapter into their "
                 "weights (pipeline.lora_sync = 'merged')")
    return cfg


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
