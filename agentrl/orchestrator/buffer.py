"""The bounded, staleness-aware rollout buffer of the async mode (pure asyncio, no torch).

Producers (rollout workers) call ``admit()`` before starting a GRPO group and ``put()`` when it is
done (or ``release()`` if it was abandoned); the trainer calls ``get_batch(version)``. The buffer keeps no
version of its own: it reads the run's :class:`~agentrl.core.versions.PolicyVersion`, and a bump of it (the
weight update) wakes the producers waiting on the staleness bound.

Admission rule (η = ``max_staleness``, B = ``groups_per_step``, v = trainer version)::

    started + n <= (v + η + 1) * B,   started = in_flight + buffered + consumed

Why: batches are consumed B groups at a time, so (FIFO, nothing dropped) the k-th started group
(0-based) is trained in step ``k // B``, i.e. at trainer version ``k // B``. Its first token is at
least version v (the version at admission), so its staleness ``k // B - v`` is ≤ η iff
``k < (v + η + 1) * B``. With η = 0 this is the synchronous loop: only the current step's B groups
may be started, and the next step's groups wait for the new weights. Groups that complete out of
order can still overshoot: ``accept`` (the default) trains them anyway, earliest admitted first, and the
loss masks their tokens past ``pipeline.max_token_age``; ``drop_stale`` and ``block`` never return them (see
``drop_policy``).

All the bookkeeping lives in ``BufferCore``, a pure class (no asyncio, no clock) that the
discrete-event simulator in ``agentrl.tools.bench.pipeline`` drives too, so the benchmark exercises the
same admission and selection logic as training.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from agentrl.config.run import PipelineConfig
from agentrl.core.errors import AgentRLError
from agentrl.core.types import Trajectory
from agentrl.core.versions import PolicyVersion, group_staleness_version, staleness

T = TypeVar("T")


class BufferClosed(AgentRLError):
    """Raised in every waiter (and later caller) once the buffer is closed."""

    code = "orchestrator.buffer_closed"


class BufferStateError(AgentRLError, RuntimeError):
    """The buffer was told a group was abandoned while it holds none in flight (a driver bug)."""

    code = "orchestrator.buffer_state"


class OverCapacity(AgentRLError, ValueError):
    """More groups were asked to start at once than the buffer can ever hold (``capacity_groups``)."""

    code = "orchestrator.over_capacity"


class BufferCore(Generic[T]):
    """Admission, completion and batch selection bookkeeping; pure (no asyncio, no clock)."""

    def __init__(self, pipe: PipelineConfig, groups_per_step: int, version: PolicyVersion | None = None) -> None:
        self.policy = PolicyVersion() if version is None else version
        """The policy version's owner, read (never written) here."""
        self.groups_per_step = groups_per_step
        """B: GRPO groups per train batch."""
        self.capacity_groups = pipe.capacity(groups_per_step)  # raises while max_staleness is unresolved
        """Most groups in flight plus completed-but-unconsumed at once; producers block beyond (back-pressure)."""
        self.max_staleness: int = pipe.max_staleness  # type: ignore[assignment]  # resolved: capacity() checked
        """η: a trained group's oldest model token is at most this many versions behind the trainer."""
        self.drop_policy = pipe.drop_policy
        """``accept``: batches are the B completed groups admitted earliest, taken without waiting for groups
        still in flight, and nothing is dropped for staleness: η bounds a group's head at admission, and
        each token's age is capped in the loss (``pipeline.max_token_age``, applied by
        :func:`agentrl.orchestrator.samples.to_samples`). ``drop_stale``: batches are taken in completion
        order (FIFO); groups that went stale (completed too late, overtaken by faster ones) are dropped and
        counted. ``block``: batches are taken in admission-version order, so the trainer waits for
        straggling groups instead of dropping them; with the admission rule no group then goes stale (a stale
        one would still be dropped, never returned)."""
        self.start_version = self.policy.value
        """Version when counting began (a resumed run starts above 0); admission counts steps from it."""
        self.in_flight_by_version: Counter[int] = Counter()
        self.queue: deque[tuple[int, int, T]] = deque()
        """Completed groups in completion order: (version staleness is measured from, admission version, item)."""
        self.admitted = self.completed = self.consumed = self.released = 0
        self.dropped_stale = self.dropped_capacity = 0
        self.staleness_hist: Counter[int] = Counter()
        self.on_drop: Callable[[T], None] | None = None
        """Called with every dropped item (stale or evicted), so callers can count the work it held."""

    @property
    def version(self) -> int:
        """The current policy version (its owner's)."""
        return self.policy.value

    def _dropped(self, item: T) -> None:
        if self.on_drop is not None:
            self.on_drop(item)

    @property
    def in_flight(self) -> int:
        return sum(self.in_flight_by_version.values())

    @property
    def buffered(self) -> int:
        return len(self.queue)

    @property
    def started(self) -> int:
        """Groups counted against the staleness bound: in flight + buffered + consumed."""
        return self.in_flight + self.buffered + self.consumed

    def admission_limit(self) -> int:
        """Most groups that may have been started at the current version: (v - v₀ + η + 1) · B."""
        return (self.version - self.start_version + self.max_staleness + 1) * self.groups_per_step

    def can_admit(self, n: int = 1) -> bool:
        """Whether ``n`` more groups fit both the staleness bound and the capacity."""
        return (self.started + n <= self.admission_limit()
                and self.in_flight + self.buffered + n <= self.capacity_groups)

    def admit(self, n: int = 1) -> int:
        """Count ``n`` groups as started (caller checked ``can_admit``); returns the current version."""
        self.in_flight_by_version[self.version] += n
        self.admitted += n
        return self.version

    def _leave_flight(self, admitted_version: int | None, hint: int | None = None) -> int | None:
        """Remove one in-flight group, returning its admission version (None: none in flight).

        Without ``admitted_version``, guess: the newest ≤ ``hint``, else the oldest.
        """
        live = sorted(v for v, c in self.in_flight_by_version.items() if c > 0)
        if not live:
            return None
        v = admitted_version
        if v is None or self.in_flight_by_version[v] <= 0:
            below = [u for u in live if hint is not None and u <= hint]
            v = below[-1] if below else live[0]
        self.in_flight_by_version[v] -= 1
        if self.in_flight_by_version[v] <= 0:
            del self.in_flight_by_version[v]
        return v

    def release(self, admitted_version: int | None = None) -> None:
        """An admitted group was abandoned: free its slot."""
        if self._leave_flight(admitted_version) is None:
            raise BufferStateError("release() without a group in flight")
        self.released += 1

    def complete(self, item: T, oldest: int | None, admitted_version: int | None = None) -> None:
        """An admitted group finished; ``oldest`` is its oldest model-token version (None: no model tokens).

        A group put without any admitted group in flight bypasses admission; if the buffer is then
        full, the oldest buffered group is evicted (``dropped_capacity``).
        """
        measured = self.version if oldest is None else oldest
        adm = self._leave_flight(admitted_version, hint=measured)
        if adm is None and self.buffered >= self.capacity_groups:
            self._dropped(self.queue.popleft()[2])
            self.dropped_capacity += 1
        self.completed += 1
        self.queue.append((measured, measured if adm is None else adm, item))

    def drop_stale(self, trainer_version: int) -> int:
        """Drop buffered groups too stale for ``trainer_version`` (they only get staler); returns how many."""
        keep: deque[tuple[int, int, T]] = deque()
        for e in self.queue:
            if staleness(trainer_version, e[0]) <= self.max_staleness:
                keep.append(e)
            else:
                self._dropped(e[2])
        n = len(self.queue) - len(keep)
        self.queue = keep
        self.dropped_stale += n
        return n

    def _block_order(self) -> list[int] | None:
        """``block``: queue indices of the B oldest-admitted non-consumed groups, or None while one of
        them is still in flight. Ties at the cut-off version are taken in completion order.

        Consuming in admission-version order trains every group admitted at version ≤ u by step u + η
        (the admission rule started at most (u + η + 1)·B of them), so none goes stale.
        """
        b = self.groups_per_step
        pending = Counter(self.in_flight_by_version)
        pending.update(adm for _, adm, _ in self.queue)
        seen, cutoff = 0, None
        for v in sorted(pending):
            seen += pending[v]
            if seen >= b:
                cutoff = v
                break
        if cutoff is None or any(v < cutoff and c > 0 for v, c in self.in_flight_by_version.items()):
            return None
        older = [i for i, e in enumerate(self.queue) if e[1] < cutoff]
        at_cut = [i for i, e in enumerate(self.queue) if e[1] == cutoff][: b - len(older)]
        return sorted(older + at_cut) if len(older) + len(at_cut) == b else None

    def try_take(self, trainer_version: int) -> list[T] | None:
        """A batch of B groups with staleness ≤ η for ``trainer_version``, or None if not ready yet.

        Stale groups are dropped on the way (never returned), except under ``accept``, which returns the B
        earliest-admitted completed groups whatever their staleness.
        """
        if self.drop_policy != "accept":
            self.drop_stale(trainer_version)
        b = self.groups_per_step
        if len(self.queue) < b:
            return None
        if self.drop_policy == "accept":
            order = sorted(sorted(range(len(self.queue)), key=lambda i: self.queue[i][1])[:b])
            chosen = set(order)
            taken = [self.queue[i] for i in order]
            self.queue = deque(e for i, e in enumerate(self.queue) if i not in chosen)
        elif self.drop_policy == "block":
            order = self._block_order()
            if order is None:
                return None
            chosen = set(order)
            taken = [self.queue[i] for i in order]
            self.queue = deque(e for i, e in enumerate(self.queue) if i not in chosen)
        else:
            taken = [self.queue.popleft() for _ in range(b)]
        self.consumed += b
        self.staleness_hist.update(staleness(trainer_version, measured) for measured, _, _ in taken)
        return [item for _, _, item in taken]

    def stats(self) -> dict[str, Any]:
        """Counters, the staleness histogram of consumed groups and the worst staleness seen."""
        return {
            "admitted": self.admitted, "completed": self.completed, "consumed": self.consumed,
            "released": self.released, "dropped_stale": self.dropped_stale,
            "dropped_capacity": self.dropped_capacity, "in_flight": self.in_flight,
            "buffered": self.buffered, "version": self.version,
            "staleness_hist": dict(sorted(self.staleness_hist.items())),
            "max_staleness_seen": max(self.staleness_hist, default=0),
        }


class RolloutBuffer:
    """The asyncio face of ``BufferCore``: producers block in ``admit``, the trainer in ``get_batch``.

    ``put``, ``release`` and ``close`` are plain methods (callable from callbacks). A bump of ``version``
    (the policy version's owner) wakes the producers waiting on the staleness bound.
    """

    def __init__(self, pipe: PipelineConfig, groups_per_step: int, version: PolicyVersion | None = None) -> None:
        self.core: BufferCore[list[Trajectory]] = BufferCore(pipe, groups_per_step, version)
        self.staleness_from = pipe.staleness_from
        self.core.on_drop = self._count_drop
        self._dropped_tokens = 0
        self._changed = asyncio.Event()
        self._closed = False
        self._producer_wait_s = 0.0
        self._unwatch = self.core.policy.watch(lambda _version: self._notify())

    def _count_drop(self, group: list[Trajectory]) -> None:
        self._dropped_tokens += sum(sum(t.loss_mask) for t in group)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self) -> None:
        if self._closed:
            raise BufferClosed("rollout buffer closed")
        await self._changed.wait()
        if self._closed:
            raise BufferClosed("rollout buffer closed")

    async def admit(self, n_groups: int = 1) -> int:
        """Wait until ``n_groups`` more groups may start; returns the policy version at admission."""
        if n_groups > self.core.capacity_groups:
            raise OverCapacity(f"n_groups={n_groups} exceeds capacity_groups={self.core.capacity_groups}")
        t0 = time.monotonic()
        try:
            while not self.core.can_admit(n_groups):
                await self._wait_change()
            if self._closed:
                raise BufferClosed("rollout buffer closed")
        finally:
            self._producer_wait_s += time.monotonic() - t0
        return self.core.admit(n_groups)

    def release(self, admitted_version: int | None = None) -> None:
        """Free the slot of an admitted group that was abandoned (failed, cancelled)."""
        self.core.release(admitted_version)
        self._notify()

    def put(self, group: list[Trajectory], admitted_version: int | None = None) -> None:
        """Complete an admitted group (pass ``admit``'s return value when known)."""
        if self._closed:
            raise BufferClosed("rollout buffer closed")
        self.core.complete(group, group_staleness_version(group, self.staleness_from), admitted_version)
        self._notify()

    async def get_batch(self, trainer_version: int) -> list[list[Trajectory]]:
        """Wait for ``groups_per_step`` groups with staleness ≤ η at ``trainer_version``."""
        while True:
            if self._closed:
                raise BufferClosed("rollout buffer closed")
            dropped = self.core.dropped_stale
            batch = self.core.try_take(trainer_version)
            if batch is not None or self.core.dropped_stale != dropped:
                self._notify()  # consumed or dropped groups free admission slots
            if batch is not None:
                return batch
            await self._wait_change()

    def close(self) -> None:
        """Wake every waiter with ``BufferClosed``; later calls raise it too."""
        self._closed = True
        self._unwatch()
        self._notify()

    def stats(self) -> dict[str, Any]:
        """``BufferCore.stats()``, the producers' total wait in ``admit`` (seconds) and the model tokens
        of dropped groups (generated, never trained)."""
        return {**self.core.stats(), "producer_wait_s": self._producer_wait_s,
                "dropped_tokens": self._dropped_tokens}
