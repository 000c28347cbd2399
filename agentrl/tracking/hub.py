"""The run's trackers, on a thread of their own.

Records reach the trackers through one queue, in the order ``metrics.jsonl`` got them; the thread opens
each tracker (a slow login or database migration never holds up the event loop), then feeds it. A tracker
that fails (library missing, no network, a bad key, an error while logging) is reported once, with the
reason, and switched off for the rest of the run; the others, training and ``metrics.jsonl`` go on.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any

from agentrl.core.errors import first_line
from agentrl.tracking.base import Tracker, TrackerContext
from agentrl.tracking.records import split_record
from agentrl.tracking.registry import tracker_class

log = logging.getLogger(__name__)

_STOP = object()


class TrackerHub:
    """Fans ``metrics.jsonl`` records and sample tables out to the trackers named in ``names``.

    Use :meth:`start`, then :meth:`log_record` / :meth:`log_table` from any thread, then :meth:`close`.
    :attr:`status` says, per tracker, ``ok`` or why it was switched off."""

    def __init__(self, names: list[str], ctx: TrackerContext, *, close_timeout_s: float = 60.0) -> None:
        self.names = list(names)
        self.ctx = ctx
        self.close_timeout_s = close_timeout_s
        self.status: dict[str, str] = {}
        """Tracker name -> ``ok``, ``failed: <reason>`` or ``unfinished`` (still busy at close)."""
        self._trackers: dict[str, Tracker] = {}
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None

    def __bool__(self) -> bool:
        return bool(self.names)

    def start(self) -> TrackerHub:
        """Start the tracker thread (a no-op without trackers)."""
        if self.names and self._thread is None:
            self._thread = threading.Thread(target=self._work, name="trackers", daemon=True)
            self._thread.start()
        return self

    def log_record(self, record: dict[str, Any]) -> None:
        """Queue one ``metrics.jsonl`` record (returns at once)."""
        if self._thread is not None:
            self._queue.put(("record", record))

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """Queue a table for the trackers that show tables (returns at once)."""
        if self._thread is not None:
            self._queue.put(("table", (step, name, columns, rows)))

    def close(self) -> dict[str, str]:
        """Flush the queue, finish every tracker (``close_timeout_s`` at most), and return :attr:`status`."""
        if self._thread is None:
            return self.status
        self._queue.put(_STOP)
        self._thread.join(self.close_timeout_s)
        if self._thread.is_alive():
            busy = [n for n, s in self.status.items() if s == "ok"] or self.names
            log.warning("trackers %s did not finish within %.0fs; metrics.jsonl is complete",
                        ", ".join(busy), self.close_timeout_s)
            for n in busy:
                self.status[n] = "unfinished"
        self._thread = None
        return self.status

    # -- the tracker thread ---------------------------------------------------------------------

    def _fail(self, name: str, e: BaseException, doing: str) -> None:
        self._trackers.pop(name, None)
        reason = f"{type(e).__name__}: {first_line(e)}" if str(e).strip() else type(e).__name__
        self.status[name] = f"failed: {reason}"
        log.warning("tracker %s failed while %s and is switched off for the rest of this run "
                    "(training goes on; metrics.jsonl keeps every record): %s", name, doing, reason)

    def _open(self) -> None:
        for name in self.names:
            try:
                self._trackers[name] = tracker_class(name)(self.ctx)
                self.status[name] = "ok"
            except Exception as e:
                self._fail(name, e, "starting")
        if self._trackers:
            log.info("reporting to %s", ", ".join(self._trackers))

    def _work(self) -> None:
        self._open()
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            what, payload = item
            record = split_record(payload) if what == "record" else None
            for name, tracker in list(self._trackers.items()):
                try:
                    if record is not None:
                        tracker.log(record)
                    else:
                        tracker.log_table(*payload)
                except Exception as e:
                    self._fail(name, e, "logging" if what == "record" else "logging a table")
        for name, tracker in list(self._trackers.items()):
            try:
                tracker.finish()
            except Exception as e:
                self._fail(name, e, "finishing")
