"""TensorBoard, through ``torch.utils.tensorboard`` (needs the ``tensorboard`` package): event files in
``<run_dir>/tensorboard`` (``tensorboard --logdir runs`` shows every run). On ``--resume`` the events of the
steps trained again are purged from the display (``purge_step``)."""

from __future__ import annotations

import json
from typing import Any

from agentrl.tracking.base import Tracker, TrackerContext
from agentrl.tracking.records import TrackerRecord

LOG_SUBDIR = "tensorboard"


def _markdown_table(columns: list[str], rows: list[list[Any]]) -> str:
    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\n", "<br>")

    head = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns)
    return head + "".join("\n| " + " | ".join(cell(v) for v in row) + " |" for row in rows)


class TensorBoardTracker(Tracker):
    """Scalars, histograms, the config as text, and sample tables as markdown text."""

    name = "tensorboard"

    def __init__(self, ctx: TrackerContext) -> None:
        super().__init__(ctx)
        from torch.utils.tensorboard import SummaryWriter

        purge = ctx.resume_step + 1 if ctx.resume_step is not None else None
        self.writer = SummaryWriter(log_dir=str(ctx.run_dir / LOG_SUBDIR), purge_step=purge)
        if not ctx.resumed:
            self.writer.add_text("config", "```json\n" + json.dumps(ctx.config, indent=2) + "\n```", 0)

    def log(self, record: TrackerRecord) -> None:
        for key, value in record.scalars.items():
            self.writer.add_scalar(key, value, record.step)
        for key, h in record.histograms.items():
            values = h.values()
            if values:
                self.writer.add_histogram_raw(
                    key, min=min(values), max=max(values), num=len(values), sum=sum(values),
                    sum_squares=sum(v * v for v in values), bucket_limits=h.edges[1:], bucket_counts=h.counts,
                    global_step=record.step)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self.writer.add_text(name, _markdown_table(columns, rows), step)

    def finish(self) -> None:
        self.writer.close()
