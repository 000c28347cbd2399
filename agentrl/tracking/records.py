"""A ``metrics.jsonl`` record as trackers take it: ``<kind>/<key>`` scalars and histograms, at its step.

The one rule every tracker follows, so each shows the same series as ``metrics.jsonl``: every finite number
of a record becomes the scalar ``<kind>/<key>`` (``train/reward_mean``, ``eval/success``) at the record's
``step``; a mapping of numbers named ``*_hist`` (bin value -> count, e.g. ``staleness_hist``) becomes a
histogram; any other mapping of numbers becomes scalars ``<kind>/<key>/<sub>``. Strings, lists and
non-finite numbers (a NaN loss) stay in ``metrics.jsonl`` only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

META_KEYS = frozenset({"time", "run_id", "kind", "step"})
"""Fields of every record that say where it belongs rather than what was measured."""


@dataclass(frozen=True)
class Histogram:
    """Counts per bin: ``counts[i]`` values fell in ``[edges[i], edges[i + 1])``."""

    edges: list[float]
    counts: list[float]

    @classmethod
    def from_counts(cls, counts: dict[float, float]) -> Histogram:
        """Unit-wide bins centred on each value (the values of a ``*_hist`` record: integers such as
        versions behind), in value order."""
        values = sorted(counts)
        return cls(edges=[v - 0.5 for v in values] + [values[-1] + 0.5] if values else [],
                   counts=[counts[v] for v in values])

    def values(self) -> list[float]:
        """One sample per count, at each bin's centre (for trackers that build histograms from samples)."""
        return [(a + b) / 2 for a, b, n in zip(self.edges, self.edges[1:], self.counts, strict=False)
                for _ in range(int(n))]


@dataclass(frozen=True)
class TrackerRecord:
    """One ``metrics.jsonl`` record, split for trackers."""

    kind: str
    step: int
    scalars: dict[str, float]
    histograms: dict[str, Histogram]


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)) and math.isfinite(v):
        return float(v)
    return None


def _numeric_map(v: Any) -> dict[float, float] | None:
    if not isinstance(v, dict) or not v:
        return None
    out: dict[float, float] = {}
    for k, x in v.items():
        try:
            key = float(k)
        except (TypeError, ValueError):
            return None
        n = _number(x)
        if n is None:
            return None
        out[key] = n
    return out


def split_record(record: dict[str, Any]) -> TrackerRecord:
    """``record`` (a ``metrics.jsonl`` line) as scalars and histograms (see the module docstring)."""
    kind = str(record.get("kind") or "run")
    scalars: dict[str, float] = {}
    hists: dict[str, Histogram] = {}
    for key, v in record.items():
        if key in META_KEYS:
            continue
        n = _number(v)
        if n is not None:
            scalars[f"{kind}/{key}"] = n
        elif isinstance(v, dict):
            counts = _numeric_map(v)
            if counts is not None and key.endswith("_hist"):
                hists[f"{kind}/{key}"] = Histogram.from_counts(counts)
            else:
                for sub, x in v.items():
                    if (m := _number(x)) is not None:
                        scalars[f"{kind}/{key}/{sub}"] = m
    return TrackerRecord(kind=kind, step=int(record.get("step") or 0), scalars=scalars, histograms=hists)


def flatten_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys (``trainer.loss.clip_low``), for trackers whose parameters are flat."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_config(v, f"{key}."))
        else:
            out[key] = v
    return out
