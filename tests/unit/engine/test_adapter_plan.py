"""The in-place copy plan (agentrl.engine.adapter_plan.build_plan) on a stand-in LoRA manager: a linear
layer's slot is written through views of its stacked buffers (B scaled as vLLM folds it at load), and a module
whose LoRA is not a linear layer's (vLLM's embedding and output layer hold one tensor, laid out otherwise) is
refused with an UpdateError that names it, which sends the publisher to a file load."""

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


def test_an_embedding_lora_is_refused_by_name() -> None:
    module = "model.embed_tokens"
    vocab = 10
    layer = SimpleNamespace(lora_a_stacked=torch.zeros(SLOTS, vocab, R), lora_b_stacked=torch.zeros(SLOTS, 1, OUT, R),
                            tp_size=1)
    lw = SimpleNamespace(lora_a=torch.zeros(R, vocab), lora_b=torch.zeros(OUT, R))
    manager, lora_model = _manager(layer, lw, module)
    meta, buf = _meta([(f"base_model.model.{module}.lora_embedding_A", (R, vocab)),
                       (f"base_model.model.{module}.lora_embedding_B", (OUT, R))])
    with pytest.raises(UpdateError, match=r"embed_tokens .* not a linear layer's LoRA"):
        build_plan(manager, lora_model, 0, buf, meta, None)
