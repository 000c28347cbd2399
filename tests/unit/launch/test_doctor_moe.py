"""`agentrl doctor` on mixture-of-experts models: the ``moe`` key of its report, read from ``config.json``
(tiny configs next to a Qwen2.5 test tokenizer; no weights, no engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentrl.launch.doctor import WORKER_CAPTURE, diagnose, routing_capture_path
from tests.fixtures_families import FAMILIES, build_family_tokenizer

DENSE = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 480}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 480,
             "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True}
DEEPSEEK_V3 = {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
               "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4, "n_group": 4,
               "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "vocab_size": 480}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qwen25_tok")
    build_family_tokenizer(FAMILIES["qwen2.5"], out)
    return out


def _model(tokenizer_dir: Path, tmp_path: Path, config: dict[str, Any]) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tokenizer_dir, model)
    (model / "config.json").write_text(json.dumps(config))
    return model


def test_a_dense_model_has_no_moe(tokenizer_dir: Path, tmp_path: Path) -> None:
    report = diagnose(_model(tokenizer_dir, tmp_path, DENSE), "hermes")
    assert report.problems == [], report.text()
    assert json.loads(report.model_dump_json())["moe"] is None
    assert "MoE" not in report.text()


def test_a_supported_moe_reports_experts_top_k_and_routing_capture(tokenizer_dir: Path, tmp_path: Path) -> None:
    report = diagnose(_model(tokenizer_dir, tmp_path, QWEN3_MOE), "hermes")
    assert report.problems == [], report.text()
    moe = json.loads(report.model_dump_json())["moe"]
    assert moe == {"experts": 8, "top_k": 2, "family": "qwen3_moe", "routing_capture": True,
                   "capture_path": routing_capture_path()}
    assert moe["capture_path"] == WORKER_CAPTURE  # this machine runs the CPU build of vLLM
    text = report.text()
    assert "MoE model:                  qwen3_moe, 8 experts, top-2" in text
    assert "cannot serve LoRA" in text and "merged weights" in text


def test_an_unsupported_moe_family_is_a_failed_check(tokenizer_dir: Path, tmp_path: Path) -> None:
    report = diagnose(_model(tokenizer_dir, tmp_path, DEEPSEEK_V3), "hermes")
    assert not report.ok
    assert [p for p in report.problems if "'deepseek_v3'" in p and "routing replay does not support" in p]
    moe = json.loads(report.model_dump_json())["moe"]
    assert (moe["experts"], moe["top_k"], moe["family"], moe["routing_capture"]) == (16, 4, "deepseek_v3", False)
    assert "deepseek_v3" in moe["error"]
    from agentrl.launch.doctor import check_model

    with pytest.raises(ValueError, match="deepseek_v3"):
        check_model(tmp_path / "model", "hermes")


def test_an_unsupported_moe_without_readable_counts_still_fails(tokenizer_dir: Path, tmp_path: Path) -> None:
    report = diagnose(_model(tokenizer_dir, tmp_path, {"model_type": "glm4_moe"}), "hermes")
    assert report.moe is None
    assert any("'glm4_moe'" in p for p in report.problems), report.text()


def test_a_missing_model_directory_keeps_the_tokenizer_problem(tmp_path: Path) -> None:
    report = diagnose(tmp_path / "absent", "hermes")
    assert report.moe is None
    assert len(report.problems) == 1 and report.problems[0].startswith("cannot load a tokenizer")


def test_a_gpu_build_with_triton_captures_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed vLLM has ``enable_return_routed_experts`` and Triton is importable: as a GPU build it
    returns routed experts itself; without Triton agentrl's worker capture is used."""
    import importlib.util

    import agentrl.config.facts as facts
    from agentrl.launch.doctor import VLLM_NATIVE

    monkeypatch.setattr(facts, "cpu_build", lambda: False)
    if importlib.util.find_spec("triton") is None:
        pytest.skip("Triton is not installed")
    assert routing_capture_path() == VLLM_NATIVE
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else find_spec(name, *a))
    assert routing_capture_path() == WORKER_CAPTURE
