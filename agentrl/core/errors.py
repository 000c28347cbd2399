"""The root of every agentrl error, and the few area bases under it.

Every exception class defined in ``agentrl`` (and in ``agentrl.envs`` / ``agentrl.sandbox``) derives from
:class:`AgentRLError`, so ``except agentrl.AgentRLError`` catches any failure that agentrl itself reports.
A class that used to subclass a builtin keeps it (``RunDirError`` is still a ``ValueError``,
``TrainerError`` still a ``RuntimeError``), so existing ``except ValueError`` code is unaffected.

Each class has a stable ``code`` (a class attribute, dotted ``area.name``, unique across agentrl): log and
branch on it, never on the message text, which may change. Errors that carry a code from the wire set
``code`` per instance to that code: :class:`agentrl.http.errors.ApiError` (the ``error`` field of the answer
it becomes) and :class:`agentrl.environment.remote.RemoteEnvError` (the env server's ``error`` field, when it
sent one). The codes of the engine-side weight-sync failures, which cross vLLM's ``collective_rpc`` as
``{"ok": false, "code": ..., "error": ...}`` records, are in :mod:`agentrl.weight_sync.base`.

The hierarchy (area bases here; the leaves live next to the code that raises them)::

    AgentRLError                  agentrl
    ├── ConfigError               config        a setting, path or device list that cannot be used
    ├── EnvError                  env           environments: tools, env servers, bundled envs
    ├── EngineError               inference     inference engines: their servers, the client, routing
    ├── WeightSyncError           weight_sync   publishing trained weights into the engines
    ├── SandboxError              sandbox       agentrl.sandbox (defined there)
    ├── TrainerError              trainer       agentrl.trainer.client (defined there)
    └── ...                                     a few more without an area (ApiError, RpcError, ...)

``tests/unit/test_errors.py`` walks every module and checks that each exception class is in this tree
(or on its short, commented allow-list of control-flow signals) and that the codes are unique;
``tests/unit/test_raises.py`` checks that no module raises a bare builtin exception (only what Python's
protocols ask for: ``AttributeError`` from ``__getattr__``, ``NotImplementedError`` from an abstract stub, ...).

This module imports nothing: anything may import it (the vLLM worker extension included).
"""

from __future__ import annotations

__all__ = ["AgentRLError", "ConfigError", "EngineError", "EnvError", "WeightSyncError", "first_line"]


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message, or its type's name when it has none: how an error that is reported
    inside a longer message is quoted."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class AgentRLError(Exception):
    """Base class of every error agentrl raises; ``code`` says which one, stably (see the module docstring).

    Subclasses set ``code`` in their class body; it must not change once released (rename the class, keep
    the code)."""

    code: str = "agentrl"


class ConfigError(AgentRLError):
    """A setting, path or device list cannot be used as given; the message names what to change."""

    code = "config"


class EnvError(AgentRLError):
    """An environment failed or was used wrongly: a tool, an env server, a bundled environment."""

    code = "env"


class EngineError(AgentRLError):
    """An inference engine (vLLM) failed, could not be reached or started, or answered something unusable."""

    code = "inference"


class WeightSyncError(AgentRLError):
    """Trained weights could not be made live in the engines."""

    code = "weight_sync"
