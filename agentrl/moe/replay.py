"""Routing replay: make the trainer's MoE routers use the experts the inference engine chose.

The engine records, for every token and MoE layer, the ids of the experts it ran. Replaying them in the
trainer's forward makes the trainer compute the logprobs of the same sparse network the tokens were
sampled from. The gate weights stay differentiable: they are the router's own softmax over all experts,
taken at the recorded ids (renormalised when the router renormalises), so the router still learns.

Usage, per micro-batch::

    replay.set(routing)      # [B, T, layers, top_k], aligned with input_ids
    loss = loss_fn(model(input_ids))
    loss.backward()          # gradient-checkpointing recompute replays the same ids
    replay.clear()

The routing must stay set until backward is done: with gradient checkpointing the decoder layers run
again during backward, and must route as they did in forward.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from agentrl.core.errors import AgentRLError
from agentrl.moe.families import MoEInfo

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")


class ReplayMismatch(AgentRLError, RuntimeError):
    """Routing replay does not fit the model: its routers do not match its config (or their layers cannot be
    told apart), or the routing set does not cover the tokens a router is given."""

    code = "moe.replay_mismatch"


class InvalidRouting(AgentRLError, ValueError):
    """A routing to replay has the wrong shape or expert ids out of range, repeated, or mixed with -1."""

    code = "moe.invalid_routing"


class RoutingDtypeError(AgentRLError, TypeError):
    """A routing to replay is not an integer tensor."""

    code = "moe.routing_dtype"


def find_routers(model: nn.Module) -> dict[int, nn.Module]:
    """The top-k router of each MoE decoder layer of ``model`` by layer index: modules whose class name
    ends in ``TopKRouter``, under a ``layers.<i>`` path (also through peft and FSDP2 wrappers)."""
    routers: dict[int, nn.Module] = {}
    for name, module in model.named_modules():
        if not type(module).__name__.endswith("TopKRouter"):
            continue
        match = _LAYER.search(name)
        if match is None:
            raise ReplayMismatch(f"router {name!r} is not under a 'layers.<i>' module path")
        layer = int(match.group(1))
        if layer in routers:
            raise ReplayMismatch(f"two routers in decoder layer {layer} (second: {name!r})")
        routers[layer] = module
    return routers


def _in_backward() -> bool:
    """Whether autograd is running a backward pass (gradient-checkpointing recompute happens there)."""
    return torch._C._current_graph_task_id() != -1


class RoutingReplay:
    """Forces the MoE routers of a Hugging Face model to route to recorded experts.

    Each router gets a forward hook. While a routing is set (:meth:`set`), the hook replaces the router's
    top-k ids by the recorded ones (tokens whose recorded row is all -1 keep their own) and recomputes the
    gate weights from the router's logits: softmax over all experts in float32, gathered at the ids,
    renormalised when ``info.norm_topk_prob``, cast to the dtype of the router's own top-k weights (the
    model dtype; float32 for Mixtral). Router logits are returned unchanged (the auxiliary loss sees them as
    usual). No gradient flows through the ids; the gate weights carry it to the router.

    It also counts, over known tokens and MoE layers, how often the router's own top-k set differs from
    the recorded one (:meth:`stats`); recompute during backward is not counted twice.

    The routing stays set until changed: set it before forward and clear it after backward, so that
    gradient-checkpointing recompute (which runs during backward) uses the same ids.

    With ``enabled=False`` nothing is forced (for comparison runs), but a given routing is still compared
    with the router's own choice in :meth:`stats`.
    """

    def __init__(self, model: nn.Module, info: MoEInfo, *, enabled: bool = True) -> None:
        routers = find_routers(model)
        if sorted(routers) != sorted(info.moe_layers):
            raise ReplayMismatch(
                f"found {len(routers)} MoE routers in layers {sorted(routers)}, but the config of "
                f"{info.family} has {len(info.moe_layers)} MoE layers {list(info.moe_layers)}"
            )
        for layer, router in routers.items():
            self._check_router(layer, router, info)
        self.info = info
        self.enabled = enabled
        self._routing: torch.Tensor | None = None
        self._on_device: dict[torch.device, torch.Tensor] = {}
        self._counts: torch.Tensor | None = None
        self._handles: list[RemovableHandle] = [
            router.register_forward_hook(self._hook(layer)) for layer, router in sorted(routers.items())
        ]

    @staticmethod
    def _check_router(layer: int, router: nn.Module, info: MoEInfo) -> None:
        for attr, want in (("top_k", info.top_k), ("num_experts", info.experts),
                           ("norm_topk_prob", info.norm_topk_prob)):
            have = getattr(router, attr, None)
            if have is not None and have != want:
                raise ReplayMismatch(f"router of layer {layer} has {attr}={have}, the config says {want}")

    def set(self, routing: torch.Tensor | None) -> None:
        """Route the next forward(s) by ``routing``: expert ids ``[B, T, layers, top_k]`` aligned with
        their ``input_ids`` (``layers`` = all decoder layers; rows of dense layers are ignored). A
        (token, layer) row of all -1 is unknown: that token keeps the router's own top-k there. ``None``
        stops replay. Stays set until changed (clear it after backward)."""
        self._on_device = {}
        if routing is None:
            self._routing = None
            return
        self._routing = self._validate(routing)

    def clear(self) -> None:
        """Stop replay (``set(None)``)."""
        self.set(None)

    def _validate(self, routing: torch.Tensor) -> torch.Tensor:
        info = self.info
        if not isinstance(routing, torch.Tensor) or routing.dtype.is_floating_point or routing.dtype.is_complex \
                or routing.dtype == torch.bool:
            raise RoutingDtypeError(f"routing must be an integer tensor, got {getattr(routing, 'dtype', type(routing))}")
        if routing.dim() != 4 or routing.shape[2] != info.layers or routing.shape[3] != info.top_k:
            raise InvalidRouting(
                f"routing must have shape [batch, tokens, {info.layers} layers, top_k={info.top_k}], "
                f"got {list(routing.shape)}"
            )
        routing = routing.long()
        moe = routing[:, :, list(info.moe_layers)]
        unknown = moe == -1
        if bool(((moe < -1) | (moe >= info.experts)).any()):
            raise InvalidRouting(f"routing has expert ids outside [0, {info.experts}) (or -1 for unknown)")
        if bool((unknown.any(-1) & ~unknown.all(-1)).any()):
            raise InvalidRouting("routing has a (token, layer) row mixing -1 with expert ids: a row is all -1 or none")
        ordered = moe.sort(-1).values
        if bool(((ordered[..., 1:] == ordered[..., :-1]) & ~unknown[..., 1:]).any()):
            raise InvalidRouting("routing routes a token to the same expert twice in one layer")
        return routing

    def _layer_routing(self, layer: int, device: torch.device, tokens: int) -> torch.Tensor:
        """The recorded ids of ``layer`` as ``[tokens, top_k]`` on ``device``."""
        routing = self._routing
        assert routing is not None
        if routing.shape[0] * routing.shape[1] != tokens:
            raise ReplayMismatch(
                f"routing covers {routing.shape[0]}x{routing.shape[1]} tokens but the router of layer {layer} "
                f"got {tokens}: set the routing of this batch before its forward"
            )
        on_device = self._on_device.get(device)
        if on_device is None:
            on_device = self._on_device[device] = routing.to(device, non_blocking=True)
        return on_device[:, :, layer].reshape(tokens, -1)

    def _hook(self, layer: int) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
            if self._routing is None:
                return None
            logits, scores, own = output
            recorded = self._layer_routing(layer, logits.device, logits.shape[0])
            known = recorded[:, 0] >= 0
            if not _in_backward():
                self._count(known, own, recorded)
            if not self.enabled:
                return None
            ids = torch.where(known[:, None], recorded, own)
            probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
            weights = probs.gather(-1, ids)
            if self.info.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
            return logits, weights.to(scores.dtype), ids.to(own.dtype)

        return hook

    def _count(self, known: torch.Tensor, own: torch.Tensor, recorded: torch.Tensor) -> None:
        differs = (own.sort(-1).values != recorded.sort(-1).values).any(-1) & known
        known_n = known.sum()
        forced = known_n if self.enabled else torch.zeros_like(known_n)
        step = torch.stack([known_n, differs.sum(), forced, torch.full_like(known_n, known.numel())])
        self._counts = step if self._counts is None else self._counts.to(step.device) + step

    def stats(self) -> dict[str, float]:
        """Routing statistics since the last :meth:`reset_stats`: ``routing_decisions`` (known
        (token, MoE layer) decisions compared), ``routing_mismatch_frac`` (of those, the fraction where
        the router's own top-k set differs from the recorded one), ``routing_replayed_frac`` (of the known
        decisions, the fraction that was forced: 1 with replay on, 0 with it off) and ``routing_known_frac``
        (of all (token, MoE layer) pairs routed while a routing was set, the fraction with a recorded routing;
        the rest are the sequences' last tokens and padding)."""
        decisions, mismatches, forced, seen = (0, 0, 0, 0) if self._counts is None else self._counts.tolist()
        return {
            "routing_decisions": decisions,
            "routing_mismatch_frac": mismatches / decisions if decisions else 0.0,
            "routing_replayed_frac": forced / decisions if decisions else 0.0,
            "routing_known_frac": decisions / seen if seen else 0.0,
        }

    def reset_stats(self) -> None:
        """Zero the statistics."""
        self._counts = None

    def remove(self) -> None:
        """Take the hooks off the routers (the model routes by itself again)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.clear()
