"""Building and finding agentrl's CPU LoRA kernel (agentrl.engine.native_lora): engines load a build made for
this source and machine, or none (never a stale one, never a compile); a failed build never fails the install.
What the kernel computes is tested against the torch ops in test_cpu_lora.py."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from agentrl.engine import native_lora


@pytest.fixture(autouse=True)
def fresh_cache():
    native_lora.kernel.cache_clear()
    yield
    native_lora.kernel.cache_clear()


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert native_lora.enabled({}) and native_lora.enabled({native_lora.ENV_SWITCH: "1"})
    assert not native_lora.enabled({native_lora.ENV_SWITCH: "0"})
    assert not native_lora.enabled({native_lora.ENV_SWITCH: "off"})
    monkeypatch.setenv(native_lora.ENV_SWITCH, "0")
    assert native_lora.kernel() is None and native_lora.tile() == 0


def test_a_changed_source_is_another_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "k.cpp"
    src.write_text("// one")
    monkeypatch.setattr(native_lora, "SOURCE", src)
    first = native_lora.build_name()
    assert first == native_lora.build_name() and first.startswith("agentrl_lora_cpu_")
    src.write_text("// two")
    assert native_lora.build_name() != first


def test_no_build_is_no_kernel_and_no_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(native_lora.DIR_ENV, str(tmp_path))
    monkeypatch.setattr(native_lora, "build", lambda **_: pytest.fail("an engine must never compile"))
    assert native_lora.kernel() is None
    stale = tmp_path / "agentrl_lora_cpu_000000000000"
    stale.mkdir()
    (stale / "agentrl_lora_cpu_000000000000.so").write_bytes(b"not this build")
    assert native_lora.kernel() is None
    assert list(tmp_path.iterdir()) == [stale]


def test_a_failed_build_is_reported_and_not_an_install_failure(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def fails(verbose: bool = False) -> Path:
        raise RuntimeError("Error building extension: g++ not found")

    monkeypatch.setattr(native_lora, "build", fails)
    assert native_lora.main(["build"]) == 0
    err = capsys.readouterr().err
    assert "was not built (RuntimeError: Error building extension: g++ not found)" in err and "torch ops" in err
    assert native_lora.main([]) == 2
