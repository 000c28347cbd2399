"""Each model's requests run in ``seq_id`` order, one at a time. The SDK numbers a training client's requests
1, 2, 3, ... and may send them in parallel chunks that arrive out of order, and retry one whose answer it
lost: a request waits until every lower ``seq_id`` has run, and a ``seq_id`` seen before gets the first
request's id back, so a retry is never run twice. A gap that no request fills within ``gap_timeout_s`` fails
the requests waiting behind it (category ``user``) and the model goes on from the next ``seq_id``."""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentrl.tinker.errors import SeqIdError, TinkerUserError
from agentrl.tinker.futures import Future, Futures

log = logging.getLogger(__name__)

Job = Callable[[Future], Awaitable[None]]
"""Runs one request and settles its future (``Futures.succeed`` / ``Futures.fail``)."""
GAP_TIMEOUT_S = 120.0
SEEN_KEPT = 10_000


@dataclass
class _Waiting:
    future: Future
    job: Job


class Sequencer:
    """One model's queue: :meth:`submit` returns the request's future at once; the jobs run in order."""

    def __init__(self, futures: Futures, name: str, *, first_seq_id: int = 1,
                 gap_timeout_s: float = GAP_TIMEOUT_S) -> None:
        self.futures = futures
        self.name = name
        self.next_seq_id = first_seq_id
        self.gap_timeout_s = gap_timeout_s
        self._waiting: dict[int, _Waiting] = {}
        self._seen: OrderedDict[int, Future] = OrderedDict()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def submit(self, seq_id: int | None, owner: str, kind: str, job: Job) -> Future:
        """The future of request ``seq_id`` (a retry's: the first one's); the job runs when its turn comes."""
        if seq_id is None:
            raise TinkerUserError(f"{kind} on {self.name}: seq_id is required (the SDK numbers each model's "
                                  "requests 1, 2, 3, ...)")
        if seq_id in self._seen:
            return self._seen[seq_id]
        if seq_id < self.next_seq_id:
            raise TinkerUserError(f"{kind} on {self.name}: seq_id {seq_id} was used already (the next is "
                                  f"{self.next_seq_id})")
        fut = self.futures.create(owner, kind)
        self._seen[seq_id] = fut
        while len(self._seen) > SEEN_KEPT:
            self._seen.popitem(last=False)
        self._waiting[seq_id] = _Waiting(fut, job)
        self._wake.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain(), name=f"tinker-seq-{self.name}")
        return fut

    async def _drain(self) -> None:
        while self._waiting:
            item = self._waiting.pop(self.next_seq_id, None)
            if item is None:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), self.gap_timeout_s)
                except asyncio.TimeoutError:
                    self._fail_gap()
                continue
            self.next_seq_id += 1
            try:
                await item.job(item.future)
            except Exception as e:  # a job settles its own future; this is the net under it
                log.exception("%s: %s failed", self.name, item.future.kind)
                if not item.future.done.is_set():
                    Futures.fail(item.future, e)

    def _fail_gap(self) -> None:
        waiting = sorted(self._waiting)
        err = SeqIdError(f"{self.name}: seq_id {self.next_seq_id} never arrived in {self.gap_timeout_s:.0f} s, so "
                         f"the requests behind it ({', '.join(map(str, waiting))}) were not run; the model goes "
                         f"on from seq_id {waiting[-1] + 1}")
        for seq in waiting:
            Futures.fail(self._waiting.pop(seq).future, err)
        self.next_seq_id = waiting[-1] + 1

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
