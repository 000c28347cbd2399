"""MLflow, through its client (no global active run). ``MLFLOW_TRACKING_URI`` says where runs go; unset,
a SQLite store beside the run directories (``sqlite:///<output_dir>/mlflow.db``, artifacts in
``<output_dir>/mlflow-artifacts``; ``mlflow ui --backend-store-uri`` that URI shows it). ``MLFLOW_EXPERIMENT_NAME`` overrides the experiment
(``tracking.project``). The MLflow run id is kept in the run directory, so ``--resume`` continues that run.
MLflow has no histograms: their bins go to ``metrics.jsonl`` only."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from agentrl.tracking.base import Tracker, TrackerContext
from agentrl.tracking.records import TrackerRecord, flatten_config

PARAM_VALUE_MAX = 6000
"""MLflow's limit on one parameter's value (longer values are cut)."""
BATCH = 900
"""Metrics per ``log_batch`` call (MLflow takes at most 1000)."""


class MlflowTracker(Tracker):
    """Scalars, the config as parameters, and sample tables (``log_table``, shown in the run's artifacts)."""

    name = "mlflow"
    has_tables = True

    def __init__(self, ctx: TrackerContext) -> None:
        super().__init__(ctx)
        from mlflow.entities import Metric, Param, RunStatus
        from mlflow.tracking import MlflowClient

        self._metric_cls = Metric
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None
        if not uri:  # agentrl's default store: the database and the artifacts beside the run directories
            root = ctx.run_dir.parent.resolve()
            uri, artifacts = f"sqlite:///{root / 'mlflow.db'}", (root / "mlflow-artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or ctx.project
        saved = ctx.load_state(self.name)
        if ctx.resumed and saved.get("run_id") and saved.get("tracking_uri") == uri:
            self.run_id = str(saved["run_id"])
            self.client.update_run(self.run_id, status=RunStatus.to_string(RunStatus.RUNNING))
            return
        found = self.client.get_experiment_by_name(experiment)
        exp_id = (found.experiment_id if found is not None
                  else self.client.create_experiment(experiment, artifact_location=artifacts))
        run = self.client.create_run(exp_id, run_name=ctx.run_name, tags={"agentrl.run_id": ctx.run_id})
        self.run_id = run.info.run_id
        ctx.save_state(self.name, {"run_id": self.run_id, "tracking_uri": uri, "experiment": experiment})
        params = [Param(k, (v if isinstance(v, str) else json.dumps(v))[:PARAM_VALUE_MAX])
                  for k, v in flatten_config(ctx.config).items()]
        for i in range(0, len(params), 100):
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, record: TrackerRecord) -> None:
        now = int(time.time() * 1000)
        metrics = [self._metric_cls(k, v, now, record.step) for k, v in record.scalars.items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + BATCH])

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        data = {c: [row[i] for row in rows] for i, c in enumerate(columns)}
        self.client.log_table(self.run_id, data=data, artifact_file=f"{name}/step_{step}.json")

    def finish(self) -> None:
        self.client.set_terminated(self.run_id)
