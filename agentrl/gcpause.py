"""Garbage-collector pauses: measured, so that they are never charged to an agent, and kept short.

A full (generation 2) collection stops every thread of the process while it scans the heap. In a
process that has imported torch and transformers that heap holds a few hundred thousand objects, and a
collection took 0.48 s with 256 episodes in flight. A tool call that happened to run across it was
charged the 0.48 s, and a tight agent time limit ended a well-behaved episode as ``timeout``.

Two remedies, both here:

- :func:`paused_s` is the process's running total of seconds spent in full collections; a tool's time
  is measured as its wall time minus the full collections that ran meanwhile (see ``run_sync_tool``).
- :func:`freeze_heap` moves every object alive after start-up (modules, tokenizer, configs) to the
  permanent generation, so that later collections never scan them again: the same 0.48 s collection
  took 0.03 s after it.
"""

from __future__ import annotations

import gc
import threading
import time
from typing import Any

FULL = 2
"""Only full collections are counted: the young generations are collected every few thousand
allocations in a few milliseconds each, and a tool that sleeps or waits on I/O across one was not held
up by it. A tool that waits on I/O across a full collection is under-charged by at most its length."""

_lock = threading.Lock()
_total_s = 0.0
_started: float | None = None
_installed = False


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _started, _total_s
    # Collections run with the interpreter lock held, one at a time: no lock is needed here.
    if info.get("generation") != FULL:
        return
    if phase == "start":
        _started = time.perf_counter()
    elif _started is not None:
        _total_s += time.perf_counter() - _started
        _started = None


def install() -> None:
    """Start counting collection time (idempotent; cheap: two clock reads per collection)."""
    global _installed
    if _installed:
        return
    with _lock:
        if not _installed:
            gc.callbacks.append(_on_gc)
            _installed = True


def paused_s() -> float:
    """Seconds this process has spent in full garbage collections since :func:`install` (0.0 before)."""
    return _total_s


def freeze_heap() -> int:
    """Collect once, then exclude every object alive now from later collections; returns how many.

    Call it once start-up is over (models, tokenizers and clients loaded), before the long-running loop.
    Frozen objects are still freed when their reference count drops to zero; only cycles among them
    outlive the freeze.
    """
    install()
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
