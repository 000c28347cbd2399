"""Mixture-of-experts support: family detection and routing replay in the trainer's model."""

from agentrl.moe.families import SUPPORTED, MoEInfo, UnsupportedMoE, moe_info
from agentrl.moe.replay import RoutingReplay, find_routers

__all__ = ["SUPPORTED", "MoEInfo", "RoutingReplay", "UnsupportedMoE", "find_routers", "moe_info"]
