"""The tracker thread: order kept, a failing tracker reported once and switched off, the others unharmed."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from agentrl.tracking.base import Tracker, TrackerContext, TrackerUnavailable
from agentrl.tracking.hub import TrackerHub
from agentrl.tracking.records import TrackerRecord
from agentrl.tracking.registry import tracker_class

SEEN: dict[str, list[Any]] = {}


class Recording(Tracker):
    name = "recording"

    def __init__(self, ctx: TrackerContext) -> None:
        super().__init__(ctx)
        SEEN["recording"] = []
        self.thread = threading.current_thread().name

    def log(self, record: TrackerRecord) -> None:
        SEEN["recording"].append((self.thread, record.step, dict(record.scalars)))

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        SEEN["recording"].append(("table", step, name, len(rows)))

    def finish(self) -> None:
        SEEN["recording"].append("finished")


class RaisesOnLog(Tracker):
    name = "raises"

    def log(self, record: TrackerRecord) -> None:
        raise ConnectionError("no route to host\nsecond line")


class RaisesOnInit(Tracker):
    def __init__(self, ctx: TrackerContext) -> None:
        raise PermissionError("bad API key")

    def log(self, record: TrackerRecord) -> None:  # pragma: no cover
        raise AssertionError


class Stuck(Tracker):
    def log(self, record: TrackerRecord) -> None:
        threading.Event().wait(30)


def _ctx(tmp_path: Path) -> TrackerContext:
    return TrackerContext(run_dir=tmp_path, run_name="r", run_id="id1", project="p")


def test_fan_out_in_order_and_failures_reported_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    names = [f"{__name__}:Recording", f"{__name__}:RaisesOnLog", f"{__name__}:RaisesOnInit", "wandb_typo"]
    hub = TrackerHub(names, _ctx(tmp_path)).start()
    with caplog.at_level(logging.WARNING, logger="agentrl.tracking.hub"):
        for step in range(1, 6):
            hub.log_record({"kind": "train", "step": step, "reward_mean": step / 10})
        hub.log_table(5, "samples/train", ["a"], [[1], [2]])
        status = hub.close()
    seen = SEEN["recording"]
    assert [s[1] for s in seen[:5]] == [1, 2, 3, 4, 5] and seen[0][2] == {"train/reward_mean": 0.1}
    assert seen[0][0] == "trackers", "trackers run on their own thread"
    assert seen[5:] == [("table", 5, "samples/train", 2), "finished"]
    assert status[names[0]] == "ok"
    assert status[names[1]] == "failed: ConnectionError: no route to host"
    assert status[names[2]] == "failed: PermissionError: bad API key"
    assert status["wandb_typo"].startswith("failed: TrackerUnavailable: unknown tracker 'wandb_typo'")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3, warnings  # once per failed tracker, not once per record
    assert any("RaisesOnLog failed while logging" in w and "training goes on" in w for w in warnings)


def test_close_gives_up_on_a_stuck_tracker(tmp_path: Path) -> None:
    hub = TrackerHub([f"{__name__}:Stuck"], _ctx(tmp_path), close_timeout_s=0.5).start()
    hub.log_record({"kind": "train", "step": 1, "x": 1})
    assert hub.close() == {f"{__name__}:Stuck": "unfinished"}


def test_no_trackers_no_thread(tmp_path: Path) -> None:
    hub = TrackerHub([], _ctx(tmp_path)).start()
    hub.log_record({"kind": "train", "step": 1})
    assert not hub and hub.close() == {}


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(TrackerUnavailable, match=r"pip install 'agentrl\[trackers\]'"):
        tracker_class("wandb")
    with pytest.raises(TrackerUnavailable, match="has no Tracker subclass named 'Nope'"):
        tracker_class(f"{__name__}:Nope")


def test_state_survives_for_resume(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    ctx.save_state("mlflow", {"run_id": "x"})
    ctx.save_state("other", {"a": 1})
    assert ctx.load_state("mlflow") == {"run_id": "x"} and ctx.load_state("none") == {}
