"""``tinker://`` checkpoint paths and where they live under the server's state directory.

A path is ``tinker://{model_id}/weights/{name}`` (``save_state``/``save_weights``: the adapter with its
optimizer state) or ``tinker://{model_id}/sampler_weights/{name}`` (``save_weights_for_sampler``: the
adapter only), as the SDK parses them. On disk: ``{dir}/checkpoints/{owner}/{model_id}/{kind}/{name}/``
with a ``meta.json`` naming its owner, so a checkpoint survives a restart and only its owner can load it.
``{dir}/checkpoints/{owner}/{model_id}/run.json`` describes the training run (:mod:`agentrl.tinker.runs`)."""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.tinker.errors import TinkerNotFound, TinkerUserError

KINDS = ("weights", "sampler_weights")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_RUN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:._-]{0,199}$")


@dataclass(frozen=True)
class Checkpoint:
    path: str
    """The ``tinker://`` path."""
    model_id: str
    kind: str
    name: str
    dir: Path

    def meta(self) -> dict[str, Any]:
        """Its ``meta.json`` (empty when it is missing or unreadable)."""
        try:
            return json.loads((self.dir / "meta.json").read_text())
        except (OSError, ValueError):
            return {}

    def size_bytes(self) -> int:
        """The bytes of its files."""
        return sum(f.stat().st_size for f in self.dir.rglob("*") if f.is_file())


def _check_name(name: str) -> str:
    if not _NAME.match(name) or ".." in name:
        raise TinkerUserError(f"checkpoint name {name!r}: letters, digits, '.', '_' and '-' only (at most 128)")
    return name


class Checkpoints:
    """The checkpoints under ``root`` (``{dir}/checkpoints``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self, owner: str, model_id: str, kind: str, name: str) -> Path:
        return self.run_dir(owner, model_id) / kind / name

    def run_dir(self, owner: str, model_id: str) -> Path:
        """The directory of ``model_id``'s checkpoints (and its ``run.json``); :class:`TinkerNotFound` for an id
        no model can have."""
        if not _RUN.match(model_id):
            raise TinkerNotFound(f"no training run {model_id!r} for this API key")
        return self.root / owner / model_id.replace(":", "_")

    def of_run(self, owner: str, model_id: str) -> list[Checkpoint]:
        """The complete checkpoints of ``model_id`` that ``owner`` saved, oldest first."""
        out: list[tuple[float, Checkpoint]] = []
        for kind in KINDS:
            kind_dir = self.run_dir(owner, model_id) / kind
            for sub in sorted(kind_dir.iterdir()) if kind_dir.is_dir() else []:
                ckpt = Checkpoint(f"tinker://{model_id}/{kind}/{sub.name}", model_id, kind, sub.name, sub)
                meta = ckpt.meta()
                if meta.get("owner") == owner and meta.get("path") == ckpt.path:
                    out.append((float(meta.get("created", 0.0)), ckpt))
        return [c for _, c in sorted(out, key=lambda tc: (tc[0], tc[1].path))]

    def delete(self, path: str, owner: str) -> None:
        """Remove ``owner``'s checkpoint at ``path``: its ``meta.json`` first (from then on it is not found),
        then its files."""
        ckpt = self.find(path, owner)
        (ckpt.dir / "meta.json").unlink(missing_ok=True)
        shutil.rmtree(ckpt.dir, ignore_errors=True)

    def new(self, owner: str, model_id: str, kind: str, name: str, *, overwrite: bool = True) -> Checkpoint:
        """Where checkpoint ``name`` of ``model_id`` goes (its directory is not made yet)."""
        _check_name(name)
        path = f"tinker://{model_id}/{kind}/{name}"
        out = self._dir(owner, model_id, kind, name)
        if out.exists() and not overwrite:
            raise TinkerUserError(f"checkpoint {path} exists; save under another name or with overwrite=True")
        return Checkpoint(path, model_id, kind, name, out)

    @staticmethod
    def seal(ckpt: Checkpoint, owner: str, meta: dict[str, Any]) -> None:
        """Write ``meta.json`` last: a checkpoint without it is not complete and is not found."""
        (ckpt.dir / "meta.json").write_text(json.dumps({**meta, "owner": owner, "path": ckpt.path,
                                                         "created": time.time()}))

    def find(self, path: str, owner: str) -> Checkpoint:
        """The complete checkpoint at ``path`` owned by ``owner``; :class:`TinkerNotFound` otherwise (another
        owner's checkpoint is not found either)."""
        if not path.startswith("tinker://"):
            raise TinkerUserError(f"{path!r} is not a tinker:// path")
        parts = path[len("tinker://"):].split("/")
        if len(parts) != 3 or parts[1] not in KINDS or not _RUN.match(parts[0]):
            raise TinkerUserError(f"{path!r}: a checkpoint path is tinker://MODEL_ID/weights/NAME or "
                                  "tinker://MODEL_ID/sampler_weights/NAME")
        model_id, kind, name = parts[0], parts[1], _check_name(parts[2])
        ckpt = Checkpoint(path, model_id, kind, name, self._dir(owner, model_id, kind, name))
        if ckpt.meta().get("owner") != owner:
            raise TinkerNotFound(f"no checkpoint {path} for this API key")
        return ckpt
