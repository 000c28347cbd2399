"""Run directories: one run per directory, never clobbered, and a resume that is checked.

A run directory holds ``run.json``, its identity: a run id, and what its checkpoints depend on (the
environment, the model and the LoRA configuration). The rules:

- A new run with no ``--name`` takes the environment's name, with the first free numeric suffix
  (``runs/calc``, ``runs/calc-2``, ...): running the same command twice keeps both runs.
- A new run with an explicit ``--name`` whose directory already holds files is refused; the message
  names ``--resume`` and ``--name``.
- ``--resume`` continues ``--name`` (or, without it, the latest run of the default name) and refuses a
  run whose identity differs, listing each difference. Everything else may change on resume (steps,
  time limit, evaluation and logging, endpoints, trainer world size: checkpoints are resharded).

Claiming a directory is atomic (``run.json`` is published with a hard link, which fails if it exists),
so two runs started at once never share one.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from agentrl.config.run import RunConfig, default_run_name
from agentrl.core.errors import ConfigError
from agentrl.core.utils.atomic import write_atomic

RUN_FILE = "run.json"
IDENTITY_FIELDS = ("env", "model", "lora")
"""What a checkpoint depends on: a resume that changes one of them is refused."""


class RunDirError(ConfigError, ValueError):
    """The run directory cannot be used as asked; the message says why and what to pass instead."""

    code = "config.run_dir"


def identity(cfg: RunConfig) -> dict[str, Any]:
    """The fields of ``cfg`` that a run's checkpoints depend on."""
    model = Path(cfg.model)
    t = cfg.trainer
    return {
        "env": cfg.env,
        "model": str(model.resolve()) if model.exists() else cfg.model,
        "lora": {"enabled": t.lora, "rank": t.lora_rank, "alpha": t.lora_alpha,
                 "target_modules": t.lora_modules} if t.lora else {"enabled": False},
    }


def differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``field: saved -> now`` for each identity field that differs (nested fields by dotted name)."""
    out: list[str] = []
    for key in sorted(set(saved) | set(now)):
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += [f"{key}.{d}" for d in differences(a, b)]
        elif a != b:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def _holds_outputs(d: Path) -> bool:
    return d.is_dir() and any(d.iterdir())


def _claim(d: Path, record: dict[str, Any]) -> bool:
    """Publish ``run.json`` in ``d`` unless one is there already (atomic); True when this call made it."""
    d.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{RUN_FILE}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(record, indent=2))
        os.link(tmp, d / RUN_FILE)
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def _runs_of(output_dir: Path, base: str) -> list[Path]:
    """Existing run directories named ``base`` or ``base-N``, oldest suffix first."""
    pattern = re.compile(rf"^{re.escape(base)}(?:-(\d+))?$")
    found = [(int(m.group(1) or 1), p) for p in output_dir.glob(f"{base}*")
             if (m := pattern.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def read_run(d: Path) -> dict[str, Any]:
    """The identity record of run directory ``d``. A run written before run ids existed gets one made from
    its ``config.json`` (and saved), so it can be resumed and checked like any other."""
    path = d / RUN_FILE
    if path.is_file():
        return json.loads(path.read_text())
    config = d / "config.json"
    if not config.is_file():
        raise RunDirError(f"{d} holds no run (no {RUN_FILE} and no config.json)")
    record = {"run_id": uuid.uuid4().hex[:12], "name": d.name, "created": time.time(),
              **identity(RunConfig.model_validate_json(config.read_text()))}
    write_atomic(path, json.dumps(record, indent=2))
    return record


def open_run(cfg: RunConfig, *, resume: bool) -> tuple[RunConfig, str]:
    """The config with its run name settled, and the run id; creates or checks the run directory."""
    base = cfg.name or default_run_name(cfg.env)
    now = identity(cfg)
    if resume:
        if cfg.name:
            d = cfg.output_dir / cfg.name
        else:
            runs = _runs_of(cfg.output_dir, base)
            d = runs[-1] if runs else cfg.output_dir / base
        if not _holds_outputs(d):
            raise RunDirError(f"--resume: there is no run in {d}; start one without --resume, or name the run "
                              "to continue with --name")
        saved = read_run(d)
        diff = differences({k: saved.get(k) for k in IDENTITY_FIELDS}, now)
        if diff:
            raise RunDirError(f"--resume: {d} is a different run; its checkpoints do not fit this config: "
                              + "; ".join(diff) + ". Resume with the run's own settings, or start a new run "
                              "(without --resume, or with another --name).")
        return cfg.model_copy(update={"name": d.name}), str(saved["run_id"])
    record = {"run_id": uuid.uuid4().hex[:12], "created": time.time(), **now}
    if cfg.name:
        d = cfg.output_dir / cfg.name
        if _holds_outputs(d) or not _claim(d, {**record, "name": cfg.name}):
            raise RunDirError(f"{d} already holds a run; continue it with --resume, or start a new one with "
                              "another --name (or none: a free name is chosen)")
        return cfg, record["run_id"]
    for n in range(1, 10_000):
        name = base if n == 1 else f"{base}-{n}"
        d = cfg.output_dir / name
        if not _holds_outputs(d) and _claim(d, {**record, "name": name}):
            return cfg.model_copy(update={"name": name}), record["run_id"]
    raise RunDirError(f"no free run name {base}-N in {cfg.output_dir}")  # pragma: no cover
