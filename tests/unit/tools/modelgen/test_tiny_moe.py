"""The tiny Mixture-of-Experts model: the same builder with `MOE_SHAPE` gives a Qwen3-MoE directory (8 experts,
top-2, every layer) that transformers loads, in a directory whose marker never matches the dense model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.tools.modelgen import (
    DEFAULT_TINY_DIR,
    DEFAULT_TINY_MOE_DIR,
    MOE_SHAPE,
    ModelShape,
    build_tiny_model,
    read_marker,
)
from agentrl.tools.modelgen.tiny import BuildConfig

STEPS = 2


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-moe") / "model", seed=0, warmup_steps=STEPS, shape=MOE_SHAPE, progress=False
    )


def test_saved_config_is_qwen3_moe(built: Path) -> None:
    from transformers import AutoConfig

    config = json.loads((built / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["num_local_experts"] == 8 and config["num_experts_per_tok"] == 2  # num_experts, as saved
    assert AutoConfig.from_pretrained(built).num_experts == 8
    assert config["moe_intermediate_size"] == MOE_SHAPE.moe_intermediate_size
    assert config["norm_topk_prob"] is True and config["output_router_logits"] is False
    assert config["decoder_sparse_step"] == 1 and config["mlp_only_layers"] == []
    assert config["head_dim"] == 64 and config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["tie_word_embeddings"] is True
    marker = read_marker(built)
    assert marker is not None and marker["architecture"] == "Qwen3MoeForCausalLM"
    assert marker["config"]["shape"]["num_experts"] == 8 and marker["warmup_steps_run"] == STEPS


def test_loads_with_auto_classes_and_generates(built: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    assert isinstance(model, Qwen3MoeForCausalLM) and model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Ann has 2 apples."}], add_generation_prompt=True, return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_moe_and_dense_configs_never_collide(built: Path) -> None:
    dense = BuildConfig(seed=0, shape=ModelShape())
    moe = BuildConfig(seed=0, shape=MOE_SHAPE)
    assert dense.digest() != moe.digest()
    # a dense shape hashes as before MoE shapes existed: built dense models stay up to date
    assert not {"num_experts", "experts_per_token", "moe_intermediate_size"} & set(dense.to_json()["shape"])
    assert not ModelShape().is_moe and MOE_SHAPE.is_moe
    assert DEFAULT_TINY_MOE_DIR != DEFAULT_TINY_DIR and not DEFAULT_TINY_MOE_DIR.is_absolute()


def test_cli_moe_flag_picks_shape_and_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import agentrl.tools.modelgen
    from agentrl import cli

    built: list[tuple[Path, dict]] = []
    installed: list[tuple[Path, str]] = []
    monkeypatch.setattr(agentrl.tools.modelgen, "build_tiny_model", lambda out, **kw: built.append((out, kw)) or out)
    monkeypatch.setattr(agentrl.tools.modelgen, "install_pinned", lambda out, m: installed.append((out, m.label)) or out)
    for args in (["--moe", "--build"], ["--moe", "--build", "--out", str(tmp_path)], ["--build"], ["--moe"], []):
        r = CliRunner().invoke(cli.app, ["model", "tiny", *args])
        assert r.exit_code == 0, r.output
    assert built[0] == (DEFAULT_TINY_MOE_DIR, {"force": False, "shape": MOE_SHAPE})
    assert built[1] == (tmp_path, {"force": False, "shape": MOE_SHAPE})
    assert built[2] == (DEFAULT_TINY_DIR, {"force": False})
    assert installed == [(DEFAULT_TINY_MOE_DIR, "tiny-moe-v1"), (DEFAULT_TINY_DIR, "tiny-v1")]


def test_cli_build_options_need_build() -> None:
    from typer.testing import CliRunner

    from agentrl import cli

    r = CliRunner().invoke(cli.app, ["model", "tiny", "--seed", "3"])
    assert r.exit_code != 0 and "--seed only apply to a build: add --build" in r.output
