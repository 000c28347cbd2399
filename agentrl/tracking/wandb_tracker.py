"""Weights & Biases. ``WANDB_MODE`` (``offline``: local files only, ``wandb sync`` uploads them later),
``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_DIR`` and the API key are the library's own. The wandb run's id
is agentrl's run id, so ``--resume`` continues the same wandb run. Every series is plotted against the
record's ``step`` (wandb's own ``_step`` only counts calls), so steps trained again after a resume take
their place instead of being refused as out of order."""

from __future__ import annotations

import os
from typing import Any

from agentrl.tracking.base import Tracker, TrackerContext
from agentrl.tracking.records import TrackerRecord

STEP_KEY = "step"
"""The x-axis of every series: the record's step."""


class WandbTracker(Tracker):
    """Scalars, histograms, the config, and sample tables as ``wandb.Table``."""

    name = "wandb"
    has_tables = True

    def __init__(self, ctx: TrackerContext) -> None:
        super().__init__(ctx)
        import wandb

        self.wandb = wandb
        kwargs: dict[str, Any] = {}
        if not os.environ.get("WANDB_DIR"):
            kwargs["dir"] = str(ctx.run_dir)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT") or ctx.project, name=ctx.run_name,
                              id=ctx.run_id, resume="allow", config=ctx.config, reinit="create_new", **kwargs)
        self.run.define_metric(STEP_KEY)
        self.run.define_metric("*", step_metric=STEP_KEY)

    def log(self, record: TrackerRecord) -> None:
        data: dict[str, Any] = dict(record.scalars)
        for key, h in record.histograms.items():
            data[key] = self.wandb.Histogram(np_histogram=(h.counts, h.edges))
        self.run.log({**data, STEP_KEY: record.step})

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        self.run.log({name: self.wandb.Table(columns=columns, data=rows), STEP_KEY: step})

    def finish(self) -> None:
        self.run.finish()
        # finish() returns before wandb's service has written the run's last records (offline: its .wandb
        # file); teardown waits for the service to exit, so the files are complete when the run ends.
        self.wandb.teardown()
