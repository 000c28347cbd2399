"""Hidden-number tasks, their splits, the guess budget, the reward rule and the binary-search oracle.

A task hides an integer ``target`` in a range ``low..high`` of 100 to 250 numbers (``low`` in 1..900). Its
budget is the most guesses binary search can need, ``bit_length(high - low + 1)`` (7 for 100 numbers, 8 for
128 or more); an episode may make ``budget + EXTRA_GUESSES`` guesses.

Split rule (train and test are disjoint by construction): a task is identified by ``(low, high, target)``; it
belongs to ``"test"`` iff ``sha256("<low>:<high>:<target>")`` taken modulo 10 is 0, and to ``"train"``
otherwise. Within a split, tasks are drawn with a ``random.Random`` seeded by the split and de-duplicated.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from agentrl.environment.tasks import TaskSourceError

WIDTHS = (100, 250)
"""The fewest and the most numbers a range holds."""
LOWS = (1, 900)
"""Where a range may start."""
EXTRA_GUESSES = 5
"""Guesses an episode may make beyond its budget, each worth 0.1 less reward."""
PENALTY = 0.1
"""Reward lost per guess beyond the budget."""


def budget(low: int, high: int) -> int:
    """The most guesses binary search needs for ``low..high``: any strategy's worst case can be no better."""
    return (high - low + 1).bit_length()


def max_guesses(low: int, high: int) -> int:
    """Guesses an episode on ``low..high`` may make: its budget and ``EXTRA_GUESSES`` more."""
    return budget(low, high) + EXTRA_GUESSES


def score(low: int, high: int, found_at: int | None) -> float:
    """The reward for finding the target with guess number ``found_at`` (None: not found): 1.0 within the
    budget, then ``PENALTY`` less per extra guess (0.5 at the last allowed guess); 0.0 when not found."""
    if found_at is None or found_at > max_guesses(low, high):
        return 0.0
    return round(1.0 - PENALTY * max(0, found_at - budget(low, high)), 6)


def binary_search(low: int, high: int, target: int) -> list[int]:
    """The guesses of binary search (the middle, rounded down) until it hits ``target``."""
    guesses = []
    while True:
        mid = (low + high) // 2
        guesses.append(mid)
        if mid == target:
            return guesses
        low, high = (mid + 1, high) if mid < target else (low, mid - 1)


def split_of(low: int, high: int, target: int) -> str:
    """The split a task belongs to: ``"test"`` for about 10% of (low, high, target) keys, else ``"train"``."""
    digest = hashlib.sha256(f"{low}:{high}:{target}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") % 10 == 0 else "train"


def make_tasks(split: str, n: int) -> list[dict[str, Any]]:
    """``n`` distinct tasks of ``split`` ("train" or "test"): ``{"id": "guess-<split>-<i>", "low", "high",
    "target"}``, deterministic."""
    if split not in ("train", "test"):
        raise TaskSourceError(f"unknown split {split!r}; expected 'train' or 'test'")
    rng = random.Random(f"guess:{split}")
    seen: set[tuple[int, int, int]] = set()
    tasks: list[dict[str, Any]] = []
    while len(tasks) < n:
        low = rng.randint(*LOWS)
        high = low + rng.randint(*WIDTHS) - 1
        key = (low, high, rng.randint(low, high))
        if key in seen or split_of(*key) != split:
            continue
        seen.add(key)
        tasks.append({"id": f"guess-{split}-{len(tasks)}", "low": low, "high": high, "target": key[2]})
    return tasks
