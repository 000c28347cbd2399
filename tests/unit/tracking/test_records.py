"""How a metrics.jsonl record reaches trackers: <kind>/<key> scalars and histograms, at its step."""

from __future__ import annotations

import math

import pytest

from agentrl.config.tracking import TrackingConfig
from agentrl.tracking.records import Histogram, flatten_config, split_record


def test_scalars_histograms_and_what_stays_in_the_file() -> None:
    rec = {"time": 1.0, "run_id": "abc", "kind": "train", "step": 7, "mode": "async", "reward_mean": 0.5,
           "train_num_tokens": 120, "staleness_hist": {"0": 12, "2": 4}, "stop": {"completed": 3, "max_turns": 1},
           "errors": ["x"], "train_loss": math.nan, "ok": True}
    out = split_record(rec)
    assert out.kind == "train" and out.step == 7
    assert out.scalars == {"train/reward_mean": 0.5, "train/train_num_tokens": 120.0, "train/stop/completed": 3.0,
                           "train/stop/max_turns": 1.0, "train/ok": 1.0}
    h = out.histograms["train/staleness_hist"]
    assert h.edges == [-0.5, 1.5, 2.5] and h.counts == [12, 4]
    assert sorted(set(h.values())) == [0.5, 2.0] and len(h.values()) == 16


def test_histogram_of_unit_bins() -> None:
    h = Histogram.from_counts({0.0: 2, 1.0: 1})
    assert h.edges == [-0.5, 0.5, 1.5] and h.values() == [0.0, 0.0, 1.0]


def test_flatten_config() -> None:
    assert flatten_config({"a": 1, "t": {"loss": {"clip": 0.2}, "lr": 1e-4}}) == {
        "a": 1, "t.loss.clip": 0.2, "t.lr": 1e-4}


def test_report_to_parsing() -> None:
    assert TrackingConfig(report_to="TensorBoard, wandb,jsonl,wandb").report_to == ["tensorboard", "wandb"]
    assert TrackingConfig(report_to=["my_pkg.trackers:Mine"]).report_to == ["my_pkg.trackers:Mine"]
    with pytest.raises(ValueError, match=r"unknown tracker 'comet'.*tensorboard, wandb, trackio, mlflow"):
        TrackingConfig(report_to="comet")
