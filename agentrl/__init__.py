"""agentrl: agentic, multi-turn reinforcement learning for LLMs.

Public API (imported lazily so ``import agentrl`` stays light and has no side effects)::

    import agentrl

    class MyEnv(agentrl.Environment):
        @agentrl.tool
        def lookup(self, key: str) -> str: ...
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType
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


# The tree was regrouped (the contracts under ``core``, benchmarks and model building under ``tools``, the HTTP
# front ends under ``http``); the old import paths keep working, ``python -m`` included, and name the very same
# module objects (one class per concept, whichever path imported it).
MOVED: dict[str, str] = {
    "agentrl.errors": "agentrl.core.errors",
    "agentrl.types": "agentrl.core.types",
    "agentrl.versions": "agentrl.core.versions",
    "agentrl.utils": "agentrl.core.utils",
    "agentrl.bench": "agentrl.tools.bench",
    "agentrl.modelgen": "agentrl.tools.modelgen",
    "agentrl.scaffold": "agentrl.tools.scaffold",
    "agentrl.server": "agentrl.http.server",
    "agentrl.policy": "agentrl.http.policy",
    "agentrl.modelgen.pinned": "agentrl.launch.pinned",  # installing the pinned models is a run's own step
    "agentrl.http.tls": "agentrl.core.utils.tls",  # a helper of the HTTP clients
}
"""Old module path (and everything under it) → where it lives now."""


def _moved_to(name: str) -> str | None:
    """Where ``name`` lives now (the longest old path that names it or a package above it), or None."""
    old = max((o for o in MOVED if name == o or name.startswith(o + ".")), key=len, default=None)
    return None if old is None else MOVED[old] + name[len(old):]


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the module at its new one (imported once, under its new name)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.spec: Any = None

    def create_module(self, spec: Any) -> ModuleType:
        module = importlib.import_module(self.target)
        self.spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system gave it the alias's spec: it keeps its own

    def get_code(self, fullname: str) -> Any:  # ``python -m <old path>``
        spec = importlib.util.find_spec(self.target)
        return spec.loader.get_code(self.target) if spec and spec.loader else None  # type: ignore[attr-defined]


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = _moved_to(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new),
                                               is_package=real.submodule_search_locations is not None)


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
