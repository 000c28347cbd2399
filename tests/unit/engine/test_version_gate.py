"""The version contract of the vLLM patches, without vLLM: a mismatch refuses (installing nothing, and every
method that needs the patches answers with a failure record), an explicit override accepts, a local build tag
such as ``+cpu`` is ignored."""

from __future__ import annotations

import base64
import json
import re
from types import SimpleNamespace
from typing import Any

import pytest

from agentrl.core.errors import EngineError
from agentrl.engine import install, version_gate, vllm_patches
from agentrl.engine.extension import WorkerExtension
from agentrl.engine.version_gate import (
    ALLOW_ENV,
    VLLM_VERSION_REFUSED,
    VLLMVersionRefused,
    check_vllm_version,
)

GATED = {"agentrl_update_lora", "agentrl_update_lora_bytes", "agentrl_begin_weights", "agentrl_load_weights",
         "agentrl_load_weights_bytes", "agentrl_finish_weights", "agentrl_load_weights_from_path",
         "agentrl_merge_lora", "agentrl_merge_lora_bytes", "agentrl_routing_enable", "agentrl_routing_take",
         "agentrl_masks_enable", "agentrl_masks_take"}


@pytest.fixture(autouse=True)
def _no_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW_ENV, raising=False)


@pytest.mark.parametrize("running", ["0.32.0", "0.32.0+cpu", "0.32.0+cu129"])
def test_the_written_for_version_passes_whatever_its_local_tag(running: str) -> None:
    assert check_vllm_version("0.32.0", running=running) == running
    assert vllm_patches.check_vllm_version(running=running) == running


def test_a_mismatch_refuses_naming_both_versions_and_the_override() -> None:
    with pytest.raises(VLLMVersionRefused) as info:
        check_vllm_version("0.32.0", running="0.33.1+cpu")
    e = info.value
    assert isinstance(e, EngineError) and isinstance(e, RuntimeError) and e.code == VLLM_VERSION_REFUSED
    msg = str(e)
    assert "written for vLLM 0.32.0" in msg and "runs vLLM 0.33.1+cpu" in msg
    assert f"{ALLOW_ENV}=0.33.1" in msg and f"{ALLOW_ENV}=any" in msg


@pytest.mark.parametrize(("running", "allow"), [("0.33.1", "0.33.1"), ("0.33.1+cpu", "0.33.1"),
                                                ("0.33.1", "0.33.1+cpu"), ("0.33.1", "any"), ("unknown", "any")])
def test_an_explicit_override_accepts(running: str, allow: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_vllm_version("0.32.0", running=running, allow=allow) == running
    monkeypatch.setenv(ALLOW_ENV, allow)  # read from the engine process's environment
    assert check_vllm_version("0.32.0", running=running) == running


def test_an_override_for_another_version_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ALLOW_ENV, "0.33.0")
    with pytest.raises(VLLMVersionRefused, match=re.escape(f"{ALLOW_ENV}=0.33.0 names another version")):
        check_vllm_version("0.32.0", running="0.34.0")
    with pytest.raises(VLLMVersionRefused):
        check_vllm_version("0.32.0", running="unknown")


def _fake_patches(monkeypatch: pytest.MonkeyPatch, running: str) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(version_gate, "running_vllm_version", lambda: running)
    for name in ("patch_lora_worker_manager", "patch_router_tap", "patch_moe_reload_prepack"):
        monkeypatch.setattr(vllm_patches, name, lambda *a, _n=name: calls.append(_n))
    return calls


def test_a_refused_install_touches_nothing_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    calls = _fake_patches(monkeypatch, "0.99.0")
    outcome = install.install_in_worker(install.Installed())
    assert calls == [] and isinstance(outcome.refused, VLLMVersionRefused) and not outcome.error
    err = capsys.readouterr().err
    assert "vLLM patches refused" in err and "0.99.0" in err and ALLOW_ENV in err
    assert install.install_in_worker(outcome) is outcome and calls == []  # once per process


def test_an_overridden_install_installs(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_patches(monkeypatch, "0.99.0+cpu")
    monkeypatch.setenv(ALLOW_ENV, "0.99.0")
    outcome = install.install_in_worker(install.Installed())
    assert outcome.refused is None and calls == ["patch_lora_worker_manager", "patch_router_tap",
                                                 "patch_moe_reload_prepack"]


def _call(worker: Any, method: str) -> Any:
    args = {"agentrl_update_lora": ("a", "seg", "{}"), "agentrl_update_lora_bytes": ("a", "", "{}"),
            "agentrl_load_weights": ("seg", "8", "0", "{}"), "agentrl_load_weights_bytes": ("", "{}"),
            "agentrl_load_weights_from_path": ("/nowhere",), "agentrl_routing_take": ("r",),
            "agentrl_masks_take": ("r",)}
    return getattr(worker, method)(*args.get(method, ()))


def test_the_extension_answers_a_refusal_with_a_failure_record(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = VLLMVersionRefused("written for vLLM 0.32.0, runs vLLM 0.99.0")
    monkeypatch.setattr(install, "OUTCOME", install.Installed(attempted=True, refused=refused))
    gated = {m for m in dir(WorkerExtension) if m.startswith("agentrl_")
             and hasattr(getattr(WorkerExtension, m), "__wrapped__")}
    assert gated == GATED
    worker = WorkerExtension()
    for method in sorted(GATED):
        rec = _call(worker, method)
        assert rec == {"ok": False, "code": VLLM_VERSION_REFUSED, "error": str(refused)}, method
        json.dumps(rec)  # crosses vLLM's collective_rpc route as JSON
    assert worker.agentrl_lora_stats()["file_loads"] >= 0  # needs no patch: still answers
    assert worker.agentrl_write_adapter("../x", "{}")["code"] == "weight_sync.write_failed"


def test_without_a_refusal_the_methods_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "OUTCOME", install.Installed())  # outside a worker: nothing attempted
    worker = WorkerExtension()
    worker.model_runner = SimpleNamespace(lora_manager=SimpleNamespace(_adapter_manager=None))
    payload = base64.b64encode(b"\0" * 8).decode()
    rec = worker.agentrl_update_lora_bytes("7", payload, json.dumps({"nbytes": 8, "tensors": []}))
    assert rec["code"] == "weight_sync.update_refused"  # LoRA not enabled: the method itself ran
    assert worker.agentrl_routing_take("r")["code"] == "routing.unavailable"
