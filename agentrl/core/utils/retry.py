"""One retry policy for every network client of agentrl: bounded attempts, capped exponential backoff.

An attempt function raises :class:`Retry` (with what went wrong, and optionally the server's
``Retry-After``) for a failure worth retrying; any other exception goes straight to the caller. After the
last attempt :class:`RetriesExhausted` carries every attempt's error.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from agentrl.core.errors import AgentRLError

T = TypeVar("T")


# Not an AgentRLError, deliberately: a control-flow signal from an attempt to the policy's loop ("try
# again"), which never reaches a caller as such (the loop keeps it in ``RetriesExhausted.errors``).
class Retry(Exception):
    """Raised by an attempt: this failure is worth another try."""

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RetriesExhausted(AgentRLError):
    """Every attempt failed with a retryable error; ``errors`` holds them in order."""

    code = "retry.exhausted"

    def __init__(self, errors: list[Retry]) -> None:
        super().__init__(str(errors[-1]) if errors else "no attempt was made")
        self.errors = errors


@dataclass(frozen=True)
class RetryPolicy:
    """``max_retries`` retries after the first attempt, waiting ``backoff_s · 2^k`` (at most ``max_backoff_s``;
    a server's ``Retry-After`` is honoured up to the same cap) before retry ``k + 1``."""

    max_retries: int = 3
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        if retry_after_s is not None:
            return min(self.max_backoff_s, max(0.0, retry_after_s))
        return min(self.max_backoff_s, self.backoff_s * 2**attempt)

    async def run(self, attempt: Callable[[int], Awaitable[T]]) -> T:
        """``await attempt(k)`` for k = 0, 1, ... until it returns, raises a non-``Retry`` error, or the
        retries run out (``RetriesExhausted``)."""
        errors: list[Retry] = []
        for k in range(self.max_retries + 1):
            try:
                return await attempt(k)
            except Retry as e:
                errors.append(e)
                if k < self.max_retries:
                    await asyncio.sleep(self.delay(k, e.retry_after_s))
        raise RetriesExhausted(errors)

    def run_sync(self, attempt: Callable[[int], T]) -> T:
        """The blocking twin of :meth:`run` (for synchronous set-up calls)."""
        errors: list[Retry] = []
        for k in range(self.max_retries + 1):
            try:
                return attempt(k)
            except Retry as e:
                errors.append(e)
                if k < self.max_retries:
                    time.sleep(self.delay(k, e.retry_after_s))
        raise RetriesExhausted(errors)
