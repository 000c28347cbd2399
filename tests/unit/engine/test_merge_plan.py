"""The engine-side merge of a LoRA adapter (``agentrl.engine.merge``), as pure logic: from the served checkpoint
and the adapter's packed tensors, the tensors fed to vLLM's weight loading equal peft's own merge, every layer
the adapter reaches gets all its tensors (packed siblings, biases), and a bad adapter is refused before any
load. The real engine's merge is tested against vLLM's LoRA serving in tests/integration/test_merged_sync.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agentrl.engine.adapter_plan import UpdateError
from agentrl.engine.merge import Checkpoint, build_merge_plan, lora_module
from agentrl.weight_sync.inplace import layout_views, pack_layout

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _model(tmp_path: Path, targets: list[str], alpha_pattern: dict | None = None, norms: bool = False,
           embedding: bool = False):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                        tie_word_embeddings=embedding))
    save_file({n: p.detach().clone().contiguous() for n, p in base.named_parameters()}, tmp_path / "model.safetensors")
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                            alpha_pattern=alpha_pattern or {},
                                            modules_to_save=["norm"] if norms else None))
    if embedding:  # as trainer.lora_train_embedding does it
        model.get_input_embeddings().weight.requires_grad_(True)
    with torch.no_grad():  # a non-zero adapter (B starts at zero), trained norms away from one
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
            elif "modules_to_save" in name:
                p.uniform_(0.5, 1.5)
            elif "embed_tokens" in name and p.requires_grad:
                p.add_(torch.randn_like(p))
    return model


def _adapter(model) -> tuple[dict, torch.Tensor]:
    """The adapter as the publisher packs it: its layout (the engine's meta) and the packed buffer."""
    from agentrl.trainer.model import adapter_state

    # base_model.model.<module>.lora_A.weight, and what trains whole
    tensors = {n: t.contiguous() for n, t in adapter_state(model, model.state_dict()).items()}
    layout, nbytes = pack_layout(tensors)
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    torch._foreach_copy_(layout_views(buf, layout), [tensors[n] for n, *_ in layout])
    return {"nbytes": nbytes, "tensors": layout}, buf


def _scaling(model):
    lora_cfg = model.peft_config["default"]
    return lambda module: lora_cfg.alpha_pattern.get(module.rsplit(".", 1)[-1], lora_cfg.lora_alpha) / lora_cfg.r


def test_the_merge_feeds_peft_merged_weights_with_packed_siblings_and_biases(tmp_path: Path) -> None:
    model = _model(tmp_path, ["q_proj", "v_proj", "down_proj"], alpha_pattern={"down_proj": 2})
    meta, buf = _adapter(model)
    kept: dict = {}
    plan = build_merge_plan(meta, buf, PACKED, Checkpoint(str(tmp_path)), kept, torch.float32, _scaling(model))
    got = {n: t.clone() for n, t in plan.merged()}
    layer0 = sorted(n for n in got if ".layers.0." in n)
    # q and v are merged, k (packed with them into qkv_proj) goes too, and the three biases; down_proj alone
    assert layer0 == sorted([f"model.layers.0.self_attn.{m}_proj.{p}" for m in "qkv" for p in ("weight", "bias")]
                            + ["model.layers.0.mlp.down_proj.weight"])
    assert len(plan.terms) == 6 and len(kept) == len(got) == 14
    want = dict(model.merge_and_unload().named_parameters())
    for name, t in got.items():
        torch.testing.assert_close(t, want[name].detach(), rtol=1e-6, atol=1e-6)
    # the next sync starts from the kept base again: the same adapter merges to the same weights
    again = dict(plan.merged())
    for name, t in got.items():
        torch.testing.assert_close(again[name], t, rtol=0, atol=0)


def test_norms_trained_beside_the_adapter_replace_the_served_ones(tmp_path: Path) -> None:
    """``trainer.lora_train_norms``: the norms cross whole (peft's modules_to_save) and are loaded as they are,
    beside the merged linear layers: together what peft's own merge gives."""
    from agentrl.trainer.model import NORMS

    model = _model(tmp_path, ["q_proj", "down_proj"], norms=True)
    assert list(NORMS) == model.peft_config["default"].modules_to_save == ["norm"]
    meta, buf = _adapter(model)
    whole = [n for n, *_ in meta["tensors"] if ".lora_" not in n]
    assert len(whole) == 2 * 2 + 1, whole  # each layer's two norms and the final one
    plan = build_merge_plan(meta, buf, PACKED, Checkpoint(str(tmp_path)), {}, torch.float32, _scaling(model))
    got = {n: t.clone() for n, t in plan.merged()}
    assert len(plan.whole) == 5 and "model.norm.weight" in got and "model.layers.1.input_layernorm.weight" in got
    want = dict(model.merge_and_unload().named_parameters())
    for name, t in got.items():
        torch.testing.assert_close(t, want[name].detach(), rtol=1e-6, atol=1e-6)
    assert not torch.equal(got["model.norm.weight"], torch.ones_like(got["model.norm.weight"]))
    # a tensor the served model lacks, or of another shape, is refused
    bad = [[n.replace("model.norm", "model.extra_norm"), *rest] for n, *rest in meta["tensors"]]
    with pytest.raises(UpdateError, match=r"extra_norm\.weight: the adapter carries it whole, but the served"):
        build_merge_plan({**meta, "tensors": bad}, buf, PACKED, Checkpoint(str(tmp_path)), {}, torch.float32,
                         _scaling(model))


def test_a_bad_adapter_is_refused(tmp_path: Path) -> None:
    model = _model(tmp_path, ["q_proj"])
    meta, buf = _adapter(model)
    ckpt = Checkpoint(str(tmp_path))
    only_a = {**meta, "tensors": [t for t in meta["tensors"] if ".lora_A." in t[0]]}
    with pytest.raises(UpdateError, match="the adapter has lora_A only"):
        build_merge_plan(only_a, buf, PACKED, ckpt, {}, torch.float32, lambda m: 1.0)
    wide = [[n, d, [s[0], s[1] + 1] if ".lora_A." in n else s, o] for n, d, s, o in meta["tensors"]]
    with pytest.raises(UpdateError, match=r"does not fit the base weight \[32, 32\]"):
        build_merge_plan({**meta, "tensors": wide}, torch.zeros(meta["nbytes"] * 2, dtype=torch.uint8), PACKED,
                         ckpt, {}, torch.float32, lambda m: 1.0)
    with pytest.raises(UpdateError, match="not a LoRA tensor name"):
        lora_module("model.layers.0.self_attn.q_proj.weight")
    with pytest.raises(UpdateError, match="no safetensors files"):
        Checkpoint(str(tmp_path / "nowhere"))


def test_a_call_bodys_payload_is_decoded_into_a_buffer_kept_per_layout() -> None:
    import base64

    from agentrl.engine.adapter_plan import decode_payload

    bufs: dict = {}
    data = bytes(range(10))
    buf, new = decode_payload(bufs, "layout-1", base64.b64encode(data).decode(), 10)
    assert new and bytes(buf[:10].tolist()) == data
    again, new = decode_payload(bufs, "layout-1", base64.b64encode(data[::-1]).decode(), 10)
    assert not new and again is buf and bytes(buf[:10].tolist()) == data[::-1]  # the same buffer, rewritten
    _, new = decode_payload(bufs, "layout-2", base64.b64encode(data).decode(), 10)
    assert new and list(bufs) == ["layout-2"]  # the older layout's buffer is dropped
    with pytest.raises(UpdateError, match="payload is 10 bytes, the layout says 12"):
        decode_payload(bufs, "layout-2", base64.b64encode(data).decode(), 12)
    with pytest.raises(ValueError):
        decode_payload(bufs, "layout-2", "not base64!", 10)


def test_norms_trained_whole_get_the_full_weight_rate(tmp_path: Path) -> None:
    """The optimizer's groups: the adapter at the run's rate, the norms trained beside it at the full-weight
    rate the adapter's is derived from (``lr / LORA_LR_SCALE``)."""
    from agentrl.config.trainer import LORA_LR_SCALE
    from agentrl.trainer.model import optimizer_groups

    model = _model(tmp_path, ["q_proj"], norms=True)
    adapter, norms = optimizer_groups(model)
    assert adapter["lr_scale"] == 1.0 and norms["lr_scale"] == 1.0 / LORA_LR_SCALE
    assert len(adapter["params"]) == 2 * 2 and len(norms["params"]) == 5  # q's A and B per layer; 5 norms
    assert [g["lr_scale"] for g in optimizer_groups(_model(tmp_path, ["q_proj"]))] == [1.0]


def test_an_embedding_trained_beside_the_adapter_replaces_the_served_one_with_its_tied_output(
        tmp_path: Path) -> None:
    """``trainer.lora_train_embedding``: the input embedding crosses whole once (the output layer is the same
    tensor) and is loaded as it is, beside the merged linear layers: what peft's own merge gives. It trains at
    the full-weight rate, like the norms."""
    from agentrl.config.trainer import LORA_LR_SCALE
    from agentrl.trainer.model import optimizer_groups, trained_whole

    model = _model(tmp_path, ["q_proj"], embedding=True)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    assert trained_whole(model) == {"base_model.model.model.embed_tokens.weight"}
    _, whole = optimizer_groups(model)
    assert len(whole["params"]) == 1 and whole["lr_scale"] == 1.0 / LORA_LR_SCALE
    meta, buf = _adapter(model)
    assert [n for n, *_ in meta["tensors"] if ".lora_" not in n] == ["base_model.model.model.embed_tokens.weight"]
    plan = build_merge_plan(meta, buf, PACKED, Checkpoint(str(tmp_path)), {}, torch.float32, _scaling(model))
    got = {n: t.clone() for n, t in plan.merged()}
    assert list(plan.whole) == ["model.embed_tokens.weight"]
    want = dict(model.merge_and_unload().named_parameters())
    for name, t in got.items():
        torch.testing.assert_close(t, want[name].detach(), rtol=1e-6, atol=1e-6)
    base = Checkpoint(str(tmp_path)).read(["model.embed_tokens.weight"])["model.embed_tokens.weight"]
    assert not torch.allclose(got["model.embed_tokens.weight"], base)
