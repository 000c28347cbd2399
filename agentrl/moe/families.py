"""Which mixture-of-experts family a model is, read from its transformers config.

Routing replay needs to know, per family, how many experts there are, how many each token uses, which
decoder layers are sparse, and whether the router renormalises its top-k weights. Supported are the
families whose transformers router is a plain "softmax over all experts, then top-k" (``*TopKRouter``):
Qwen3-MoE, Qwen2-MoE (its shared expert is not routed), Mixtral and OLMoE. Families with other routers
(grouped or biased top-k, sigmoid scores, ...) raise :class:`UnsupportedMoE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentrl.core.errors import ConfigError

SUPPORTED = ("qwen3_moe", "qwen2_moe", "mixtral", "olmoe")
"""Model types whose routers :class:`agentrl.moe.replay.RoutingReplay` can replay."""

KNOWN_UNSUPPORTED = {
    "deepseek_v2": "grouped/biased top-k router",
    "deepseek_v3": "grouped top-k router with score-correction bias",
    "glm4_moe": "sigmoid router with score-correction bias and grouped top-k",
    "llama4": "sigmoid top-1 router with a shared expert",
    "llama4_text": "sigmoid top-1 router with a shared expert",
    "dbrx": "router with its own top-k normalisation (moe_normalize_expert_weights)",
}
"""MoE model types known to route differently from the supported ones (the reason, for the message)."""

EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
"""Config fields that, when positive, say a model has routed experts."""


class UnsupportedMoE(ConfigError, ValueError):
    """A mixture-of-experts model whose router routing replay does not support."""

    code = "config.unsupported_moe"


class NoModelType(ConfigError, ValueError):
    """A model config without a ``model_type``: which family the model is cannot be told."""

    code = "config.no_model_type"


@dataclass(frozen=True)
class MoEInfo:
    """The routing shape of a mixture-of-experts model."""

    family: str
    """The config's ``model_type`` (one of :data:`SUPPORTED`)."""
    experts: int
    """Routed experts per MoE layer (shared experts not counted)."""
    top_k: int
    """Experts each token is routed to."""
    layers: int
    """All decoder layers of the model (``num_hidden_layers``), dense ones included."""
    moe_layers: tuple[int, ...]
    """Indices of the decoder layers whose MLP is routed."""
    norm_topk_prob: bool
    """Whether the router renormalises the softmax probabilities of its top-k experts to sum to 1."""

    def as_doctor(self) -> dict[str, int]:
        """The summary ``{"experts": E, "top_k": K}``."""
        return {"experts": self.experts, "top_k": self.top_k}


def _get(config: Any, name: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(name, default)
    return getattr(config, name, default)


def _expert_count(config: Any) -> int:
    """The largest positive expert-count field of ``config`` or of its sub-configs (one level deep)."""
    found = 0
    for field in EXPERT_COUNT_FIELDS:
        value = _get(config, field)
        if isinstance(value, int) and not isinstance(value, bool):
            found = max(found, value)
    subs = config.values() if isinstance(config, Mapping) else vars(config).values()
    for sub in subs:
        if isinstance(sub, Mapping) or hasattr(sub, "to_dict"):
            for field in EXPERT_COUNT_FIELDS:
                value = _get(sub, field)
                if isinstance(value, int) and not isinstance(value, bool):
                    found = max(found, value)
    return found


def _unsupported(model_type: str, why: str) -> UnsupportedMoE:
    return UnsupportedMoE(
        f"routing replay does not support MoE family {model_type!r} ({why}); "
        f"supported families: {', '.join(SUPPORTED)}"
    )


def _as_config(config: Any, model_type: str) -> Any:
    """A transformers config object for a supported family (a dict gets the family's defaults)."""
    if not isinstance(config, Mapping):
        return config
    from transformers import AutoConfig

    fields = {k: v for k, v in config.items() if k != "model_type"}
    return AutoConfig.for_model(model_type, **fields)


def _qwen_moe_layers(config: Any) -> tuple[int, ...]:
    """Qwen2/3-MoE: layer ``i`` is sparse unless listed in ``mlp_only_layers``, and when
    ``(i + 1) % decoder_sparse_step == 0`` (as their decoder layers decide)."""
    mlp_only = set(config.mlp_only_layers or [])
    step = config.decoder_sparse_step
    return tuple(
        i for i in range(config.num_hidden_layers)
        if i not in mlp_only and config.num_experts > 0 and (i + 1) % step == 0
    )


def _check_olmoe(cfg: Any) -> None:
    """OLMoE settings vLLM 0.32 serves differently from transformers (checked on its CPU engine): the
    engine would sample from another network than the trainer scores, silently."""
    if getattr(cfg, "tie_word_embeddings", False):
        raise _unsupported("olmoe", "tied embeddings: vLLM's OLMoE builds an untied lm_head that a tied "
                                    "checkpoint never fills, so the engine serves garbage logits")
    if getattr(cfg, "norm_topk_prob", False):
        raise _unsupported("olmoe", "norm_topk_prob = true: vLLM's OLMoE never renormalises its top-k "
                                    "weights, transformers does")


def moe_info(config: Any) -> MoEInfo | None:
    """The routing shape of the model of ``config`` (a transformers config or its dict), or None for a
    dense model.

    Raises :class:`UnsupportedMoE` for a mixture-of-experts model of another family (any config naming a
    known MoE family or with a positive expert-count field: ``num_experts``, ``num_local_experts``,
    ``n_routed_experts``, ``moe_num_experts``, also in a sub-config such as ``text_config``).
    """
    model_type = _get(config, "model_type")
    if not isinstance(model_type, str) or not model_type:
        raise NoModelType("config has no model_type")
    if model_type in KNOWN_UNSUPPORTED:
        raise _unsupported(model_type, KNOWN_UNSUPPORTED[model_type])
    if model_type not in SUPPORTED:
        if _expert_count(config) > 0:
            raise _unsupported(model_type, "unknown router")
        return None
    cfg = _as_config(config, model_type)
    if model_type == "mixtral":
        experts = cfg.num_local_experts
        moe_layers = tuple(range(cfg.num_hidden_layers))
        norm = True  # MixtralTopKRouter always renormalises its top-k weights
    elif model_type == "olmoe":
        _check_olmoe(cfg)
        experts = cfg.num_experts
        moe_layers = tuple(range(cfg.num_hidden_layers))
        norm = bool(cfg.norm_topk_prob)
    else:
        experts = cfg.num_experts
        moe_layers = _qwen_moe_layers(cfg)
        norm = bool(cfg.norm_topk_prob)
    if experts <= 0 or not moe_layers:
        return None
    return MoEInfo(
        family=model_type,
        experts=int(experts),
        top_k=int(cfg.num_experts_per_tok),
        layers=int(cfg.num_hidden_layers),
        moe_layers=moe_layers,
        norm_topk_prob=norm,
    )
