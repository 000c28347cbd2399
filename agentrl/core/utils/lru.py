"""A bounded least-recently-used cache over an ``OrderedDict``: the lookup the caches of the chat format and
the tool-call parser share."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


def lru_get(cache: OrderedDict[K, V], key: K, limit: int, make: Callable[[], V]) -> V:
    """``cache[key]``, made with ``make()`` on a miss; the least recently used entries beyond ``limit`` go."""
    value = cache.get(key)
    if value is None:
        value = cache[key] = make()
        while len(cache) > limit:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    return value
