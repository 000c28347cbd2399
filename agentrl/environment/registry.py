"""Find environment classes by name.

An environment is named in one of four ways (``--env``, ``env = ...`` in a config, ``serve-env --env``):

- a registered name: the built-ins (``calc``, ``guess``, ``lookup``, ``swe``) and the ``agentrl.envs``
  entry-point group;
- ``package.module:Class``: imported like ``python -m`` and uvicorn do, so a module in the current
  directory is found without an install or ``PYTHONPATH``;
- ``path/to/file.py:Class`` (relative to the current directory, or absolute): that file is loaded; its
  directory goes on the import path so that it can import its neighbours.

Anything that cannot be loaded raises `UnknownEnvironmentError` with what was tried, where it looked and
the fix, and never a bare import traceback.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from agentrl.core.errors import EnvError
from agentrl.environment.base import Environment

BUILTIN_ENVS: dict[str, str] = {
    "calc": "agentrl.envs.calc:CalcEnv",
    "guess": "agentrl.envs.guess:GuessEnv",
    "lookup": "agentrl.envs.lookup:LookupEnv",
    "swe": "agentrl.envs.swe:SweEnv",
}
"""First-party environments, so they resolve even without installed entry-point metadata."""

FORMS = "a registered name, package.module:Class (from the current directory) or path/to/file.py:Class"


class UnknownEnvironmentError(EnvError, LookupError):
    """The requested environment cannot be found or loaded; the message says why and what to do."""

    code = "env.unknown"


def known_envs() -> dict[str, str]:
    """Name -> ``module:Class`` for every environment that can be found by name."""
    found = dict(BUILTIN_ENVS)
    for ep in entry_points(group="agentrl.envs"):
        found.setdefault(ep.name, ep.value)
    return found


def is_file_target(spec: str) -> bool:
    """Whether ``spec`` names a file (``path/to/file.py:Class``) rather than a module."""
    if spec.startswith("openenv:"):
        return False
    where = spec.rpartition(":")[0]
    return where.endswith(".py") or "/" in where or os.sep in where


def canonical_spec(spec: str) -> str:
    """``spec`` with a file path made absolute, so that a run resumed or a process started elsewhere
    loads the same file; other forms unchanged."""
    if ":" in spec and is_file_target(spec):
        where, _, attr = spec.rpartition(":")
        return f"{Path(where).expanduser().resolve()}:{attr}"
    return spec


def _origin(error: BaseException, near: str) -> str:
    """`` (file.py, line N)`` for the deepest frame of ``error`` in a file under ``near`` (the user's code)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(near)]
    if isinstance(error, SyntaxError) and error.filename:
        return f" ({Path(error.filename).name}, line {error.lineno})"
    return f" ({Path(frames[-1].filename).name}, line {frames[-1].lineno})" if frames else ""


def _cwd() -> str:
    return os.getcwd()


def _on_path(directory: str) -> bool:
    return any(os.path.abspath(p or ".") == directory for p in sys.path)


def _import_module(module_name: str, target: str) -> ModuleType:
    """Import ``module_name``; if it (or its package) is missing, again with the current directory on the
    import path (first, as ``python -m`` puts it)."""
    cwd = _cwd()
    retried = False
    while True:
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            missing = e.name or ""
            if not (module_name == missing or module_name.startswith(missing + ".")):
                raise UnknownEnvironmentError(
                    f"cannot load environment {target!r}: module {module_name!r} was found, but it imports "
                    f"{missing!r}, which is not installed{_origin(e, cwd)}. Install it in this environment."
                ) from None
            if retried or _on_path(cwd):
                raise UnknownEnvironmentError(
                    f"cannot load environment {target!r}: no module {missing!r} in the current directory "
                    f"({cwd}) or among the installed packages. Run from the directory that holds it, pass "
                    f"the file instead (--env path/to/{module_name.replace('.', '/')}.py:Class), or install "
                    "its package."
                ) from None
            retried = True
            sys.path.insert(0, cwd)
            importlib.invalidate_caches()
        except Exception as e:
            raise UnknownEnvironmentError(
                f"cannot load environment {target!r}: importing {module_name!r} failed: "
                f"{type(e).__name__}: {e}{_origin(e, cwd)}"
            ) from None


def _load_file(where: str, target: str) -> ModuleType:
    """Load the Python file ``where`` as a module of its own (under a name derived from its full path, so
    that two files with the same name do not collide); loading it again returns the same module."""
    path = Path(where).expanduser()
    full = path.resolve()
    if not full.is_file():
        raise UnknownEnvironmentError(
            f"cannot load environment {target!r}: there is no file {full}"
            + ("" if path.is_absolute() else f" (the path is relative to the current directory, {_cwd()})")
            + ". Check the path, or pass a module as package.module:Class."
        )
    digest = hashlib.sha1(str(full).encode()).hexdigest()[:10]
    module_name = f"agentrl_env_file_{full.stem.replace('-', '_')}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    directory = str(full.parent)
    if not _on_path(directory):
        sys.path.insert(0, directory)  # its neighbours import as they would under ``python file.py``
    spec = importlib.util.spec_from_file_location(module_name, full)
    if spec is None or spec.loader is None:
        raise UnknownEnvironmentError(f"cannot load environment {target!r}: {full} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # before running it: dataclasses and pydantic look themselves up
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[module_name]
        if not isinstance(e, Exception):
            raise
        raise UnknownEnvironmentError(
            f"cannot load environment {target!r}: running {full} failed: {type(e).__name__}: {e}"
            f"{_origin(e, directory)}"
        ) from None
    return module


def _import_target(target: str) -> type[Environment]:
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise UnknownEnvironmentError(f"{target!r} is not of the form {FORMS}")
    module = _load_file(where, target) if is_file_target(target) else _import_module(where, target)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        found = sorted(n for n, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, Environment) and v.__module__ == module.__name__)
        what = f"{where} has no attribute {attr!r}" if cls is None else f"{attr} is not a subclass of agentrl.Environment"
        raise UnknownEnvironmentError(
            f"cannot load environment {target!r}: {what}. "
            + (f"Environments it defines: {', '.join(found)}." if found else "It defines no Environment subclass.")
        )
    return cls


def load_env(name: str, url: str | None = None, token: str | None = None) -> type[Environment]:
    """Resolve an environment class from a registered name, ``package.module:Class`` or
    ``path/to/file.py:Class``; with ``url``, environment ``name`` served by ``agentrl serve-env`` at
    ``url`` (a bound ``RemoteEnvironment``); ``openenv:<url>``: the environment of an OpenEnv server (a bound
    ``OpenEnvEnvironment``: its MCP tools, observations and rewards)."""
    if name.startswith("openenv:"):
        from agentrl.environment.openenv import PREFIX, OpenEnvEnvironment

        return OpenEnvEnvironment.bind(name[len(PREFIX):])
    if url:
        from agentrl.environment.remote import RemoteEnvironment

        return RemoteEnvironment.bind(url, token, env=name)
    if ":" in name:
        return _import_target(name)
    known = known_envs()
    if name not in known:
        hint = f" Did you mean {name}:ClassName?" if name.endswith(".py") else ""
        raise UnknownEnvironmentError(
            f"unknown environment {name!r}. Known environments: {', '.join(sorted(known))}. "
            f"An environment is {FORMS}.{hint}"
        )
    return _import_target(known[name])
