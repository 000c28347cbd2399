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
    "Environment": "agentrl.environment",
    "tool": "agentrl.environment",
    "ToolError": "agentrl.environment",
    "ToolArgumentError": "agentrl.environment",
    "Task": "agentrl.environment",
    "Trajectory": "agentrl.types",
    "Message": "agentrl.types",
    "ToolCall": "agentrl.types",
    "StopReason": "agentrl.types",
    "load_env": "agentrl.registry",
    "UnknownEnvironmentError": "agentrl.registry",
    "ChatFormat": "agentrl.chat",
    "run_episode": "agentrl.rollout",
    "SamplingConfig": "agentrl.config",
    "Episode": "agentrl.episode",
    "RolloutWorkers": "agentrl.workers",
    "InferenceClient": "agentrl.inference.client",
    "VLLMServer": "agentrl.inference.server",
    "RunConfig": "agentrl.config",
    "RemoteEnvironment": "agentrl.remote",
    "RemoteEnvError": "agentrl.remote",
}

__all__ = [*_EXPORTS, "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.chat import ChatFormat
    from agentrl.config import RunConfig, SamplingConfig
    from agentrl.environment import Environment, Task, ToolArgumentError, ToolError, tool
    from agentrl.episode import Episode
    from agentrl.inference.client import InferenceClient
    from agentrl.inference.server import VLLMServer
    from agentrl.registry import UnknownEnvironmentError, load_env
    from agentrl.remote import RemoteEnvError, RemoteEnvironment
    from agentrl.rollout import run_episode
    from agentrl.types import Message, StopReason, ToolCall, Trajectory
    from agentrl.workers import RolloutWorkers


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agentrl' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
