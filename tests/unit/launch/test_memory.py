"""The trainer memory estimate: parameter counts from config.json against transformers' own models, and the
per-rank rule for full weights and LoRA."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrl.config.run import load_config
from agentrl.config.trainer import TrainerConfig
from agentrl.launch.memory import (
    FROZEN_BYTES_PER_PARAM,
    FULL_BYTES_PER_PARAM,
    SYNC_BUCKET_BYTES,
    DecoderShape,
    read_shape,
    sync_bucket_bytes,
    trainer_bytes_per_rank,
    trainer_memory_note,
)
from agentrl.launch.placement import plan_run


def tiny_config() -> dict[str, Any]:
    """The embedded tiny model's config.json (Qwen2, tied embeddings, q/k/v biases)."""
    from agentrl.tools.modelgen.tiny import ModelShape, model_config

    return model_config(953, ModelShape(), 2, 0).to_dict()


def _meta_numel(config: dict[str, Any]) -> int:
    """Parameters of the model transformers builds from ``config`` (on the meta device: no memory)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return sum(p.numel() for p in model.parameters())  # a tied head is one parameter, counted once


OTHERS = {
    "llama-gqa-untied-bias": {"model_type": "llama", "vocab_size": 500, "hidden_size": 64, "intermediate_size": 160,
                              "num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
                              "tie_word_embeddings": False, "attention_bias": True},
    "qwen3-head-dim": {"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                       "tie_word_embeddings": True},
    "mistral": {"model_type": "mistral", "vocab_size": 320, "hidden_size": 96, "intermediate_size": 200,
                "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 3,
                "tie_word_embeddings": False},
    "mixtral-moe": {"model_type": "mixtral", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                    "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False},
}


def test_tiny_model_parameter_count_matches_transformers() -> None:
    config = tiny_config()
    assert DecoderShape.from_config(config).params() == _meta_numel(config)


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_families_parameter_counts_match_transformers(name: str) -> None:
    config = OTHERS[name]
    assert DecoderShape.from_config(config).params() == _meta_numel(config)


def test_lora_parameter_count_matches_peft() -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = tiny_config()
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=targets, task_type="CAUSAL_LM"))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert DecoderShape.from_config(config).lora_params(8, targets) == trainable


def test_full_weights_need_four_times_the_lora_memory_per_parameter() -> None:
    shape = DecoderShape.from_config(OTHERS["llama-gqa-untied-bias"])
    params = shape.params()
    full = TrainerConfig(model_path="m", lora=False)
    lora = TrainerConfig(model_path="m", lora_rank=4)
    assert sync_bucket_bytes(shape) == params * 4  # a small model is one bucket
    assert trainer_bytes_per_rank(shape, full, 4) == params * FULL_BYTES_PER_PARAM // 4 + params * 4
    adapter = shape.lora_params(4, lora.lora_target_modules)
    assert trainer_bytes_per_rank(shape, lora, 4) == (params * FROZEN_BYTES_PER_PARAM + adapter * 16) // 4
    big = DecoderShape(vocab=152064, hidden=3584, layers=28, intermediate=18944, heads=28, kv_heads=4,
                       head_dim=128, tied=False, qkv_bias=True, o_bias=False, qk_norm=False)  # Qwen2.5-7B
    assert round(big.params() / 1e9, 2) == 7.62
    embedding = 152064 * 3584 * 4  # the largest tensor, gathered whole: bigger than one bucket
    assert big.largest_tensor() * 4 == embedding > SYNC_BUCKET_BYTES
    assert trainer_bytes_per_rank(big, full, 8) == big.params() * 16 // 8 + embedding  # 14.2 GiB + 2.0 GiB
    note = trainer_memory_note(big, full, 8)
    assert note.startswith("trainer memory: ~16.2 GiB per rank (full weights: fp32 params + grads + AdamW states")
    assert "7.6B parameters, sharded over 8 ranks" in note
    assert "LoRA: frozen fp32 base of 7.6B parameters" in trainer_memory_note(big, lora, 8)


def test_dry_run_plan_notes_the_trainer_memory(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(tiny_config()))
    gpus = [str(i) for i in range(8)]
    full = plan_run(load_config(None, {"env": "calc", "model": str(tmp_path), "trainer": {"lora": False}}).resolved(),
                    gpus=gpus)
    notes = [n for n in full.notes if n.startswith("trainer memory")]
    assert len(notes) == 1 and "full weights" in notes[0] and "sharded over 4 ranks" in notes[0]
    assert notes[0] in full.render()
    lora = plan_run(load_config(None, {"env": "calc", "model": str(tmp_path)}).resolved(), gpus=[])
    assert any(n.startswith("trainer memory") and "LoRA" in n and "over 1 rank;" in n for n in lora.notes)
    # no config.json to read (a hub id, a model not built yet): no estimate, and no error
    assert read_shape(str(tmp_path / "missing")) is None
    hub = plan_run(load_config(None, {"env": "calc", "model": "org/model"}).resolved(), gpus=gpus)
    assert not any(n.startswith("trainer memory") for n in hub.notes)
