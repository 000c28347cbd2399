"""The interface every tracker implements, and what it is told about the run.

A tracker is built once per run on the tracker thread (:mod:`agentrl.tracking.hub`), so its library may
keep global state (wandb, trackio do); its methods are called from that thread only, in record order.
Write your own by subclassing :class:`Tracker` and naming it in ``report_to`` as ``package.module:Class``.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from agentrl.core.errors import ConfigError
from agentrl.core.utils.atomic import write_atomic
from agentrl.tracking.records import TrackerRecord

STATE_FILE = "trackers.json"
"""In the run directory: what each tracker needs to continue the same tracker run on ``--resume``."""


class TrackerUnavailable(ConfigError):
    """A chosen tracker cannot be used: its library is not installed (the message names the extra to install)
    or its name is unknown."""

    code = "config.tracker"


@dataclass
class TrackerContext:
    """What a tracker knows about its run."""

    run_dir: Path
    """The run directory (trackers with local files keep them under it unless their variables say otherwise)."""
    run_name: str
    """The run's name (its directory's name): the tracker run's display name."""
    run_id: str
    """agentrl's id of the run, stable across ``--resume``."""
    project: str
    """``tracking.project``."""
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved run config (JSON-like, nested), logged as hyperparameters."""
    resume_step: int | None = None
    """None: a new run. Else the run resumes from the checkpoint of this step, and the steps after it are
    trained again (a tracker that can hide their first attempt should)."""

    @property
    def resumed(self) -> bool:
        return self.resume_step is not None

    def _state_path(self) -> Path:
        return self.run_dir / STATE_FILE

    def load_state(self, tracker: str) -> dict[str, Any]:
        """What ``tracker`` saved with :meth:`save_state` in an earlier start of this run (empty: nothing)."""
        try:
            return dict(json.loads(self._state_path().read_text()).get(tracker, {}))
        except (OSError, ValueError):
            return {}

    def save_state(self, tracker: str, state: dict[str, Any]) -> None:
        """Keep ``state`` (JSON-like) for ``tracker`` in the run directory, for ``--resume``."""
        try:
            saved = json.loads(self._state_path().read_text())
        except (OSError, ValueError):
            saved = {}
        saved[tracker] = state
        write_atomic(self._state_path(), json.dumps(saved, indent=2))


class Tracker(ABC):
    """One experiment tracker. ``__init__(ctx)`` opens (or, when ``ctx.resumed``, continues) its run and
    logs ``ctx.config``; raising there reports the tracker as failed, once."""

    name: ClassVar[str] = "tracker"
    """How warnings and ``summary.json`` name it."""
    has_tables: ClassVar[bool] = False
    """True when :meth:`log_table` shows a real table (the others get nothing, or text)."""

    def __init__(self, ctx: TrackerContext) -> None:
        self.ctx = ctx

    @abstractmethod
    def log(self, record: TrackerRecord) -> None:
        """Log one ``metrics.jsonl`` record's scalars and histograms at ``record.step``."""

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:  # noqa: B027
        """Log a table (the sample episodes of ``step``); default: nothing, for trackers without tables."""

    def finish(self) -> None:  # noqa: B027
        """Flush and close the tracker run (called once, at the end of the run)."""
