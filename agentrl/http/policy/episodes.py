"""External episodes: each with its own API key, its rows, its reward, and a TTL.

An episode is ``open`` until it gets a reward (``ended``), is closed by the run (``closed``), or stays
silent longer than the TTL (``expired``: recorded as failed). Its key works only while it is open; the
rows stay readable (up to ``max_kept_episodes`` finished episodes, oldest forgotten first).
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentrl.http.errors import ApiError
from agentrl.http.policy.rows import Row


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


@dataclass
class PolicyEpisode:
    """One external episode (see the module docstring)."""

    id: str
    task_id: str = ""
    group_id: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    temperature: float | None = None
    """Sample this episode's calls at this temperature (a run's evaluation episodes); None: the endpoint's."""
    status: str = "open"
    """open, ended (rewarded), expired (TTL: failed) or closed (by the run: see ``error``)."""
    reward: float | None = None
    error: str | None = None
    rows: list[Row] = field(default_factory=list)
    calls: int = 0
    failed_calls: int = 0
    created: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def open(self) -> bool:
        return self.status == "open"

    @property
    def transcript(self) -> list[dict[str, Any]]:
        """The conversation of the last call (its messages and the answer), in normal form."""
        return list(self.rows[-1].messages) if self.rows else []

    def trajectory(self) -> dict[str, Any]:
        """``GET /v1/episodes/{id}/trajectory``: every row, each with the episode's reward."""
        return {"episode_id": self.id, "task_id": self.task_id, "status": self.status, "reward": self.reward,
                "error": self.error, "calls": self.calls,
                "rows": [{**r.as_dict(), "reward": self.reward} for r in self.rows]}


RETIRED_PER_KEPT = 10
"""Retired keys remembered per kept episode: an agent still using a key that old hears that its episode is over;
one older still hears that the key is unknown (a long-lived endpoint's memory stays bounded)."""


class EpisodeBook:
    """Every episode of an endpoint, by id and by key (keys are kept hashed). Creating, finding and ending an
    episode cost the same however many episodes the book holds."""

    def __init__(self, ttl_s: float, max_open: int, max_kept: int) -> None:
        self.ttl_s = ttl_s
        self.max_open = max_open
        self.max_kept = max_kept
        self.episodes: OrderedDict[str, PolicyEpisode] = OrderedDict()
        self._keys: dict[str, str] = {}
        self._digests: dict[str, str] = {}  # episode id -> its key's digest
        self._open: dict[str, PolicyEpisode] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()  # in the order they finished
        self._retired: OrderedDict[str, None] = OrderedDict()  # the newest RETIRED_PER_KEPT * max_kept
        self.expired = 0
        self.on_finish: Callable[[PolicyEpisode], None] | None = None
        """Called with each episode as it ends (the service releases its engine binding)."""

    @property
    def open_count(self) -> int:
        return len(self._open)

    def create(self, *, task_id: str = "", group_id: str = "", meta: dict[str, Any] | None = None,
               temperature: float | None = None) -> tuple[PolicyEpisode, str]:
        """A new open episode and its key (``temperature``: see :attr:`PolicyEpisode.temperature`); HTTP 429 past
        ``max_open``."""
        if self.open_count >= self.max_open:
            raise ApiError(429, f"episode limit reached ({self.max_open} open episodes); end some or retry later",
                           headers={"Retry-After": "1"})
        ep = PolicyEpisode(id=uuid.uuid4().hex, task_id=task_id, group_id=group_id, meta=dict(meta or {}),
                           temperature=temperature)
        key = "ep-" + secrets.token_urlsafe(32)
        self.episodes[ep.id] = self._open[ep.id] = ep
        self._keys[d := _digest(key)] = ep.id
        self._digests[ep.id] = d
        return ep, key

    def by_key(self, key: str) -> PolicyEpisode:
        """The open episode of ``key``; HTTP 401 for an unknown key or one whose episode is over."""
        d = _digest(key)
        ep_id = self._keys.get(d)
        ep = self.episodes.get(ep_id) if ep_id else None
        if ep is not None and ep.open and not self._stale(ep):
            return ep
        if ep is not None and ep.open:
            self.expire(ep)
        if ep is not None or d in self._retired:
            raise ApiError(401, "this episode's API key has expired: its episode is over (rewarded, closed or past "
                                "its TTL); create a new episode", headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        raise ApiError(401, "invalid API key: use the api_key of an episode (POST /v1/episodes)",
                       headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})

    def key_episode(self, key: str) -> PolicyEpisode | None:
        """The episode a key belongs to, open or not (None for an unknown key)."""
        ep_id = self._keys.get(_digest(key))
        return self.episodes.get(ep_id) if ep_id else None

    def get(self, episode_id: str) -> PolicyEpisode:
        ep = self.episodes.get(episode_id)
        if ep is None:
            raise ApiError(404, f"no episode {episode_id[:80]!r} (unknown, or forgotten after it finished)")
        return ep

    def _stale(self, ep: PolicyEpisode) -> bool:
        return time.monotonic() - ep.last_seen > self.ttl_s and not ep.lock.locked()

    def finish(self, ep: PolicyEpisode, status: str, *, reward: float | None = None, error: str | None = None) -> None:
        """End an open episode (idempotent once over: the first ending stands)."""
        if not ep.open:
            return
        ep.status, ep.reward, ep.error = status, reward, error
        ep.done.set()
        del self._open[ep.id]
        self._finished[ep.id] = None
        self._forget_old()
        if self.on_finish is not None:
            self.on_finish(ep)

    def expire(self, ep: PolicyEpisode) -> None:
        self.expired += 1
        self.finish(ep, "expired", error=f"TimeoutError: no call and no reward for {self.ttl_s:g}s (TTL): the agent "
                                           "never ended its episode")

    def sweep(self) -> int:
        """Expire open episodes idle past the TTL; returns how many."""
        stale = [e for e in self._open.values() if self._stale(e)]
        for e in stale:
            self.expire(e)
        return len(stale)

    def next_deadline_s(self) -> float:
        """Seconds until the next episode could expire (for the sweeper's sleep)."""
        now = time.monotonic()
        left = [e.last_seen + self.ttl_s - now for e in self._open.values()]
        return max(0.05, min(left, default=math.inf))

    def _forget_old(self) -> None:
        """Forget the finished episodes past ``max_kept``, oldest finished first; their keys are retired (an
        agent still using one hears that its episode is over)."""
        while len(self._finished) > self.max_kept:
            ep_id, _ = self._finished.popitem(last=False)
            del self.episodes[ep_id]
            d = self._digests.pop(ep_id)
            del self._keys[d]
            self._retired[d] = None
            while len(self._retired) > RETIRED_PER_KEPT * self.max_kept:
                self._retired.popitem(last=False)
