"""The pinned embedded models: the built tiny models ship with agentrl as files, checked by digest.

Every machine used to build its own embedded model, and the build is not the same everywhere: its warm-up
runs hundreds of AdamW steps through CPU matrix kernels whose summation order depends on the instruction
set (AVX2 or AVX-512) and the thread count, and it stops on a sampled probe, a discrete decision that a
last-bit difference can move. The same seed stopped at step 400 on one 2-core AVX2 machine, at step 425
on another and at step 925 on an AVX-512 one, and the three models started ``make train`` from different
policies (greedy success 0.52 to 0.74). Making the build bit-identical across CPU types would mean
replacing the CPU's matrix kernels, so the built models ship instead: about 4.7 MB of float32 weights
each, in ``agentrl/launch/pinned_models/<name>/`` (package data, so a wheel carries them too).

:func:`install_pinned` copies a pinned model into place (``models/tiny`` by default) and checks every file
against the sha256 manifest below; a directory that already holds exactly those files is left alone.
``agentrl model tiny --build`` still rebuilds a model from the recipe (`agentrl.tools.modelgen.tiny`).

To pin a new build: build it (``agentrl model tiny --build --out DIR``), copy its files into
``agentrl/launch/pinned_models/<name>/`` with a model card (``README.md``), add ``"pinned"`` to its marker
(name, version, the weights' sha256), bump the version here and paste :func:`manifest`'s output into
the model's ``files``; the unit tests check the files against it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.core.errors import AgentRLError, ConfigError

log = logging.getLogger(__name__)

MARKER = "agentrl_model.json"
"""The marker file of a model directory agentrl wrote (an embedded model, pinned or built, or a conversion)."""

PINNED_ROOT = Path(__file__).parent / "pinned_models"
"""Where the pinned models' files live inside the package."""

WEIGHTS = "model.safetensors"


class ModelDirOccupied(ConfigError, ValueError):
    """The directory a model is to be written into holds files that are not an embedded model of agentrl's."""

    code = "config.model_dir_occupied"


def read_marker(out_dir: Path) -> dict[str, Any] | None:
    """The marker of a built model directory, or None."""
    try:
        return json.loads((Path(out_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """Hold the exclusive lock of ``out_dir`` (a lock file beside it): builds and installs of one directory
    run one at a time."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def check_replaceable(out_dir: Path) -> None:
    """Refuse to write a model into ``out_dir`` when it holds files but no marker: those are not an embedded
    model of agentrl's, and nothing else is overwritten."""
    if out_dir.is_dir() and any(not p.name.startswith(".") for p in out_dir.iterdir()) and read_marker(out_dir) is None:
        raise ModelDirOccupied(f"{out_dir} holds files that are not an embedded model (no {MARKER}); move them away, "
                         "or pass another directory")


class PinnedModelDamaged(AgentRLError, RuntimeError):
    """A pinned model's files do not match its manifest: in agentrl's own install, or in the copy just made."""

    code = "modelgen.pinned_damaged"


@dataclass(frozen=True)
class PinnedModel:
    """One pinned model: its name (the directory under :data:`PINNED_ROOT`), its version and the sha256
    of every file it ships."""

    name: str
    version: int
    files: Mapping[str, str]
    """File name -> sha256 of its bytes."""
    root: Path = PINNED_ROOT
    """The directory holding the pinned models' directories."""

    @property
    def source(self) -> Path:
        """The directory holding the shipped files."""
        return self.root / self.name

    @property
    def weights_sha256(self) -> str:
        """The weight digest: the sha256 of ``model.safetensors``."""
        return self.files[WEIGHTS]

    @property
    def label(self) -> str:
        """``name-vN``, as logs and model cards name it."""
        return f"{self.name}-v{self.version}"


TINY = PinnedModel("tiny", 1, {
    "README.md": "5a566d1e54d4fa6e1034e3197849e777f8991b8d86a153b3419a71c05cba2862",
    "agentrl_model.json": "5beac6ab80e4f4cd081aa15c7d3bf72321d55ee16289482660ebeedfc6049fe3",
    "chat_template.jinja": "b1cf50ac9d354262534afb6edc78c18e1e868ce3c0942ea04d23daf4bc86e507",
    "config.json": "e07dd10d2d65f5def4c067d9f1aa5da62b99ac35845b7d4b5d0761147e9826d8",
    "generation_config.json": "af6491f6c99225b00ce50606a7a66dfcb17122a3c675768e13d14df515fa54f0",
    "model.safetensors": "ef656652c41b575cb8a20840374ebaa0eb32e3ee5b4bdee8418dfc62a5076835",
    "tokenizer.json": "b3b11e71828a946b6557f1230d5e01ae8140cf7a785f740dd132f9f17a3657f5",
    "tokenizer_config.json": "dddaa11295e9b02fee5a7b7732833256b6290cbcfd111a36547f91475ac3c9da",
})
"""The embedded dense model (Qwen2, 1.17M parameters): seed 1, warm-up stopped at step 400 with probe
success 0.31. Its model card (``README.md``) has its measured greedy and sampled success."""

TINY_MOE = PinnedModel("tiny-moe", 1, {
    "README.md": "8a091ba0ffb68c04ddc52b15a8625b0896ca736fb9a310f7dbc33cfe439d6268",
    "agentrl_model.json": "0e6e68f51868476d9246a20a4e5c64f2b6759d7bb7be98b0a9fbb1e22016da20",
    "chat_template.jinja": "b1cf50ac9d354262534afb6edc78c18e1e868ce3c0942ea04d23daf4bc86e507",
    "config.json": "4f6a0ec9b7db07b23d5fae3417d3771bd80452a2f6f2b68083c02fb10ee18e41",
    "generation_config.json": "af6491f6c99225b00ce50606a7a66dfcb17122a3c675768e13d14df515fa54f0",
    "model.safetensors": "794a2f2209eb5d17ceeadb89480a51e6510cc5feacb8ffce89facdaf04fdf6ca",
    "tokenizer.json": "b3b11e71828a946b6557f1230d5e01ae8140cf7a785f740dd132f9f17a3657f5",
    "tokenizer_config.json": "dddaa11295e9b02fee5a7b7732833256b6290cbcfd111a36547f91475ac3c9da",
})
"""The embedded mixture-of-experts model (Qwen3-MoE, 8 experts, top-2, 1.18M parameters): seed 1, warm-up
stopped at its first probe, step 300, with success 0.41. Its model card has its measured success."""


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def manifest(directory: Path) -> dict[str, str]:
    """File name -> sha256 of every regular file directly in ``directory`` (hidden files left out)."""
    return {p.name: file_sha256(p) for p in sorted(Path(directory).iterdir())
            if p.is_file() and not p.name.startswith(".")}


def differences(directory: Path, model: PinnedModel) -> list[str]:
    """How ``directory`` differs from ``model``'s files (empty: it holds every one of them, byte for byte;
    other files beside them are ignored)."""
    out = []
    for name, digest in model.files.items():
        path = Path(directory) / name
        if not path.is_file():
            out.append(f"{name} is missing")
        elif file_sha256(path) != digest:
            out.append(f"{name} differs")
    return out


def install_pinned(out_dir: Path, model: PinnedModel) -> Path:
    """Put ``model``'s files into ``out_dir`` and return it; a no-op when they are already there.

    A directory that holds another build of an embedded model (its marker file says so) is replaced, with a
    log line. A directory that holds files but no marker is not an embedded model: it is refused, never
    overwritten. The copy is checked against the manifest before it replaces anything, and the swap is done
    under the build lock, so concurrent installs and builds of one directory are serialised.
    """
    out_dir = Path(out_dir)
    if not differences(out_dir, model):
        return out_dir
    bad = differences(model.source, model)
    if bad:  # a damaged install of agentrl itself: say so rather than ship other weights
        raise PinnedModelDamaged(f"the pinned model {model.label} in {model.source} is damaged ({'; '.join(bad)}): "
                           "reinstall agentrl")
    with locked(out_dir):
        if not differences(out_dir, model):  # installed by another process while we waited
            return out_dir
        check_replaceable(out_dir)
        old = read_marker(out_dir)
        if old is not None:
            log.info("replacing %s (%s) with the pinned model %s", out_dir,
                     old.get("pinned", {}).get("label") or f"a local build, digest {old.get('digest')}", model.label)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp_name:
            tmp = Path(tmp_name)
            for name in model.files:
                shutil.copyfile(model.source / name, tmp / name)
            bad = differences(tmp, model)
            if bad:
                raise PinnedModelDamaged(f"copying the pinned model {model.label} to {out_dir} failed: {'; '.join(bad)}")
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / MARKER).unlink(missing_ok=True)  # the marker goes last: a torn swap is never up to date
            for name in model.files:
                if name != MARKER:
                    os.replace(tmp / name, out_dir / name)
            os.replace(tmp / MARKER, out_dir / MARKER)
    return out_dir


def pinned_info(directory: Path) -> dict[str, object] | None:
    """The ``pinned`` record of a directory's marker (name, version, label, weights sha256), or None for a
    local build or a directory that is not an embedded model."""
    marker = read_marker(Path(directory))
    info = marker.get("pinned") if marker else None
    return info if isinstance(info, dict) else None


DEFAULT_TINY_DIR = Path("models/tiny")
"""Where the tiny model is installed by default (relative to the current directory)."""

DEFAULT_TINY_MOE_DIR = Path("models/tiny-moe")
"""Where the tiny MoE model is installed by default (relative to the current directory)."""


EMBEDDED: dict[Path, PinnedModel] = {DEFAULT_TINY_DIR: TINY, DEFAULT_TINY_MOE_DIR: TINY_MOE}
"""Default directory -> the pinned model it holds."""


def embedded_model(directory: str | Path) -> PinnedModel | None:
    """The pinned model that ``directory`` holds by default (it is ``models/tiny`` or ``models/tiny-moe``,
    relative to the current directory), else None."""
    resolved = Path(directory).resolve()
    return next((m for d, m in EMBEDDED.items() if d.resolve() == resolved), None)


def ensure_embedded(directory: str | Path) -> Path:
    """Install the pinned model of a default directory (a no-op when it is in place) and return the
    directory; any other directory is returned as it is. A run calls it before its engines start."""
    model = embedded_model(directory)
    return install_pinned(Path(directory), model) if model is not None else Path(directory)


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - a maintainer's helper
    """Print the manifest of a directory as JSON (``python -m agentrl.launch.pinned DIR``)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    print(json.dumps(manifest(Path(args[0])), indent=4))


if __name__ == "__main__":  # pragma: no cover
    main()
