"""The version contract of agentrl's vLLM patches: they are installed only into the vLLM version they were
written for, unless the user overrides that explicitly.

A local build tag is ignored (``0.32.0+cpu`` is ``0.32.0``). On any other version,
:func:`check_vllm_version` raises :class:`VLLMVersionRefused` unless the engine's environment sets
``AGENTRL_ALLOW_VLLM_VERSION`` (:data:`ALLOW_ENV`) to the running version, or to ``any``; the worker
extension then installs no patch and answers every method that needs them with the failure record
``{"ok": False, "code": "inference.vllm_version_refused", "error": <the message>}``.

This module imports vLLM only inside :func:`running_vllm_version`.
"""

from __future__ import annotations

import logging
import os

from agentrl.core.errors import EngineError

ALLOW_ENV = "AGENTRL_ALLOW_VLLM_VERSION"
"""Environment variable (read in the engine's process) that lets the patches into another vLLM: the running
version (its local tag such as ``+cpu`` may be left out), or ``any``."""
VLLM_VERSION_REFUSED = "inference.vllm_version_refused"
"""The code of a refusal, in :class:`VLLMVersionRefused` and in the failure records of the worker methods."""

log = logging.getLogger(__name__)


class VLLMVersionRefused(EngineError, RuntimeError):
    """The running vLLM is not the version agentrl's patches were written for, and no override allows it:
    the patches are not installed (the message names both versions and the override)."""

    code = VLLM_VERSION_REFUSED


def base_version(version: str) -> str:
    """``version`` without its local build tag: ``"0.32.0+cpu"`` -> ``"0.32.0"``."""
    return version.strip().split("+", 1)[0]


def running_vllm_version() -> str:
    """The installed vLLM's version, or ``"unknown"`` when it cannot be read."""
    try:
        from vllm.version import __version__
    except Exception:  # refused below unless overridden with "any"
        return "unknown"
    return str(__version__)


def check_vllm_version(written_for: str, running: str | None = None, allow: str | None = None) -> str:
    """The running vLLM's version (``running``, read when None) if the patches written for ``written_for``
    may be installed into it: the same version (local tags ignored), or one that ``allow`` (default: the
    :data:`ALLOW_ENV` environment variable) names, or ``allow == "any"``. Raises
    :class:`VLLMVersionRefused` otherwise. An override that lets a version in is logged as a warning."""
    running = running_vllm_version() if running is None else str(running)
    if base_version(running) == base_version(written_for):
        return running
    allow = os.environ.get(ALLOW_ENV, "") if allow is None else allow
    allow = allow.strip()
    if allow == "any" or (allow and base_version(allow) == base_version(running)):
        log.warning("agentrl's vLLM patches were written for vLLM %s; installing them into vLLM %s because "
                    "%s=%s", written_for, running, ALLOW_ENV, allow)
        return running
    why = f" ({ALLOW_ENV}={allow} names another version)" if allow else ""
    override = f"{ALLOW_ENV}=any" if running == "unknown" else \
        f"{ALLOW_ENV}={base_version(running)} (or {ALLOW_ENV}=any)"
    raise VLLMVersionRefused(
        f"agentrl's vLLM patches (agentrl/engine/vllm_patches.py) were written for vLLM {written_for}, but this "
        f"engine runs vLLM {running}: they are not installed{why}, so this engine refuses in-place adapter "
        f"updates, full-weight loads and MoE routing capture. Install vllm=={written_for}, or, once you have "
        f"checked the patches against vLLM {running}, start the engine with {override} in its environment.")
