"""Engine plumbing shared by the sandbox modules: client creation, errors, retries, worker threads.

``docker`` is imported lazily so that ``import agentrl.sandbox`` stays cheap and works without it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import os
import random
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from agentrl.core.errors import AgentRLError

log = logging.getLogger("agentrl.sandbox")
T = TypeVar("T")

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
PROVISION_HINT = "start one with sandbox/provision.sh or set DOCKER_HOST"


class SandboxError(AgentRLError, RuntimeError):
    """A sandbox operation failed (engine error, dead container, bad request)."""

    code = "sandbox"


class SandboxUnavailable(SandboxError):
    """No Docker engine can be reached."""

    code = "sandbox.unavailable"


class BadSandboxRequest(SandboxError, ValueError):
    """A call on a sandbox asks for something it cannot do: a path outside the workspace (or the workspace
    itself), a timeout or limit that is not positive."""

    code = "sandbox.bad_request"


class SandboxTooLarge(SandboxError, ValueError):
    """A file read or written, or an upload, exceeds its configured bound (``max_file_bytes``,
    ``max_upload_bytes``)."""

    code = "sandbox.too_large"


def docker_host(explicit: str | None = None) -> str:
    """The engine address in use: ``explicit``, else ``$DOCKER_HOST``, else the default socket."""
    return explicit or os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def make_client(host: str | None = None, timeout: float = 30.0, max_pool_size: int = 64) -> Any:
    """A ``docker.DockerClient`` for ``host`` that answered a ping; raises :class:`SandboxUnavailable`.

    ``timeout`` bounds every HTTP call made through the client (seconds).
    """
    addr = docker_host(host)
    try:
        import docker
    except ImportError as e:  # declared dependency, but be explicit about what is missing
        raise SandboxUnavailable(f"the `docker` Python package is missing ({e}): pip install docker") from e
    try:
        client = docker.DockerClient(base_url=addr, timeout=int(max(1, timeout)), max_pool_size=max_pool_size)
        client.ping()
    except Exception as e:
        raise SandboxUnavailable(f"no Docker engine reachable at {addr}: {PROVISION_HINT} ({e})") from e
    return client


def engine_reachable(host: str | None = None) -> tuple[bool, str]:
    """``(True, address)`` when an engine answers at ``host``; ``(False, reason)`` otherwise."""
    try:
        make_client(host, timeout=5).close()
    except SandboxUnavailable as e:
        return False, str(e)
    return True, docker_host(host)


def is_transient(exc: BaseException) -> bool:
    """Whether an engine error is worth retrying: 5xx API errors (not 'conflict'), connection errors."""
    try:
        import docker.errors
        import requests.exceptions
    except ImportError:
        return False
    if isinstance(exc, docker.errors.NotFound):
        return False
    if isinstance(exc, docker.errors.APIError):
        code = exc.status_code or 0
        return code >= 500 and "is not running" not in str(exc)
    return isinstance(exc, requests.exceptions.ConnectionError | requests.exceptions.Timeout | ConnectionError)


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` means the engine itself is unreachable (as opposed to an API error)."""
    try:
        import requests.exceptions
    except ImportError:
        return False
    return isinstance(exc, requests.exceptions.ConnectionError | ConnectionRefusedError | FileNotFoundError)


def retry(fn: Callable[[], T], attempts: int = 3, backoff_s: float = 0.2, what: str = "docker call") -> T:
    """Call ``fn`` (blocking), retrying transient engine errors with jittered exponential backoff; at most
    ``attempts`` calls (one at least)."""
    i = 0
    while True:  # ends with the first success, or by raising the last attempt's error
        try:
            return fn()
        except Exception as e:
            if i >= attempts - 1 or not is_transient(e):
                raise
            delay = backoff_s * (2**i) * (0.5 + random.random())
            log.warning("%s failed (%s); retry %d/%d in %.2fs", what, e, i + 1, attempts - 1, delay)
            time.sleep(delay)
            i += 1


# Blocking SDK calls run in a dedicated pool: asyncio's default executor has min(32, cpus + 4)
# workers, which would serialise 32 concurrent sandboxes on a small machine and starve the host app.
_EXECUTOR = ThreadPoolExecutor(max_workers=int(os.environ.get("AGENTRL_SANDBOX_THREADS", "96")),
                               thread_name_prefix="agentrl-sandbox")


async def to_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Like :func:`asyncio.to_thread`, on the sandbox worker pool (context variables preserved)."""
    ctx = contextvars.copy_context()
    call = functools.partial(ctx.run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, call)
