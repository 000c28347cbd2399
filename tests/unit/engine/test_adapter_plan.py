"""The in-place copy plan (agentrl.engine.adapter_plan.build_plan) on a stand-in LoRA manager: a linear
layer's slot is written through views of its stacked buffers (B scaled as vLLM folds it at load), so is the
output layer's (one stacked tensor per side, laid out as a linear slice), in one copy once its slots share the
segment's layout; the token embedding's LoRA (its A transposed) is refused with an UpdateError that names it,
which sends the publisher to a file load."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.lora.utils")

from agentrl.engine.adapter_plan import UpdateError, build_plan  # noqa: E402

R, IN, OUT, SLOTS = 4, 8, 6, 2


def _manager(layer: object, lw: object, module: str) -> tuple[SimpleNamespace, SimpleNamespace]:
    manager = SimpleNamespace(model=SimpleNamespace(), packed_modules={}, modules={module: layer})
    return manager, SimpleNamespace(id=1, loras={module: lw})


def _meta(names_shapes: list[tuple[str, tuple[int, ...]]]) -> tuple[dict, torch.Tensor]:
    tensors, off = [], 0
    for name, shape in names_shapes:
        tensors.append([name, "float32", list(shape), off])
        off += 4 * int(torch.Size(shape).numel())
    return {"tensors": tensors, "nbytes": off, "scaling": 2.0}, torch.zeros(off, dtype=torch.uint8)


def test_a_linear_layers_slot_is_planned() -> None:
    module = "model.layers.0.mlp.down_proj"
    layer = SimpleNamespace(lora_a_stacked=(torch.zeros(SLOTS, 1, R, IN),),
                            lora_b_stacked=(torch.zeros(SLOTS, 1, OUT, R),), tp_size=1)
    lw = SimpleNamespace(lora_a=torch.zeros(R, IN), lora_b=torch.zeros(OUT, R))
    manager, lora_model = _manager(layer, lw, module)
    meta, buf = _meta([(f"base_model.model.{module}.lora_A.weight", (R, IN)),
                       (f"base_model.model.{module}.lora_B.weight", (OUT, R))])
    buf.view(torch.float32).fill_(1.0)
    with torch.inference_mode():
        plan = build_plan(manager, lora_model, 1, buf, meta, None)
        plan.copy()
        for scale, views in plan.scales.items():
            torch._foreach_mul_(views, scale)
    assert torch.equal(layer.lora_a_stacked[0][1, 0], torch.ones(R, IN))
    assert torch.equal(layer.lora_b_stacked[0][1, 0], torch.full((OUT, R), 2.0))  # B scaled by alpha / r
    assert not layer.lora_a_stacked[0][0].any()  # the other slot untouched


def test_the_output_layers_slot_is_planned_and_laid_out_for_one_copy() -> None:
    module, vocab = "lm_head", 10
    linear = "model.layers.0.mlp.down_proj"
    head = SimpleNamespace(lora_a_stacked=torch.zeros(SLOTS, 1, R, IN), lora_b_stacked=torch.zeros(SLOTS, 1, vocab, R),
                           tp_size=1)
    layer = SimpleNamespace(lora_a_stacked=(torch.zeros(SLOTS, 1, R, IN),),
                            lora_b_stacked=(torch.zeros(SLOTS, 1, OUT, R),), tp_size=1)
    manager = SimpleNamespace(model=SimpleNamespace(), packed_modules={}, modules={module: head, linear: layer})
    lws = {module: SimpleNamespace(lora_a=torch.zeros(R, IN), lora_b=torch.zeros(vocab, R)),
           linear: SimpleNamespace(lora_a=torch.zeros(R, IN), lora_b=torch.zeros(OUT, R))}
    lora_model = SimpleNamespace(id=1, loras=lws)
    meta, buf = _meta([(f"base_model.model.{linear}.lora_A.weight", (R, IN)),
                       (f"base_model.model.{linear}.lora_B.weight", (OUT, R)),
                       (f"base_model.model.{module}.lora_A.weight", (R, IN)),
                       (f"base_model.model.{module}.lora_B.weight", (vocab, R))])
    meta["b_scaled"] = 2.0
    values = torch.arange(buf.numel() // 4, dtype=torch.float32)
    buf.view(torch.float32).copy_(values)
    with torch.inference_mode():
        plan = build_plan(manager, lora_model, 1, buf, meta, None)
        assert plan.copy() == 1  # the slots now share the segment's layout: one copy
    n_a, n_b = R * IN, vocab * R
    off = R * IN + OUT * R  # the output layer's tensors follow the linear layer's
    assert isinstance(head.lora_a_stacked, torch.Tensor) and head.lora_a_stacked.shape == (SLOTS, 1, R, IN)
    assert torch.equal(head.lora_a_stacked[1, 0], values[off:off + n_a].view(R, IN))
    assert torch.equal(head.lora_b_stacked[1, 0], values[off + n_a:off + n_a + n_b].view(vocab, R))
    assert torch.equal(layer.lora_a_stacked[0][1, 0], values[:R * IN].view(R, IN))
    assert not head.lora_a_stacked[0].any() and not head.lora_b_stacked[0].any()  # the other slot untouched


def test_an_embedding_lora_is_refused_by_name() -> None:
    module = "model.embed_tokens"
    vocab = 10
    layer = SimpleNamespace(lora_a_stacked=torch.zeros(SLOTS, vocab, R), lora_b_stacked=torch.zeros(SLOTS, 1, OUT, R),
                            tp_size=1)
    lw = SimpleNamespace(lora_a=torch.zeros(R, vocab), lora_b=torch.zeros(OUT, R))
    manager, lora_model = _manager(layer, lw, module)
    meta, buf = _meta([(f"base_model.model.{module}.lora_embedding_A", (R, vocab)),
                       (f"base_model.model.{module}.lora_embedding_B", (OUT, R))])
    with pytest.raises(UpdateError, match=r"embed_tokens .* not a linear or output layer's LoRA"):
        build_plan(manager, lora_model, 0, buf, meta, None)
