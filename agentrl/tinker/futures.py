"""Request results, polled by the SDK with ``POST /api/v1/retrieve_future``. Every accepted request gets a
request id at once; its result (a protobuf body or a JSON object) or its failure (a message and the SDK's
error category) is stored under it. A poll waits for the result up to a long-poll limit and otherwise answers
"try again"; a request id of another owner is not found."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from agentrl.tinker.errors import TinkerError, TinkerNotFound

LONG_POLL_S = 25.0
"""How long one poll waits for a pending result (the SDK gives a poll 45 s before it calls it a timeout)."""
KEPT_RESULTS = 4096
"""Finished results kept; the oldest are forgotten first."""


@dataclass
class Future:
    """One request's result, pending until ``done`` is set."""

    request_id: str
    owner: str
    kind: str
    """What the request was (``forward_backward``, ``sample``, ...): for logs and errors."""
    created: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    proto: bytes | None = None
    """A protobuf result (forward/backward and sampling answers)."""
    json: dict[str, Any] | None = None
    """A JSON result (every other answer)."""
    error: str | None = None
    category: str = "server"
    extra: dict[str, Any] = field(default_factory=dict)
    """What the request's first answer carries beside the id (``sample_sequence_ids``, ``model_id``)."""


class Futures:
    """The results of every request, by request id."""

    def __init__(self, kept: int = KEPT_RESULTS) -> None:
        self._items: OrderedDict[str, Future] = OrderedDict()
        self.kept = kept

    def create(self, owner: str, kind: str) -> Future:
        fut = Future(request_id=f"{kind}-{uuid.uuid4().hex}", owner=owner, kind=kind)
        self._items[fut.request_id] = fut
        self._forget_old()
        return fut

    def _forget_old(self) -> None:
        while len(self._items) > self.kept:
            oldest = next((rid for rid, f in self._items.items() if f.done.is_set()), None)
            if oldest is None:
                return
            del self._items[oldest]

    def get(self, request_id: str, owner: str) -> Future:
        fut = self._items.get(request_id)
        if fut is None or fut.owner != owner:
            raise TinkerNotFound(f"no request {request_id!r} for this API key (results are kept for the last "
                                 f"{self.kept} requests)")
        return fut

    @staticmethod
    def succeed(fut: Future, *, proto: bytes | None = None, json: dict[str, Any] | None = None) -> None:
        fut.proto, fut.json = proto, json
        fut.done.set()

    @staticmethod
    def fail(fut: Future, error: BaseException | str, category: str | None = None) -> None:
        if isinstance(error, TinkerError):
            fut.error, fut.category = str(error), category or error.category
        else:
            fut.error = str(error) if isinstance(error, str) else f"{type(error).__name__}: {error}"
            fut.category = category or "server"
        fut.done.set()

    async def wait(self, request_id: str, owner: str, timeout_s: float = LONG_POLL_S) -> Future | None:
        """The finished future, or None when it is still pending after ``timeout_s`` (answer "try again")."""
        fut = self.get(request_id, owner)
        try:
            await asyncio.wait_for(fut.done.wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return fut
