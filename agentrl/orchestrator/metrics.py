"""Structured metrics: one JSON object per line, plus PNG plots of the curves.

A train step's record is assembled in one place from its parts: :func:`step_metrics` (what
``Orchestrator.step`` returns: rollout stats, the trainer's reply, the weight update, timings, staleness,
buffer totals) and :func:`train_record` (the ``kind = "train"`` line of ``metrics.jsonl`` around it).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.core.errors import AgentRLError
from agentrl.core.utils.atomic import write_atomic
from agentrl.core.utils.stats import binomial_stderr
from agentrl.core.versions import group_oldest_version, staleness, staleness_stats
from agentrl.rollout.stats import error_lines, metric_means

if TYPE_CHECKING:  # pragma: no cover
    from agentrl.core.types import Trajectory
    from agentrl.rollout.stats import BatchStats


class MetricsWriter:
    """Appends metric records to a JSONL file (one flush per record, so a crash loses nothing); with
    ``run_id``, every record carries it. ``sink`` (the run's trackers, ``TrackerHub.log_record``) gets each
    record once it is in the file, so a tracker never sees what the file lacks."""

    def __init__(self, path: Path, run_id: str | None = None,
                 sink: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.path = Path(path)
        self.run_id = run_id
        self.sink = sink
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        rec = {"time": time.time(), **({"run_id": self.run_id} if self.run_id else {}), **record}
        line = json.dumps(rec, default=_jsonable)
        with self.path.open("a") as f:
            f.write(line + "\n")
        if self.sink is not None:
            self.sink(json.loads(line))  # plain JSON types, as a reader of the file sees them


class NotJsonable(AgentRLError, TypeError):
    """A metrics record holds a value that cannot be written as JSON."""

    code = "orchestrator.metrics.not_jsonable"


class WindowError(AgentRLError, ValueError):
    """A rolling window was asked for with fewer than one point."""

    code = "orchestrator.metrics.window"


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise NotJsonable(f"not JSON serialisable: {type(x).__name__}")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All records of a JSONL file (a torn last line is skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def records_of(path: Path, kind: str) -> list[dict[str, Any]]:
    """The records of ``kind`` in the metrics file ``path`` so far ([] while it does not exist yet)."""
    try:
        return [r for r in read_jsonl(path) if r.get("kind") == kind]
    except (OSError, ValueError):
        return []


def groups_lost_unrecorded(books: dict[str, Any]) -> int:
    """Groups of a run's final ``groups`` record that were admitted but neither consumed, released, dropped nor
    buffered: lost without a record (must be 0)."""
    accounted = sum(books[f"groups_{k}"] for k in ("consumed", "released", "dropped_stale", "dropped_capacity",
                                                   "buffered"))
    return int(books["groups_admitted"] - accounted)


def nothing_trained() -> dict[str, Any]:
    """The trainer's part of a step that had no sample to train (every group of the batch without signal, after
    dynamic sampling's budget): no samples, no tokens, and the staleness of no token, so every train record
    carries the same staleness keys whether or not the trainer ran."""
    return {"num_samples": 0, "num_tokens": 0, **staleness_stats([])}


def step_metrics(
    batch: list[list[Trajectory]],
    stats: BatchStats,
    *,
    train: dict[str, Any],
    update: dict[str, Any],
    groups_interrupted: int,
    trained_on: int,
    times: tuple[float, float, float, float],
    step_s: float,
    gen_s: float,
    groups_in_flight: int,
    interrupted_groups_total: int,
    failed_groups_total: int,
    buffer: dict[str, Any],
    skipped: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One train step's metrics, from its parts.

    ``batch``/``stats``: the groups trained on and their summary (``to_samples``); ``train``: the trainer's
    reply (numbers kept, as ``train_<key>``); ``update``: the weight update's (``live_update``), with
    ``groups_interrupted`` groups in flight under it; ``trained_on``: the policy version trained; ``times``:
    (step began, batch taken, trained, published) on one clock; ``step_s``/``gen_s``: the step's wall time
    and the time rollouts were in flight during it; ``buffer``: ``RolloutBuffer.stats()``; ``skipped``: the
    groups dynamic sampling left out (this step's, in all, and their model tokens). Staleness is measured from
    each group's oldest model token.
    """
    skipped = skipped or {"groups": 0, "total": 0, "tokens": 0}
    t0, t1, t2, t3 = times
    lags = [staleness(trained_on, v) for g in batch if (v := group_oldest_version(g)) is not None]
    mixed = sum(len({v for v in t.versions if v >= 0}) > 1 for g in batch for t in g)
    return {
        **stats.as_metrics(),
        "errors": error_lines([t for g in batch for t in g]),  # why the failed episodes failed
        **metric_means([t for g in batch for t in g]),  # per-episode env metrics, e.g. partial credit
        **{f"train_{k}": v for k, v in train.items() if isinstance(v, (int, float))},
        **update,
        "groups_interrupted": float(groups_interrupted),
        "trained_on_version": trained_on,
        "wait_s": t1 - t0,
        "gen_s": gen_s,
        "train_s": t2 - t1,
        "sync_s": t3 - t2,
        "step_s": step_s,
        "tokens_per_s": stats.model_tokens / max(step_s, 1e-9),
        "trainer_idle_frac": max(0.0, 1.0 - (t2 - t1) / max(step_s, 1e-9)),
        "inference_idle_frac": max(0.0, 1.0 - gen_s / max(step_s, 1e-9)),
        **staleness_stats(lags),
        "mixed_version_episodes": mixed,
        "groups_in_flight": groups_in_flight,
        "interrupted_groups_total": interrupted_groups_total,
        "dropped_groups_total": buffer["dropped_stale"] + buffer["dropped_capacity"],
        "dropped_tokens_total": buffer["dropped_tokens"],
        "failed_groups_total": failed_groups_total,
        "skipped_groups": skipped["groups"],
        "skipped_groups_total": skipped["total"],
        "skipped_tokens_total": skipped["tokens"],
        "producer_wait_s_total": buffer["producer_wait_s"],
        "staleness_hist": {str(k): v for k, v in buffer["staleness_hist"].items()},
    }


def train_record(metrics: dict[str, Any], *, step: int, version: int, mode: str, engines_rejoined: int,
                 engines_live: int, wall_s: float, wall_train_s: float) -> dict[str, Any]:
    """The ``kind = "train"`` record of ``metrics.jsonl`` for step ``step``: its :func:`step_metrics`, the
    policy version it published (``version``), the engines that rejoined after it and those in rotation,
    and the run's wall time (``wall_train_s``: the training loop's, without start-up and evaluations)."""
    return {"kind": "train", "step": step, "version": version, "mode": mode, **metrics,
            "engines_rejoined": engines_rejoined, "engines_live": engines_live,
            "wall_s": wall_s, "wall_train_s": wall_train_s}


def plot_curves(
    series: dict[str, Sequence[tuple[float, float]]],
    out: Path,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
) -> Path:
    """Plot named (x, y) series into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for label, points in series.items():
        pts = [(x, y) for x, y in points if y is not None and not math.isnan(y)]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def supersede_after(metrics_path: Path, step: int) -> int:
    """On resume from the checkpoint of ``step``: move the records of later steps (written before a crash,
    and about to be redone) to ``metrics.superseded.jsonl`` beside it, and drop a torn last line, so that
    the metrics read as one run. The rewrite is atomic; returns how many records moved."""
    if not metrics_path.is_file():
        return 0
    recs = read_jsonl(metrics_path)
    keep = [r for r in recs if int(r.get("step", 0)) <= step]
    later = [r for r in recs if int(r.get("step", 0)) > step]
    if later:
        with metrics_path.with_name("metrics.superseded.jsonl").open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in later)
    write_atomic(metrics_path, "".join(json.dumps(r) + "\n" for r in keep))
    return len(later)


def rolling_window(n: int) -> int:
    """The rolling-mean window for ``n`` train points: about a tenth of them, at least 3 and at most 10,
    and never more than ``n`` (at least 1), so that a short run still gets a well-defined window."""
    return max(1, min(n, 10, max(3, round(0.1 * n))))


def rolling_mean(values: Sequence[float | None], window: int) -> list[float]:
    """The trailing mean of ``values`` over the last ``window`` points at each position (fewer at the start).

    ``None`` and NaN are left out of the windows they fall in; a window with no finite value is NaN.
    The result has one entry per input value."""
    if window < 1:
        raise WindowError(f"window must be >= 1, got {window}")
    out: list[float] = []
    for i in range(len(values)):
        seen = [v for v in values[max(0, i - window + 1): i + 1] if v is not None and math.isfinite(v)]
        out.append(sum(seen) / len(seen) if seen else math.nan)
    return out


def eval_stderrs(values: Sequence[float], episodes: Sequence[float | None]) -> list[float | None]:
    """Error bars for held-out points: :func:`binomial_stderr` of each value over its ``num_episodes``
    when every finite value lies in [0, 1] (a rate), else none at all (``None`` each)."""
    if not all(0.0 <= v <= 1.0 for v in values if math.isfinite(v)):
        return [None] * len(values)
    return [binomial_stderr(v, n) for v, n in zip(values, episodes, strict=True)]


def format_estimate(value: float, stderr: float | None) -> str:
    """``"0.35 ± 0.03"``, or ``"0.35"`` without a standard error."""
    return f"{value:.2f}" if stderr is None else f"{value:.2f} ± {stderr:.2f}"


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def plot_run(metrics_path: Path, out: Path, run_id: str | None = None) -> Path:
    """The reward curve of a training run (of the records of ``run_id`` when given): the train reward of
    each step as faint points under a bold rolling mean (:func:`rolling_window`, :func:`rolling_mean`),
    and held-out success per eval with standard-error bars (:func:`eval_stderrs`), its first and last
    values written beside them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in read_jsonl(metrics_path) if run_id is None or r.get("run_id", run_id) == run_id]
    train = sorted((r["step"], float(r["reward_mean"])) for r in recs if r.get("kind") == "train"
                   and _finite(r.get("step")) and _finite(r.get("reward_mean")))
    eval_recs = [r for r in recs if r.get("kind") == "eval" and _finite(r.get("step"))]
    key = "success" if any(_finite(r.get("success")) for r in eval_recs) else "reward_mean"
    evals = sorted(((r["step"], float(r[key]), r.get("num_episodes")) for r in eval_recs if _finite(r.get(key))),
                   key=lambda e: e[0])

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        xs, ys = zip(*train, strict=True)
        window = rolling_window(len(ys))
        ax.plot(xs, ys, color="C0", alpha=0.3, linewidth=0.8, marker="o", markersize=2.5,
                label="train reward (per step)")
        ax.plot(xs, rolling_mean(ys, window), color="C0", linewidth=2.2,
                label=f"train reward, rolling mean (window {window})")
    if evals:
        xs, ys, ns = zip(*evals, strict=True)
        errs = eval_stderrs(ys, [n if _finite(n) else None for n in ns])
        has_err = any(e is not None for e in errs)
        ax.errorbar(xs, ys, yerr=[0.0 if e is None else e for e in errs] if has_err else None,
                    color="C1", marker="o", markersize=4, linewidth=1.5, capsize=3,
                    label=f"held-out {key.replace('_', ' ')}" + (" (± s.e.)" if has_err else ""))
        for i in sorted({0, len(ys) - 1}):
            ax.annotate(format_estimate(ys[i], errs[i]), (xs[i], ys[i]), textcoords="offset points",
                        xytext=(0, 9), ha="center", fontsize=8, color="C1", fontweight="bold",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.8})
    ax.set_title(f"agentrl: {metrics_path.parent.name}")
    ax.set_xlabel("step")
    ax.set_ylabel("reward / success")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def plot_pipeline(metrics_path: Path, out: Path) -> Path:
    """Pipeline health of a run in one PNG: idle fractions, throughput, update latency, interrupted and
    dropped groups per step, and the staleness histogram of the groups trained on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in read_jsonl(metrics_path) if r.get("kind") == "train"]
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.6), dpi=100)
    steps = [r["step"] for r in recs]

    def line(ax: Any, key: str, label: str | None = None, scale: float = 1.0) -> None:
        ax.plot(steps, [scale * r.get(key, math.nan) for r in recs], marker="o", markersize=2, label=label)

    line(axes[0], "trainer_idle_frac", "trainer idle")
    line(axes[0], "inference_idle_frac", "inference idle")
    axes[0].set(title="idle fraction per step", xlabel="step", ylim=(0, 1.02))
    axes[0].legend()
    line(axes[1], "tokens_per_s")
    axes[1].set(title="model tokens/s trained", xlabel="step")
    line(axes[2], "update_s", scale=1e3)
    axes[2].set(title="weight update (ms, trainer side)", xlabel="step", yscale="log")
    line(axes[3], "interrupted_groups_total", "interrupted (in flight at an update)")
    line(axes[3], "dropped_groups_total", "dropped (stale)")
    line(axes[3], "failed_groups_total", "failed")
    axes[3].set(title="groups, cumulative", xlabel="step")
    axes[3].legend(fontsize=7)
    hist = recs[-1].get("staleness_hist", {}) if recs else {}
    xs = sorted(int(k) for k in hist)
    axes[4].bar([str(x) for x in xs], [hist[str(x)] for x in xs])
    axes[4].set(title="staleness of trained groups", xlabel="versions behind", ylabel="groups")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"agentrl pipeline: {metrics_path.parent.name} ({recs[-1].get('mode', '?') if recs else '?'})")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out
