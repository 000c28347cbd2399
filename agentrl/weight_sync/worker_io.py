"""What every engine-side weight-sync method (:mod:`agentrl.engine`) shares: mapping the publisher's shared
memory, and the failure record a method returns instead of raising (a dict crosses vLLM's ``collective_rpc``
route as JSON; an exception would come back only as an HTTP 500 with its text). It stays in ``weight_sync``,
below the engine package, because the trainer maps the same segments (``agentrl.trainer.weights``) and the
record's codes are :mod:`agentrl.weight_sync.base`'s.

This module must import without vLLM and without torch at import time (the launcher imports the extension).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

from agentrl.core.errors import AgentRLError
from agentrl.weight_sync.base import BAD_REQUEST


def failure(code: str, message: str) -> dict[str, Any]:
    """A worker's failure record: ``code`` (:mod:`agentrl.weight_sync.base`) for the publisher to branch on,
    ``error`` for people."""
    return {"ok": False, "code": code, "error": message}


def failure_of(exc: Exception) -> dict[str, Any]:
    """The failure record of ``exc``: its own code when it is an agentrl error, else a bad request."""
    return failure(exc.code if isinstance(exc, AgentRLError) else BAD_REQUEST, str(exc))


def attach_segment(name: str, size: int) -> tuple[Any, Any]:
    """Map the segment ``name`` (read/write, no resource tracker: the publisher owns and unlinks it); the
    mapping and a uint8 tensor over it."""
    import torch

    path = f"/dev/shm/{name.lstrip('/')}"
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    return mm, torch.frombuffer(mm, dtype=torch.uint8)
