"""The merged-LoRA weights a LoRA trainer publishes to engines without LoRA (MoE on vLLM's CPU build)."""

from __future__ import annotations

import pytest
import torch


def _lora_model(targets: list[str]):
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         num_experts=4, num_experts_per_tok=2)
    model = get_peft_model(Qwen3MoeForCausalLM(cfg), LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():  # a non-zero adapter (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def test_published_weights_are_the_touched_modules_and_their_packed_siblings() -> None:
    from agentrl.trainer.weights import weight_specs

    names = [n for n, _ in weight_specs(_lora_model(["q_proj", "o_proj"]))]
    layer0 = [n for n in names if ".layers.0." in n]
    # q is wrapped, so k and v (packed with it into qkv_proj by the engine) go too; o alone
    assert layer0 == [f"model.layers.0.self_attn.{m}_proj.weight" for m in ("q", "k", "v", "o")]
    assert len(names) == 8 and not any("lora" in n or "base_layer" in n or "experts" in n for n in names)


def test_merged_tensors_equal_peft_merge() -> None:
    from agentrl.trainer.weights import _merged_tensors, weight_specs

    model = _lora_model(["q_proj", "v_proj"])
    specs = weight_specs(model)
    layout = [(name, "float32", shape, 0) for name, shape in specs]
    got = dict(zip([n for n, _ in specs], _merged_tensors(model, layout), strict=True))
    base_q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    assert (got["model.layers.0.self_attn.q_proj.weight"] - base_q).abs().max() > 1e-3  # the adapter is in
    merged = model.merge_and_unload()
    want = dict(merged.named_parameters())
    for name, t in got.items():
        torch.testing.assert_close(t, want[name].detach(), rtol=1e-6, atol=1e-6)


def test_adapters_on_parameters_are_refused() -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    from agentrl.trainer.weights import weight_specs

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_experts=4,
                         num_experts_per_tok=2)
    model = get_peft_model(Qwen3MoeForCausalLM(cfg), LoraConfig(
        r=2, target_modules=["q_proj"], target_parameters=["mlp.experts.down_proj"]))
    with pytest.raises(NotImplementedError, match="targets parameters"):
        weight_specs(model)
