"""Find environment classes by name: built-ins, the ``agentrl.envs`` entry-point group, or ``pkg.mod:Class``."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from agentrl.environment import Environment

BUILTIN_ENVS: dict[str, str] = {
    "calc": "agentrl.envs.calc:CalcEnv",
    "swe": "agentrl.envs.swe:SweEnv",
}
"""First-party environments, so they resolve even without installed entry-point metadata."""


class UnknownEnvironmentError(LookupError):
    """No environment is registered under the requested name."""


def known_envs() -> dict[str, str]:
    """Name -> ``module:Class`` for every environment that can be found by name."""
    found = dict(BUILTIN_ENVS)
    for ep in entry_points(group="agentrl.envs"):
        found.setdefault(ep.name, ep.value)
    return found


def _import_target(target: str) -> type[Environment]:
    module_name, _, attr = target.partition(":")
    if not attr:
        raise UnknownEnvironmentError(f"{target!r} is not of the form 'package.module:Class'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UnknownEnvironmentError(f"cannot import {module_name!r} for environment {target!r}: {e}") from e
    try:
        cls = getattr(module, attr)
    except AttributeError as e:
        raise UnknownEnvironmentError(f"module {module_name!r} has no attribute {attr!r}") from e
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise UnknownEnvironmentError(f"{target!r} is not a subclass of agentrl.Environment")
    return cls


def load_env(name: str, url: str | None = None, token: str | None = None) -> type[Environment]:
    """Resolve an environment class from a registered name or a ``package.module:Class`` path; with ``url``,
    environment ``name`` served by ``agentrl serve-env`` at ``url`` (a bound ``RemoteEnvironment``)."""
    if url:
        from agentrl.remote import RemoteEnvironment

        return RemoteEnvironment.bind(url, token, env=name)
    if ":" in name:
        return _import_target(name)
    known = known_envs()
    if name not in known:
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}. Known environments: {', '.join(sorted(known))}. "
            "You can also pass 'package.module:Class'."
        )
    return _import_target(known[name])
