"""agentrl's vLLM worker extension (``--worker-extension-cls agentrl.inference.lora_ext.LoRAInPlaceExtension``):
the weight-sync methods (:mod:`agentrl.weight_sync.vllm_ext`) and MoE routing capture
(:mod:`agentrl.moe.engine`), all called through ``collective_rpc``."""

from agentrl.moe.engine import RoutingCaptureMixin
from agentrl.weight_sync.vllm_ext import LoRAInPlaceExtension as _WeightSyncExtension


class LoRAInPlaceExtension(_WeightSyncExtension, RoutingCaptureMixin):
    """The worker extension every agentrl-started vLLM server loads (the name predates routing capture)."""


__all__ = ["LoRAInPlaceExtension"]
