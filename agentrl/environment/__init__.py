"""Environments: the `Environment` base class and `@tool` (what users subclass), tool schemas, the registry
that finds environments by name, task sources, and the clients of environments served elsewhere
(``agentrl serve-env`` and OpenEnv servers).

- :mod:`agentrl.environment.base`: `Environment`, `tool`, `ToolError`;
- :mod:`agentrl.environment.schema`: JSON schemas of tools from type hints and docstrings;
- :mod:`agentrl.environment.registry`: ``--env NAME`` → an environment class;
- :mod:`agentrl.environment.tasks`: an environment's splits or a JSONL file of tasks;
- :mod:`agentrl.environment.remote`, :mod:`agentrl.environment.openenv`: environments over HTTP.

The bundled environments themselves (``calc``, ``guess``, ``lookup``, ``swe``) are installed as
``agentrl.envs``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AgentTimeLimit", "Environment", "Task", "ToolArgumentError", "ToolError", "tool"]


def __getattr__(name: str) -> Any:
    """``from agentrl.environment import Environment`` as before the package split (lazily: no cycles)."""
    if name in __all__:
        from agentrl.environment import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
