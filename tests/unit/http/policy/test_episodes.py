"""The policy endpoint's book of episodes: open and kept bounds, retired keys, and per-call work that does
not grow with the episodes it has seen."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from agentrl.http.errors import ApiError
from agentrl.http.policy.episodes import EpisodeBook


def test_open_and_kept_bounds_and_retired_keys() -> None:
    book = EpisodeBook(ttl_s=60, max_open=2, max_kept=2)
    (a, ka), (b, _) = book.create(), book.create()
    with pytest.raises(ApiError, match="episode limit reached"):
        book.create()
    book.finish(a, "ended", reward=1.0)
    assert book.open_count == 1
    c, kc = book.create()
    for ep in (b, c):
        book.finish(ep, "ended", reward=0.0)
    # three finished, two kept: the first to finish is forgotten and its key retired
    assert list(book.episodes) == [b.id, c.id] and book.open_count == 0
    with pytest.raises(ApiError, match="expired: its episode is over"):
        book.by_key(ka)
    with pytest.raises(ApiError, match="no episode"):
        book.get(a.id)
    assert book.key_episode(kc) is c and book.get(c.id).reward == 0.0
    book.finish(c, "closed")  # idempotent once over
    assert c.status == "ended"


class _NoScan(OrderedDict):
    """The book's episodes, refusing to be walked: a walk per call would cost more as the book grows."""

    def _walk(self, *_: object) -> None:
        raise AssertionError("the book walked all its episodes")

    __iter__ = values = items = keys = _walk  # type: ignore[assignment]


def test_creating_finding_and_ending_episodes_never_walks_the_book() -> None:
    book = EpisodeBook(ttl_s=60, max_open=10, max_kept=3)
    book.episodes = _NoScan(book.episodes)
    for _ in range(20):
        ep, key = book.create()
        assert book.by_key(key) is ep and book.get(ep.id) is ep
        book.finish(ep, "ended", reward=1.0)
    assert len(book.episodes) == 3 and book.open_count == 0


def test_an_ended_or_expired_episode_releases_its_engine_binding() -> None:
    """The service's engine client keeps an episode's calls on one engine by the episode's id; the binding is
    dropped as the episode ends, whether it is rewarded, closed or expires."""
    from agentrl.config.policy import PolicyConfig
    from agentrl.http.policy.service import PolicyService
    from tests.unit.http.policy.scripted import Scripted, scripted_chat

    chat = scripted_chat()
    engine = Scripted(chat, [])
    forgotten: list[str] = []
    engine.forget = forgotten.append  # type: ignore[attr-defined]
    book = PolicyService(PolicyConfig(token="t" * 32, episode_ttl_s=60), engine, chat).book
    (a, _), (b, _) = book.create(), book.create()
    book.finish(a, "ended", reward=1.0)
    book.expire(b)
    book.finish(a, "closed")  # already over: not released twice
    assert forgotten == [a.id, b.id]


def test_retired_keys_are_bounded() -> None:
    """A long-lived endpoint remembers only the newest retired keys: the oldest of them reads as unknown."""
    from agentrl.http.policy.episodes import RETIRED_PER_KEPT

    book = EpisodeBook(ttl_s=60, max_open=10, max_kept=1)
    keys = []
    for _ in range(RETIRED_PER_KEPT + 3):
        ep, key = book.create()
        book.finish(ep, "ended", reward=1.0)
        keys.append(key)
    assert len(book._retired) == RETIRED_PER_KEPT
    with pytest.raises(ApiError, match="expired: its episode is over"):
        book.by_key(keys[-2])  # retired recently
    with pytest.raises(ApiError, match="invalid API key"):
        book.by_key(keys[0])  # retired long ago: forgotten
