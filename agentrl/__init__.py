"""agentrl: agentic, multi-turn reinforcement learning for LLMs.

Public API (imported lazily so ``import agentrl`` stays light and has no side effects)::

    import agentrl

    class MyEnv(agentrl.Environment):
        @agentrl.tool
        def lookup(self, key: str) -> str: ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "AgentRLError": "agentrl.core.errors",
    "Environment": "agentrl.environment.base",
    "tool": "agentrl.environment.base",
    "ToolError": "agentrl.environment.base",
    "ToolArgumentError": "agentrl.environment.base",
    "Task": "agentrl.environment.base",
    "Trajectory": "agentrl.core.types",
    "Message": "agentrl.core.types",
    "ToolCall": "agentrl.core.types",
    "StopReason": "agentrl.core.types",
    "load_env": "agentrl.environment.registry",
    "UnknownEnvironmentError": "agentrl.environment.registry",
    "ChatFormat": "agentrl.rollout.chat",
    "run_episode": "agentrl.rollout.loop",
    "SamplingConfig": "agentrl.config.run",
    "Episode": "agentrl.rollout.episode",
    "RolloutWorkers": "agentrl.rollout.groups",
    "InferenceClient": "agentrl.inference.client",
    "VLLMServer": "agentrl.inference.server",
    "RunConfig": "agentrl.config.run",
    "RemoteEnvironment": "agentrl.environment.remote",
    "RemoteEnvError": "agentrl.environment.remote",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.config.run import RunConfig, SamplingConfig
    from agentrl.core.errors import AgentRLError
    from agentrl.core.types import Message, StopReason, ToolCall, Trajectory
    from agentrl.environment.base import Environment, Task, ToolArgumentError, ToolError, tool
    from agentrl.environment.registry import UnknownEnvironmentError, load_env
    from agentrl.environment.remote import RemoteEnvError, RemoteEnvironment
    from agentrl.inference.client import InferenceClient
    from agentrl.inference.server import VLLMServer
    from agentrl.rollout.chat import ChatFormat
    from agentrl.rollout.episode import Episode
    from agentrl.rollout.groups import RolloutWorkers
    from agentrl.rollout.loop import run_episode


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)

