"""Whether a saved LoRA adapter fits a base model, checked before any server starts.

Two checks, both from what is on disk and cheap at any model size (no tensor is loaded):

- shapes: every tensor of the adapter against the base's weight of the same module, read from the
  safetensors headers (a LoRA ``A`` takes the base weight's inputs, a ``B`` gives its outputs; a tensor
  trained whole has the base tensor's shape);
- a fingerprint of the base recorded at training time against the chosen base's: two models of one shape
  (a model and its fine-tune) differ in it. The fingerprint hashes ``config.json`` and, of each weights file,
  its name, its size and 16 evenly spaced 64 KiB samples of its bytes (the header among them): any training
  changes them, and reading them costs milliseconds where hashing the whole file would take minutes.

A base that does not fit is refused with :class:`BaseMismatch`, one sentence naming both.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError

_SAMPLES = 16
_SAMPLE_BYTES = 64 * 1024
_VOLATILE = ("transformers_version", "_name_or_path", "use_cache")
"""``config.json`` keys that a re-save changes without changing the model: left out of the fingerprint."""


class BaseMismatch(ConfigError, ValueError):
    """A saved adapter does not fit the base model chosen for it (another shape, or another model)."""

    code = "config.base_mismatch"


def weight_files(model: str | Path) -> list[Path]:
    """The safetensors files of a model directory, by name (none: not a local directory, or no safetensors)."""
    d = Path(model)
    return sorted(d.glob("*.safetensors")) if d.is_dir() else []


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape, read from the headers of safetensors ``files`` (no tensor is loaded)."""
    out: dict[str, tuple[int, ...]] = {}
    for path in files:
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        out.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return out


def fingerprint(model: str | Path) -> str | None:
    """The model directory's fingerprint (see the module docstring), or None where it is not a local
    directory with a ``config.json``."""
    d = Path(model)
    if not (d / "config.json").is_file():
        return None
    config = {k: v for k, v in json.loads((d / "config.json").read_text()).items() if k not in _VOLATILE}
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    files = weight_files(d) or sorted(d.glob("*.bin"))
    for path in files:
        size = path.stat().st_size
        h.update(f"{path.name}:{size}".encode())
        with path.open("rb") as f:
            for i in range(_SAMPLES):
                f.seek(max(0, (size - _SAMPLE_BYTES) * i // (_SAMPLES - 1)))
                h.update(f.read(_SAMPLE_BYTES))
    return h.hexdigest()[:16]


def _base_name(adapter_key: str) -> tuple[str, int | None]:
    """The base weight an adapter tensor applies to, and the axis of it that must agree (None: all)."""
    key = adapter_key.removeprefix("base_model.model.")
    for part, axis in ((".lora_A.weight", 1), (".lora_B.weight", 0)):
        if key.endswith(part):
            return key[: -len(part)] + ".weight", axis
    return key.replace(".modules_to_save.default", ""), None


def shape_problem(adapter: str | Path, model: str | Path) -> str | None:
    """Why the adapter's tensors do not fit the base model's weights (None: they do, or the base's weights
    cannot be read here: not a local safetensors directory)."""
    base = tensor_shapes(weight_files(model))
    weights = Path(adapter) / "adapter_model.safetensors"
    if not base or not weights.is_file():
        return None
    own = tensor_shapes([weights])
    found = 0
    for key, shape in sorted(own.items()):
        name, axis = _base_name(key)
        want = base.get(name)
        if want is None:
            continue
        found += 1
        got, need = (shape, want) if axis is None else ((shape[axis],), (want[axis],))
        if got != need:
            what = "its shape" if axis is None else ("its input size" if axis == 1 else "its output size")
            return f"{name} has {what} {list(need)} in the model, {list(got)} in the adapter"
    if own and not found:
        return f"the model has none of the adapter's modules (such as {_base_name(next(iter(own)))[0]})"
    return None


def check_fits(adapter: str | Path, model: str, *, trained_on: str | None, digest: str | None) -> None:
    """Raise :class:`BaseMismatch` when the adapter cannot be served on ``model``: its tensors' shapes do not
    fit, or the fingerprint of the base it was trained on (``digest``, recorded at training time; None: none
    recorded) differs from ``model``'s."""
    subject = f"the adapter {adapter}" + (f", trained on {trained_on}," if trained_on else "")
    problem = shape_problem(adapter, model)
    if problem:
        raise BaseMismatch(f"{subject} does not fit the model {model} ({problem}); {_advice(model, trained_on)}")
    now = fingerprint(model) if digest else None
    if digest and now and now != digest:
        raise BaseMismatch(f"{subject} does not fit the model {model}: that is another model than the one it was "
                           f"trained on (fingerprint {now}, not {digest}); {_advice(model, trained_on)}")


def _advice(model: str, trained_on: str | None) -> str:
    if trained_on and trained_on != model:
        return f"leave --model out to serve it on {trained_on}"
    return "serve it on the model it was trained on"


def adapter_config(adapter: str | Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json`` (peft's)."""
    return json.loads((Path(adapter) / "adapter_config.json").read_text())
