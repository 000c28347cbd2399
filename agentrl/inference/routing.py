"""Endpoint selection for the inference client: least outstanding requests, sticky keys.

A training episode is sticky: its first request picks an engine and its later turns stay there (its
prefix cache), so a pick places a whole episode. The default rule counts requests in flight (ties rotate).
The alternative, ``by="tokens"``, counts each request's prompt plus ``max_tokens``, on the idea that a few
20k-token contexts load an engine more than many short ones. Measured in the pipeline simulator (which
drives this class) on multi-turn mixes over 8 or 16 engines, it never won: up to 5 % slower, and 5-15 % with a
bounded KV cache: an engine holding old long contexts looks loaded though those episodes are about to end,
one full of young episodes looks light though they will grow (``docs/async.md``, *Dispatch to engines*).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from agentrl.core.errors import ConfigError
from agentrl.inference.wire import NoEnginesError


class PoolConfigError(ConfigError, ValueError):
    """The endpoints given to the pool, or its dispatch rule (``by``), cannot be used."""

    code = "config.endpoint_pool"


@dataclass
class Endpoint:
    """One server and what the client knows about it."""

    url: str
    outstanding: int = 0
    """Requests in flight."""
    outstanding_tokens: int = 0
    """Tokens of the requests in flight: prompt plus ``max_tokens`` of each (what ``by="tokens"`` counts)."""
    mode: str | None = None  # "generate" | "completions" once detected
    down: str | None = None
    """Why the endpoint is out of rotation (None: in rotation). See :meth:`EndpointPool.mark_down`."""
    left: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the endpoint leaves the rotation (a fresh one when it returns): requests in flight there
    watch it, and are abandoned, to be retried elsewhere, rather than wait on an engine that is gone."""

    def begin(self, cost: int) -> None:
        """A request of ``cost`` tokens (prompt plus ``max_tokens``) was sent here."""
        self.outstanding += 1
        self.outstanding_tokens += cost

    def end(self, cost: int) -> None:
        """A request counted by :meth:`begin` answered or failed."""
        self.outstanding -= 1
        self.outstanding_tokens -= cost


class EndpointPool:
    """Least-loaded selection with optional sticky keys (pure logic, no I/O).

    ``by``: the load that decides, ``"requests"`` (in flight; default; ties rotate) or ``"tokens"`` (their
    prompt plus ``max_tokens``; ties go to fewer requests, then rotate).
    """

    def __init__(self, urls: Iterable[str], max_keys: int = 65536, by: Literal["requests", "tokens"] = "requests") -> None:
        self.endpoints = [Endpoint(u.rstrip("/")) for u in urls]
        if not self.endpoints:
            raise PoolConfigError("InferenceClient needs at least one endpoint")
        if by not in ("requests", "tokens"):
            raise PoolConfigError(f"by={by!r}: 'requests' or 'tokens'")
        self.by = by
        self._sticky: OrderedDict[str, Endpoint] = OrderedDict()
        self._max_keys = max_keys
        self._rr = 0

    def pick(self, key: str | None = None, avoid: Iterable[str] = ()) -> Endpoint:
        """The endpoint for a request: ``key``'s endpoint if it has one (and it is not in ``avoid``),
        else the least loaded one (see ``by``), then in rotation;
        ``key`` then sticks to it (its episode's next turns reuse that engine's prefix cache).
        :class:`~agentrl.inference.wire.NoEnginesError` when every endpoint is out of rotation."""
        avoid = set(avoid)
        if key is not None and (ep := self._sticky.get(key)) is not None and ep.url not in avoid and not ep.down:
            self._sticky.move_to_end(key)
            return ep
        live = self.live
        if not live:
            raise NoEnginesError("every inference endpoint is out of rotation: " + "; ".join(
                f"{e.url}: {e.down}" for e in self.endpoints))
        candidates = [e for e in live if e.url not in avoid] or live
        n = len(candidates)
        start = self._rr % n
        self._rr += 1
        ep = min((candidates[(start + i) % n] for i in range(n)), key=self._load)
        if key is not None:
            self._sticky[key] = ep
            self._sticky.move_to_end(key)
            while len(self._sticky) > self._max_keys:
                self._sticky.popitem(last=False)
        return ep

    def _load(self, e: Endpoint) -> tuple[int, int]:
        return (e.outstanding_tokens, e.outstanding) if self.by == "tokens" else (e.outstanding, 0)

    @property
    def live(self) -> list[Endpoint]:
        """The endpoints in rotation."""
        return [e for e in self.endpoints if not e.down]

    def mark_down(self, url: str, reason: str) -> bool:
        """Take ``url`` out of rotation (its weights may be stale or it does not answer): no request or
        broadcast goes there until :meth:`mark_up`. Returns whether it was in rotation."""
        ep = next(e for e in self.endpoints if e.url == url)
        was = ep.down is None
        ep.down = reason or "out of rotation"
        ep.left.set()
        return was

    def mark_up(self, url: str) -> None:
        """Put ``url`` back in rotation (after it received the current weights)."""
        ep = next(e for e in self.endpoints if e.url == url)
        if ep.down is not None:
            ep.down, ep.left = None, asyncio.Event()

    def forget(self, key: str) -> None:
        """Drop ``key``'s binding (e.g. when its episode ends)."""
        self._sticky.pop(key, None)
