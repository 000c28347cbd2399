"""Patch 22: vLLM's CPU platform check turns compilation off for any engine with LoRA; with agentrl's fast path
the check runs with the LoRA config hidden (compilation stays as without LoRA) and gives it back; the LoRA
linear layers become one custom op in the graph. The compiled engine's outputs against merged adapters are
tested on the real engine (tests/integration/test_cpu_lora_fast.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.platforms.cpu")

from vllm.platforms.cpu import CpuPlatform  # noqa: E402

from agentrl.engine import cpu_lora, vllm_patches  # noqa: E402


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """CpuPlatform.check_and_update_config replaced by one that records the LoRA config it sees."""
    seen: list[Any] = []

    def original(cls: Any, vllm_config: Any) -> None:
        seen.append(vllm_config.lora_config)

    monkeypatch.setattr(CpuPlatform, "check_and_update_config", classmethod(original))
    return seen


def test_the_check_runs_without_the_lora_config_and_gives_it_back(recorded: list[Any],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cpu_lora.COMPILE_ENV, raising=False)
    monkeypatch.delenv(cpu_lora.ENV_SWITCH, raising=False)
    assert vllm_patches.patch_cpu_compile_with_lora()
    assert vllm_patches.patch_cpu_compile_with_lora()  # idempotent: one wrap
    lora = object()
    config = SimpleNamespace(lora_config=lora)
    CpuPlatform.check_and_update_config(config)
    assert recorded == [None] and config.lora_config is lora
    plain = SimpleNamespace(lora_config=None)
    CpuPlatform.check_and_update_config(plain)
    assert recorded == [None, None] and plain.lora_config is None


@pytest.mark.parametrize("env", [cpu_lora.COMPILE_ENV, cpu_lora.ENV_SWITCH])
def test_switched_off_it_keeps_vllms_rule(recorded: list[Any], monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv(env, "0")
    assert not vllm_patches.patch_cpu_compile_with_lora()
    lora = object()
    CpuPlatform.check_and_update_config(SimpleNamespace(lora_config=lora))
    assert recorded == [lora]


@pytest.mark.parametrize("case", ["one adapter", "adapters and none"])
def test_the_compiled_op_serves_what_the_eager_path_serves(case: str) -> None:
    """The op a traced LoRA layer becomes finds its wrapper by key and serves that step's grouping."""
    from tests.unit.engine.test_cpu_lora import CASES, HIDDEN, SLICES, _stacked, _wrapper

    assert vllm_patches.patch_cpu_lora_fast_path(force=True)
    slots, lens = CASES[case]
    w = _wrapper(slots, lens)  # its metadata step registered it
    n = sum(lens)
    a, b = _stacked(11, 3, HIDDEN, SLICES)
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(12))
    y0 = torch.randn(n, sum(SLICES), generator=torch.Generator().manual_seed(13))
    eager, compiled = y0.clone(), y0.clone()
    w.add_lora_linear(eager, x, a, b, 0.5, SLICES)
    before = cpu_lora.CALLS["compiled"]
    cpu_lora._OP[0](compiled, x, list(a), list(b), 0.5, list(SLICES), cpu_lora.wrapper_key(w))
    assert cpu_lora.CALLS["compiled"] == before + 1
    assert not torch.equal(eager, y0)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_a_wrapper_keeps_its_key() -> None:
    w = SimpleNamespace()
    k = cpu_lora.wrapper_key(w)
    assert cpu_lora.wrapper_key(w) == k and cpu_lora.WRAPPERS[k] is w
    assert cpu_lora.wrapper_key(SimpleNamespace()) != k
