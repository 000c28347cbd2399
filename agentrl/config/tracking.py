"""Where a run's metrics and sample rollouts go besides ``metrics.jsonl``: experiment trackers and rollout
tables. Only pydantic here: every part of agentrl may import it."""

from __future__ import annotations

from pydantic import Field, field_validator

from agentrl.config.base import Section
from agentrl.config.errors import SettingError

BUILTIN_TRACKERS = ("tensorboard", "wandb", "trackio", "mlflow")
"""The trackers agentrl knows by name (each through its own library, imported only when chosen)."""


class TrackingConfig(Section):
    """Experiment trackers and rollout tables (``metrics.jsonl`` and ``samples/`` are always written)."""

    report_to: list[str] = Field(default_factory=list)
    """Trackers that get every scalar of ``metrics.jsonl`` at the same step, named ``<kind>/<key>``
    (``train/reward_mean``, ``eval/success``), plus the resolved config and the rollout tables: any of
    ``tensorboard``, ``wandb``, ``trackio``, ``mlflow``, or ``package.module:Class`` (a tracker of your own,
    see ``agentrl.tracking.base.Tracker``). Each library is imported only when chosen (``pip install
    'agentrl[trackers]'``) and honours its usual environment variables (``WANDB_MODE``, ``WANDB_PROJECT``,
    ``MLFLOW_TRACKING_URI``, ``TRACKIO_DIR``, ...). A tracker that fails is reported once and switched off;
    training and ``metrics.jsonl`` go on."""
    project: str = "agentrl"
    """The tracker's project (wandb, trackio) or experiment (mlflow); ``WANDB_PROJECT`` and
    ``MLFLOW_EXPERIMENT_NAME`` override it for their tracker. The run is named after the run directory."""
    samples_every: int = Field(10, ge=0)
    """Every N steps, write a sample of the step's episodes (messages, tool calls and results, reward, stop
    reason, policy versions) to ``<run_dir>/samples/step_N.jsonl`` and as a table to the trackers that have
    tables (0: never). ``agentrl show <run_dir>`` prints them."""
    plot_every_s: float = Field(60.0, ge=0.0)
    """During training, redraw ``<run_dir>/reward_curve.png`` at most once in this many seconds of wall time
    (0: after every step); it is always drawn at the end of the run. A redraw holds the run's event loop for
    0.1 to 0.2 s on a small CPU (matplotlib, and every record of ``metrics.jsonl`` read again), which after
    every step took about 5% of a 3.5-second step of the embedded model from its generation."""
    samples_per_step: int = Field(4, ge=1)
    """Episodes per sample: one from each of this many groups, drawn with the run's seed."""
    close_timeout_s: float = Field(60.0, gt=0)
    """At the end of a run, how long the trackers may take to flush (a tracker still busy is abandoned,
    with a warning; ``metrics.jsonl`` is complete either way)."""

    @field_validator("report_to", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        """``"tensorboard,wandb"`` (a flag's value) as well as a list; names are case-insensitive, ``jsonl``
        (always on) and duplicates are dropped."""
        items = v.split(",") if isinstance(v, str) else v
        if not isinstance(items, list):
            return v
        out: list[str] = []
        for item in items:
            name = str(item).strip()
            name = name if ":" in name else name.lower()
            if name and name not in ("jsonl", "none") and name not in out:
                out.append(name)
        return out

    @field_validator("report_to")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        unknown = [n for n in v if ":" not in n and n not in BUILTIN_TRACKERS]
        if unknown:
            raise SettingError(f"unknown tracker {', '.join(map(repr, unknown))}; expected any of "
                               f"{', '.join(BUILTIN_TRACKERS)} (jsonl is always on), or package.module:Class")
        return v
