"""Training runs as the SDK's REST client lists them (``get_training_run``, ``list_training_runs``,
``list_checkpoints``, ``list_user_checkpoints``, ``delete_checkpoint``).

A training run is one training model (its id is the model's id). When its adapter is made the server writes
``run.json`` beside the model's checkpoints (``{dir}/checkpoints/{owner}/{model_id}/run.json``): the base
model, the LoRA shape and the ``user_metadata`` the client created it with, so a run outlives the server.
A run saved before ``run.json`` existed is described from its checkpoints (without ``user_metadata``).
Answers are the JSON of the SDK's ``TrainingRun``, ``Checkpoint``, ``TrainingRunsResponse`` and
``CheckpointsListResponse``."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

from agentrl.tinker.checkpoints import Checkpoint, Checkpoints
from agentrl.tinker.errors import TinkerNotFound, TinkerUserError
from agentrl.tinker.trainer import LoraSpec, read_spec

RUN_FILE = "run.json"
CHECKPOINT_TYPES = {"weights": "training", "sampler_weights": "sampler"}
"""A checkpoint's path segment and the SDK's ``checkpoint_type`` for it."""


def iso(t: float) -> str:
    """``t`` (seconds since the epoch) as an ISO 8601 UTC time."""
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="microseconds")


def string_metadata(meta: Any) -> dict[str, str] | None:
    """``user_metadata`` as the SDK types it (strings to strings); a value that is not a string is its JSON."""
    if not isinstance(meta, dict):
        return None
    return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in meta.items()}


def checkpoint_json(ckpt: Checkpoint) -> dict[str, Any]:
    """The SDK's ``Checkpoint`` for ``ckpt``; ``checkpoint_id`` is ``weights/NAME`` or ``sampler_weights/NAME``,
    as the SDK parses it out of a ``tinker://`` path."""
    meta = ckpt.meta()
    return {"checkpoint_id": f"{ckpt.kind}/{ckpt.name}", "checkpoint_type": CHECKPOINT_TYPES[ckpt.kind],
            "time": iso(float(meta.get("created", 0.0))), "tinker_path": ckpt.path, "size_bytes": ckpt.size_bytes(),
            "public": False, "user_metadata": string_metadata(meta.get("user_metadata")), "expires_at": None}


def page_bounds(limit: int, offset: int) -> None:
    """Refuse a negative ``limit`` or ``offset``."""
    if limit < 0 or offset < 0:
        raise TinkerUserError(f"limit {limit}, offset {offset}: both must be at least 0")


def cursor(limit: int, offset: int, total: int) -> dict[str, int]:
    """The SDK's ``Cursor``."""
    return {"offset": offset, "limit": limit, "total_count": total}


class Runs:
    """The training runs of every owner, on disk beside their checkpoints."""

    def __init__(self, checkpoints: Checkpoints) -> None:
        self.checkpoints = checkpoints

    def record(self, owner: str, model_id: str, *, base_model: str, spec: LoraSpec,
               user_metadata: dict[str, Any] | None) -> None:
        """Write ``model_id``'s ``run.json`` (replacing it whole: a reader never sees half of one)."""
        run_dir = self.checkpoints.run_dir(owner, model_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        record = {"model_id": model_id, "owner": owner, "base_model": base_model, "lora": spec.to_json(),
                  "user_metadata": user_metadata, "created": time.time()}
        tmp = run_dir / f".{RUN_FILE}.tmp"
        tmp.write_text(json.dumps(record))
        tmp.replace(run_dir / RUN_FILE)

    def _record(self, owner: str, model_id: str, ckpts: list[Checkpoint]) -> dict[str, Any]:
        """``run.json``, or for a run without one what its newest checkpoint tells; :class:`TinkerNotFound`
        for neither (or another owner's)."""
        try:
            record = json.loads((self.checkpoints.run_dir(owner, model_id) / RUN_FILE).read_text())
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and record.get("owner") == owner and record.get("model_id") == model_id:
            return record
        if not ckpts:
            raise TinkerNotFound(f"no training run {model_id!r} for this API key")
        newest = ckpts[-1]
        try:
            rank: int | None = read_spec(newest.dir).rank
        except (OSError, ValueError, TypeError):
            rank = None
        meta = newest.meta()
        return {"model_id": model_id, "owner": owner, "base_model": meta.get("base_model", ""),
                "lora": {"rank": rank}, "user_metadata": None,
                "created": min(float(c.meta().get("created", 0.0)) for c in ckpts)}

    def get(self, owner: str, model_id: str, *, last_request: float | None = None) -> dict[str, Any]:
        """The SDK's ``TrainingRun`` for ``owner``'s run ``model_id``; ``last_request`` is the time of the live
        model's last request, if it is loaded (else the run's newest checkpoint, or its creation)."""
        ckpts = self.checkpoints.of_run(owner, model_id)
        record = self._record(owner, model_id, ckpts)
        times = [float(record.get("created", 0.0)), *(float(c.meta().get("created", 0.0)) for c in ckpts)]
        if last_request is not None:
            times.append(last_request)
        training = [c for c in ckpts if c.kind == "weights"]
        sampler = [c for c in ckpts if c.kind == "sampler_weights"]
        return {"training_run_id": model_id, "base_model": record.get("base_model", ""), "model_owner": owner,
                "is_lora": True, "corrupted": False, "lora_rank": (record.get("lora") or {}).get("rank"),
                "last_request_time": iso(max(times)),
                "last_checkpoint": checkpoint_json(training[-1]) if training else None,
                "last_sampler_checkpoint": checkpoint_json(sampler[-1]) if sampler else None,
                "user_metadata": string_metadata(record.get("user_metadata"))}

    def ids(self, owner: str) -> list[str]:
        """The ids of ``owner``'s runs (with a ``run.json`` or a checkpoint), in no set order."""
        root = self.checkpoints.root / owner
        out = []
        for run_dir in sorted(root.iterdir()) if root.is_dir() else []:
            try:
                out.append(str(json.loads((run_dir / RUN_FILE).read_text())["model_id"]))
                continue
            except (OSError, ValueError, KeyError, TypeError):
                pass
            for meta in sorted(run_dir.glob("*/*/meta.json")):
                try:
                    path = str(json.loads(meta.read_text())["path"])
                except (OSError, ValueError, KeyError, TypeError):
                    continue
                out.append(path[len("tinker://"):].split("/")[0])
                break
        return out

    def page(self, owner: str, limit: int, offset: int,
             last_requests: dict[str, float] | None = None) -> dict[str, Any]:
        """The SDK's ``TrainingRunsResponse``: ``owner``'s runs, most recently used first, ``limit`` of them
        from ``offset``."""
        page_bounds(limit, offset)
        last_requests = last_requests or {}
        runs = []
        for model_id in self.ids(owner):
            try:
                runs.append(self.get(owner, model_id, last_request=last_requests.get(model_id)))
            except TinkerNotFound:  # removed meanwhile
                continue
        runs.sort(key=lambda r: (r["last_request_time"], r["training_run_id"]), reverse=True)
        return {"training_runs": runs[offset:offset + limit], "cursor": cursor(limit, offset, len(runs))}

    def list_checkpoints(self, owner: str, model_id: str) -> dict[str, Any]:
        """The SDK's ``CheckpointsListResponse`` for one run, oldest first (unpaginated)."""
        ckpts = self.checkpoints.of_run(owner, model_id)
        self._record(owner, model_id, ckpts)  # not found for an unknown run
        return {"checkpoints": [checkpoint_json(c) for c in ckpts], "cursor": None}

    def user_checkpoints(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        """The SDK's ``CheckpointsListResponse`` over all of ``owner``'s runs, newest first, paginated."""
        page_bounds(limit, offset)
        every = [checkpoint_json(c) for model_id in self.ids(owner) for c in self.checkpoints.of_run(owner, model_id)]
        every.sort(key=lambda c: (c["time"], c["tinker_path"]), reverse=True)
        return {"checkpoints": every[offset:offset + limit], "cursor": cursor(limit, offset, len(every))}

    def delete(self, owner: str, model_id: str, checkpoint_id: str) -> None:
        """Remove checkpoint ``checkpoint_id`` (``weights/NAME`` or ``sampler_weights/NAME``) of ``owner``'s run."""
        self.checkpoints.delete(f"tinker://{model_id}/{checkpoint_id}", owner)
