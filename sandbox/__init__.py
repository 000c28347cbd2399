"""Docker-sandboxed tools for agentrl (installed as ``agentrl.sandbox``).

* :class:`DockerSandbox` / :class:`SandboxConfig`: one hardened, single-use container with bounded ``exec``,
  ``read_file``/``write_file``/``upload``; safe defaults (no network, read-only root, no capabilities,
  no-new-privileges, default seccomp, pids/memory/CPU caps, non-root user, self-expiring container).
* :class:`SandboxPool`: warm pool (sandboxes in milliseconds, each used once), concurrency limit, retries.
* :func:`gc` / :func:`cleanup_on_start`: remove containers of dead drivers, expired ones, or one owner's.
* :func:`build_image`: offline build of the default image ``agentrl-sandbox:<recipe hash>``.

The engine comes from ``$DOCKER_HOST`` (``sandbox/provision.sh`` starts one). Threat model: docs/sandbox.md.
Importing this package does not import ``docker``; names are resolved lazily.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import gc as _gc_module
from ._engine import BadSandboxRequest, SandboxError, SandboxTooLarge, SandboxUnavailable, engine_reachable
from ._util import UploadNotADirectory
from .config import ExecResult, SandboxConfig, SandboxConfigError

# The submodule ``gc`` would otherwise shadow the function of the same name on this package.
gc = _gc_module.gc
cleanup_on_start = _gc_module.cleanup_on_start

if TYPE_CHECKING:
    from .docker_sandbox import DockerSandbox, SandboxFileNotFound
    from .image import build_image, default_tag
    from .pool import SandboxPool

_LAZY = {
    "DockerSandbox": "docker_sandbox",
    "SandboxFileNotFound": "docker_sandbox",
    "SandboxPool": "pool",
    "build_image": "image",
    "default_tag": "image",
}

__all__ = [
    "BadSandboxRequest",
    "DockerSandbox",
    "ExecResult",
    "SandboxConfig",
    "SandboxConfigError",
    "SandboxError",
    "SandboxFileNotFound",
    "SandboxPool",
    "SandboxTooLarge",
    "SandboxUnavailable",
    "UploadNotADirectory",
    "build_image",
    "cleanup_on_start",
    "default_tag",
    "engine_reachable",
    "gc",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
