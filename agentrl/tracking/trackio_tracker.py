"""Trackio: a local SQLite store (``TRACKIO_DIR``, default the Hugging Face cache), shown by ``trackio show``;
a Space when ``TRACKIO_SPACE_ID`` is set (the library's own variable). ``--resume`` continues the run of the
same name in the same project."""

from __future__ import annotations

import os
from typing import Any

from agentrl.tracking.base import Tracker, TrackerContext
from agentrl.tracking.records import TrackerRecord


class TrackioTracker(Tracker):
    """Scalars, histograms, the config, and sample tables as ``trackio.Table``."""

    name = "trackio"
    has_tables = True

    def __init__(self, ctx: TrackerContext) -> None:
        super().__init__(ctx)
        import trackio

        self.trackio = trackio
        self.run = trackio.init(project=ctx.project, name=ctx.run_name, config=ctx.config,
                                resume="allow" if ctx.resumed else "never",
                                space_id=os.environ.get("TRACKIO_SPACE_ID") or None, embed=False)

    def log(self, record: TrackerRecord) -> None:
        data: dict[str, Any] = dict(record.scalars)
        for key, h in record.histograms.items():
            data[key] = self.trackio.Histogram(np_histogram=(h.counts, h.edges))
        self.run.log(data, step=record.step)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({name: self.trackio.Table(columns=columns, data=rows)}, step=step)

    def finish(self) -> None:
        self.run.finish()
