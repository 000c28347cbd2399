"""Engines that die, hang or fail a broadcast leave the rotation; engines that come back rejoin it only with
the current weights; a run with no engine left stops cleanly.

The inference client takes an endpoint out of rotation when a request or a broadcast to it fails
(:meth:`agentrl.inference.routing.EndpointPool.mark_down`); in-flight requests on it are retried on another
engine from their token prefix, and a group whose episodes still fail is recorded like any failed group.
:class:`EngineWatch` adds the two things the client cannot do alone:

- a health check (``GET /health`` every ``interval_s``) that takes an endpoint failing it
  ``failures_to_drop`` times in a row out of rotation (also the only one of a single-engine run), and
  notices when none has been in rotation for ``lost_after_s`` (:attr:`lost`); while none is, endpoints
  that answer again rejoin from the health loop itself;
- :meth:`rejoin`, called between training steps (when no weight update is running): an endpoint out of
  rotation that answers its health check again first receives the current adapter and version label
  (``republish``), then rejoins. A restarted engine therefore never serves stale weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from agentrl.core.errors import EngineError
from agentrl.inference.client import InferenceClient

log = logging.getLogger(__name__)


class EnginesLost(EngineError, RuntimeError):
    """No inference engine has been in rotation for the watch's grace period."""

    code = "inference.engines_lost"


class EngineWatch:
    """Health checks and rejoining for ``client``'s endpoints; run :meth:`run` as a task."""

    def __init__(self, client: InferenceClient, republish: Callable[[str, int], Awaitable[object]],
                 version: Callable[[], int], *, interval_s: float = 5.0, lost_after_s: float = 60.0,
                 health_timeout_s: float = 10.0, failures_to_drop: int = 3) -> None:
        self.client = client
        self.republish = republish
        self.version = version
        self.failures_to_drop = failures_to_drop
        """Consecutive failed health checks before an endpoint leaves the rotation (a busy CPU engine can
        miss one)."""
        self._failures: dict[str, int] = {}
        self.interval_s = interval_s
        self.lost_after_s = lost_after_s
        self.health_timeout_s = health_timeout_s
        self.lost = asyncio.Event()
        """Set when no endpoint has been in rotation for ``lost_after_s``."""
        self.rejoined = 0
        """Endpoints brought back so far."""
        self._none_since: float | None = None
        self._rejoining = asyncio.Lock()

    async def check(self) -> None:
        """One health round: unresponsive endpoints leave the rotation; :attr:`lost` is set once none has
        been in rotation for ``lost_after_s``."""
        pool = self.client.pool
        live = [e.url for e in pool.live]
        for url, ok in (await self.client.health(live, self.health_timeout_s)).items():
            self._failures[url] = 0 if ok else self._failures.get(url, 0) + 1
            if self._failures[url] >= self.failures_to_drop and pool.mark_down(url, "health check failed"):
                log.warning("inference endpoint %s out of rotation: %d health checks failed", url,
                            self._failures[url])
        if not pool.live:  # no weight update can reach an engine: bring back what answers again
            await self.rejoin(self.version())
        if pool.live:
            self._none_since = None
        elif self._none_since is None:
            self._none_since = time.monotonic()
        elif time.monotonic() - self._none_since >= self.lost_after_s:
            self.lost.set()

    async def run(self) -> None:
        """Health checks every ``interval_s`` until cancelled."""
        while True:
            with contextlib.suppress(Exception):  # a failed round is retried next time
                await self.check()
            await asyncio.sleep(self.interval_s)

    async def wait_back(self) -> list[str]:
        """A weight update found no engine in rotation: wait until one is back (brought back here, at
        ``version()``, as soon as one answers again, tried every ``interval_s``); the endpoints in rotation.
        The wait is bounded by the run, which stops once :attr:`lost` is set (none for ``lost_after_s``)."""
        while True:
            await self.rejoin(self.version())
            if self.client.pool.live:
                return [e.url for e in self.client.pool.live]
            await asyncio.sleep(self.interval_s)

    async def rejoin(self, version: int) -> list[str]:
        """Bring back every endpoint out of rotation that is healthy again, after giving it ``version``;
        returns those brought back. Call it when no weight update is in progress."""
        async with self._rejoining:
            return await self._rejoin(version)

    async def _rejoin(self, version: int) -> list[str]:
        back: list[str] = []
        down = [e.url for e in self.client.pool.endpoints if e.down is not None]
        if not down:
            return back
        healthy = await self.client.health(down, self.health_timeout_s)
        for url in down:
            if not healthy[url]:
                continue
            try:
                await self.republish(url, version)
            except Exception as e:  # still not ready: tried again at the next step
                log.warning("inference endpoint %s is healthy but could not receive version %d: %s",
                            url, version, e)
                continue
            self.client.pool.mark_up(url)
            self._failures[url] = 0
            self._none_since = None
            self.rejoined += 1
            back.append(url)
            log.warning("inference endpoint %s rejoined at version %d", url, version)
        return back

    def describe(self) -> str:
        """Each endpoint and why it is out of rotation."""
        return "; ".join(f"{e.url}: {e.down or 'in rotation'}" for e in self.client.pool.endpoints)
