"""Installing agentrl's vLLM patches in an engine's worker process, once, and what came of it.

:mod:`agentrl.engine.extension` calls :func:`install_in_worker` when vLLM imports it in a worker, before any
adapter or model loads. A version refusal (:class:`agentrl.engine.version_gate.VLLMVersionRefused`) installs
nothing; the worker methods that need the patches (decorated with :func:`needs_patches`) then answer with its
failure record ``{"ok": False, "code": "inference.vllm_version_refused", "error": ...}`` instead of running.
Any other failure (vLLM's layout changed under an override) is printed and the methods run as far as they can,
as before the version contract existed. Outside a worker nothing is attempted and every method runs.

This module must import without vLLM and torch (the launcher imports the extension to check it).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agentrl.engine import vllm_patches
from agentrl.engine.version_gate import VLLMVersionRefused
from agentrl.weight_sync.worker_io import failure_of

REGISTRY: dict[str, tuple[int, str]] = {}
"""lora_name -> (lora_int_id, lora_path) of every adapter this worker loaded (filled by patch 1)."""
STATS: dict[str, float] = {"file_loads": 0.0}
"""``file_loads`` count and ``last_file_load_ms``: the worker-side time of the last load from disk (patches 1-2);
``cpu_lora_fast``: 1.0 where the CPU LoRA fast path is installed (patch 17); ``cpu_lora_native``: 1.0 where it
serves several slots with agentrl's built kernel (:mod:`agentrl.engine.native_lora`)."""

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Installed:
    """What came of installing the patches in this process."""

    attempted: bool = False
    refused: VLLMVersionRefused | None = None
    """Set when the version gate refused: nothing was installed."""
    error: str = ""
    """Another failure (vLLM's layout changed): printed; updates by adapter int id still work."""


OUTCOME = Installed()
"""This process's outcome (tests replace it)."""


def install_in_worker(outcome: Installed | None = None) -> Installed:
    """Install the patches once (the version gate first); record and print a refusal or failure, never raise."""
    outcome = OUTCOME if outcome is None else outcome
    if outcome.attempted:
        return outcome
    outcome.attempted = True
    try:
        from agentrl.engine.adapter_labels import forget_lora_id
        from agentrl.engine.adapter_plan import RELEASE_HOOKED, release_slot
        from agentrl.engine.capture import RouterTap

        vllm_patches.install_patches(REGISTRY, STATS, RouterTap.attach, [release_slot],
                                     [lambda _manager, lora_id: forget_lora_id(REGISTRY, lora_id)])
        RELEASE_HOOKED[0] = True
    except VLLMVersionRefused as exc:
        outcome.refused = exc
        print(f"agentrl.engine: vLLM patches refused: {exc}", file=sys.stderr)
    except Exception as exc:  # pragma: no cover - a vLLM layout change; updates by int id still work
        outcome.error = repr(exc)
        print(f"agentrl.engine: vLLM hooks not installed: {exc!r}", file=sys.stderr)
    return outcome


def refusal() -> dict[str, Any] | None:
    """The failure record of this process's version refusal, or None when the patches were not refused."""
    return None if OUTCOME.refused is None else failure_of(OUTCOME.refused)


def needs_patches(method: F) -> F:
    """A worker method that answers with :func:`refusal`'s record, instead of running, when the patches it
    relies on were refused."""

    @functools.wraps(method)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        refused = refusal()
        return refused if refused is not None else method(self, *args, **kwargs)

    return gated  # type: ignore[return-value]
