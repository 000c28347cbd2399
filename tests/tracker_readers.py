"""Each tracker's logged series, read back through that tracker's own reader (for the tracker tests)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` as TensorBoard's event reader shows it (purged steps removed)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def tensorboard_tags(log_dir: Path) -> dict[str, list[str]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc.Tags()


def _wandb_log_records(path: Path):
    """The records of a ``.wandb`` transaction log: a 7-byte header, then LevelDB-log blocks of 32 KiB whose
    records (4-byte CRC, 2-byte length, 1-byte type: full, first, middle, last) hold protobuf messages."""
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb transaction log"
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # block padding
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            yield chunk
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            yield buf + chunk
            buf = b""


def _wandb_logs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The transaction logs of every start of offline run ``run_id``, oldest first: directories are
    ``offline-run-<time>-<id>``, with ``-1``, ``-2``, ... added when two starts fall in the same second."""
    logs = Path(wandb_dir).glob(f"**/offline-run-*-{run_id}*/run-{run_id}.wandb")
    return sorted(logs, key=lambda p: (p.parent.name.split("-")[2], len(p.parent.name), p.parent.name))


def wandb_history(wandb_dir: Path, run_id: str) -> list[dict[str, Any]]:
    """The history rows (``run.log`` calls) of every offline run ``run_id`` under ``wandb_dir``, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for log in _wandb_logs(wandb_dir, run_id):
        for raw in _wandb_log_records(log):
            rec = pb.Record()
            rec.ParseFromString(raw)
            if rec.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows


def wandb_config(wandb_dir: Path, run_id: str) -> dict[str, Any]:
    """The config the offline runs ``run_id`` under ``wandb_dir`` recorded (later updates win)."""
    from wandb.proto import wandb_internal_pb2 as pb

    config: dict[str, Any] = {}
    for log in _wandb_logs(wandb_dir, run_id):
        for raw in _wandb_log_records(log):
            rec = pb.Record()
            rec.ParseFromString(raw)
            kind = rec.WhichOneof("record_type")
            items = rec.config.update if kind == "config" else rec.run.config.update if kind == "run" else []
            config.update({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items})
    return config


def wandb_series(wandb_dir: Path, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), r[key]) for r in wandb_history(wandb_dir, run_id) if key in r]


def mlflow_series(tracking_uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in MlflowClient(tracking_uri=tracking_uri).get_metric_history(run_id, key)]


def trackio_logs(project: str, run: str) -> list[dict[str, Any]]:
    from trackio.sqlite_storage import SQLiteStorage

    return SQLiteStorage.get_logs(project, run)


def trackio_series(project: str, run: str, key: str) -> list[tuple[int, float]]:
    return [(int(r["step"]), r[key]) for r in trackio_logs(project, run) if key in r]
