"""Each built-in tracker through its real library (offline, local stores), read back by its own reader:
the series at the right steps, histograms, tables, the config, and a resumed run continuing the same
tracker run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from agentrl.tracking.base import TrackerContext
from agentrl.tracking.hub import TrackerHub
from tests import tracker_readers as read
from tests.conftest import require

CONFIG = {"env": "calc", "trainer": {"lr": 0.0002, "loss": {"clip_low": 0.2}}, "tracking": {"project": "p"}}


def _records(steps: range, offset: float = 0.0) -> list[dict]:
    recs = []
    for s in steps:
        recs.append({"kind": "train", "step": s, "reward_mean": s / 10 + offset, "train_loss": 1.0 / s,
                     "staleness_hist": {"0": 3, "1": 1}, "mode": "sync"})
    return recs


def _run(name: str, tmp_path: Path, steps: range, *, resume_step: int | None = None, offset: float = 0.0) -> dict:
    ctx = TrackerContext(run_dir=tmp_path / "run", run_name="run", run_id="abc123def456", project="agentrl-test",
                         config=CONFIG, resume_step=resume_step)
    ctx.run_dir.mkdir(exist_ok=True)
    hub = TrackerHub([name], ctx).start()
    if resume_step is None:
        hub.log_record({"kind": "eval", "step": 0, "success": 0.25, "errors": []})
    for rec in _records(steps, offset):
        hub.log_record(rec)
    hub.log_table(steps[-1], "samples/train", ["step", "task_id", "reward"], [[steps[-1], "t1", 1.0]])
    status = hub.close()
    assert status == {name: "ok"}, status
    return status


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("WANDB_DIR", "WANDB_PROJECT", "MLFLOW_EXPERIMENT_NAME", "TRACKIO_SPACE_ID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file://{tmp_path / 'mlruns'}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def _same(series: list[tuple[int, float]], expected: list[tuple[int, float]]) -> bool:
    """The same steps, and values equal to float32 precision (TensorBoard keeps float32)."""
    return [st for st, _ in series] == [st for st, _ in expected] and all(
        v == pytest.approx(e, rel=1e-6) for (_, v), (_, e) in zip(series, expected, strict=True))


def _need(module: str) -> None:
    require(importlib.util.find_spec(module) is not None, f"{module} is not installed (pip install 'agentrl[trackers]')")


def test_tensorboard(tmp_path: Path) -> None:
    _need("tensorboard")
    _run("tensorboard", tmp_path, range(1, 4))
    log_dir = tmp_path / "run" / "tensorboard"
    assert _same(read.tensorboard_scalars(log_dir, "train/reward_mean"), [(1, 0.1), (2, 0.2), (3, 0.3)])
    assert read.tensorboard_scalars(log_dir, "eval/success") == [(0, 0.25)]
    tags = read.tensorboard_tags(log_dir)
    assert "train/staleness_hist" in tags["histograms"] and "samples/train/text_summary" in tags["tensors"]
    # resumed from the checkpoint of step 2: the first attempt's step 3 is purged, steps 3-4 continue the series
    _run("tensorboard", tmp_path, range(3, 5), resume_step=2, offset=1.0)
    assert _same(read.tensorboard_scalars(log_dir, "train/reward_mean"), [(1, 0.1), (2, 0.2), (3, 1.3), (4, 1.4)])


def test_wandb_offline(tmp_path: Path) -> None:
    _need("wandb")
    _run("wandb", tmp_path, range(1, 4))
    wdir = tmp_path / "run" / "wandb"
    assert _same(read.wandb_series(wdir, "abc123def456", "train/reward_mean"), [(1, 0.1), (2, 0.2), (3, 0.3)])
    assert read.wandb_series(wdir, "abc123def456", "eval/success") == [(0, 0.25)]
    rows = read.wandb_history(wdir, "abc123def456")
    assert any(r.get("train/staleness_hist/_type") == "histogram" for r in rows) or any(
        isinstance(r.get("train/staleness_hist"), dict) for r in rows)
    assert any("samples/train/_type" in r or isinstance(r.get("samples/train"), dict) for r in rows)
    # --resume: the same wandb run id; steps 3-4 logged again against the step axis
    _run("wandb", tmp_path, range(3, 5), resume_step=2, offset=1.0)
    series = read.wandb_series(wdir, "abc123def456", "train/reward_mean")
    assert _same(series[-2:], [(3, 1.3), (4, 1.4)])
    config = read.wandb_config(wdir, "abc123def456")
    assert {k: config[k] for k in CONFIG} == CONFIG, "the resolved config goes as the run's config"


def test_mlflow_file_store(tmp_path: Path) -> None:
    _need("mlflow")
    _run("mlflow", tmp_path, range(1, 4))
    state = json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]
    uri = f"file://{tmp_path / 'mlruns'}"
    assert state["tracking_uri"] == uri and state["experiment"] == "agentrl-test"
    assert _same(read.mlflow_series(uri, state["run_id"], "train/reward_mean"), [(1, 0.1), (2, 0.2), (3, 0.3)])
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=uri).get_run(state["run_id"])
    assert run.data.params["trainer.lr"] == "0.0002" and run.data.params["env"] == "calc"
    assert run.info.status == "FINISHED"
    _run("mlflow", tmp_path, range(3, 5), resume_step=2, offset=1.0)
    assert json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]["run_id"] == state["run_id"]
    series = dict(read.mlflow_series(uri, state["run_id"], "train/reward_mean"))
    assert series[4] == pytest.approx(1.4)


def test_trackio_local(tmp_path: Path) -> None:
    _need("trackio")
    _run("trackio", tmp_path, range(1, 4))
    assert _same(read.trackio_series("agentrl-test", "run", "train/reward_mean"), [(1, 0.1), (2, 0.2), (3, 0.3)])
    logs = read.trackio_logs("agentrl-test", "run")
    assert any(isinstance(r.get("train/staleness_hist"), dict) for r in logs)
    assert any(isinstance(r.get("samples/train"), dict) for r in logs)
    _run("trackio", tmp_path, range(3, 5), resume_step=2, offset=1.0)
    assert _same(read.trackio_series("agentrl-test", "run", "train/reward_mean")[-1:], [(4, 1.4)])


def test_mlflow_default_store_stays_beside_the_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without MLFLOW_TRACKING_URI: a SQLite database and the artifacts next to the run directories, nothing
    in the working directory."""
    _need("mlflow")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    _run("mlflow", tmp_path, range(1, 3))
    state = json.loads((tmp_path / "run" / "trackers.json").read_text())["mlflow"]
    assert state["tracking_uri"] == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _same(read.mlflow_series(state["tracking_uri"], state["run_id"], "train/reward_mean"), [(1, 0.1), (2, 0.2)])
    assert list((tmp_path / "mlflow-artifacts").rglob("step_2.json")), "the sample table is an artifact beside the runs"
    assert not any(cwd.iterdir())


def test_wandb_reader_finds_every_start_of_a_run(tmp_path: Path) -> None:
    """Two starts of one run within a second: wandb names the second directory ``...-<id>-1``."""
    names = ["offline-run-20261126_005137-abc-1", "offline-run-20261126_005136-abc", "offline-run-20261126_005137-abc",
             "offline-run-20261126_005137-abcd"]
    for n in names:
        (tmp_path / n).mkdir()
        (tmp_path / n / f"run-{n.split('-')[3]}.wandb").write_bytes(b"")
    assert [p.parent.name for p in read._wandb_logs(tmp_path, "abc")] == [names[1], names[2], names[0]]
