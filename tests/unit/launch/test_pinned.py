"""The pinned embedded models: the shipped files match their manifests, and installing them is exact, idempotent
and never overwrites what is not an embedded model."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from agentrl.launch.pinned import MARKER, differences, manifest, pinned_info
from agentrl.tools.modelgen import (
    DEFAULT_TINY_DIR,
    DEFAULT_TINY_MOE_DIR,
    TINY,
    TINY_MOE,
    PinnedModel,
    embedded_model,
    ensure_embedded,
    install_pinned,
)


@pytest.mark.parametrize("model", [TINY, TINY_MOE], ids=lambda m: m.label)
def test_shipped_files_match_the_manifest(model: PinnedModel) -> None:
    assert manifest(model.source) == dict(model.files)
    info = pinned_info(model.source)
    assert info is not None and info["label"] == model.label and info["version"] == model.version
    assert info["weights_sha256"] == model.weights_sha256
    assert (model.source / "README.md").is_file(), "every pinned model carries its model card"
    config = json.loads((model.source / "config.json").read_text())
    assert config["head_dim"] == 64 and config["torch_dtype" if "torch_dtype" in config else "dtype"] == "float32"


def test_the_two_models_are_the_dense_and_the_moe_architecture() -> None:
    dense = json.loads((TINY.source / "config.json").read_text())
    moe = json.loads((TINY_MOE.source / "config.json").read_text())
    assert dense["architectures"] == ["Qwen2ForCausalLM"] and moe["architectures"] == ["Qwen3MoeForCausalLM"]
    # one tokenizer for both: the build trains it from the same seed and corpus
    assert TINY.files["tokenizer.json"] == TINY_MOE.files["tokenizer.json"]


def test_install_copies_exactly_and_is_a_no_op_after(tmp_path: Path) -> None:
    out = install_pinned(tmp_path / "tiny", TINY)
    assert manifest(out) == dict(TINY.files)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    install_pinned(out, TINY)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tiny.") and p.is_dir()], "no temp dir left"


def test_a_changed_or_missing_file_is_reinstalled(tmp_path: Path) -> None:
    out = install_pinned(tmp_path / "tiny", TINY)
    (out / "model.safetensors").write_bytes(b"not weights")
    (out / "tokenizer.json").unlink()
    assert differences(out, TINY) == ["model.safetensors differs", "tokenizer.json is missing"]
    install_pinned(out, TINY)
    assert differences(out, TINY) == []


def test_a_local_build_is_replaced(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"digest": "0123456789abcdef", "config": {}}))
    (out / "model.safetensors").write_bytes(b"another build")
    install_pinned(out, TINY)
    assert differences(out, TINY) == [] and pinned_info(out)["label"] == TINY.label  # type: ignore[index]


def test_a_directory_of_other_files_is_refused_and_kept(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an embedded model"):
        install_pinned(out, TINY)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_damaged_source_is_an_error_not_a_silent_install(tmp_path: Path) -> None:
    damaged = dataclasses.replace(TINY, root=tmp_path / "root")
    shutil.copytree(TINY.source, damaged.source)
    (damaged.source / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"damaged \(config.json differs\)"):
        install_pinned(tmp_path / "out", damaged)
    assert not (tmp_path / "out").exists()


def test_default_directories_hold_the_pinned_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert embedded_model(DEFAULT_TINY_DIR) is TINY and embedded_model(DEFAULT_TINY_MOE_DIR) is TINY_MOE
    assert embedded_model("models/other") is None
    monkeypatch.chdir(tmp_path)
    assert embedded_model(tmp_path / "models" / "tiny") is TINY  # by resolved path, not by spelling
    assert ensure_embedded("elsewhere") == Path("elsewhere") and not (tmp_path / "elsewhere").exists()
    ensure_embedded("models/tiny")
    assert differences(tmp_path / "models" / "tiny", TINY) == []
