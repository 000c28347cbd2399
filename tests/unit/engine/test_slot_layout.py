"""The adapter's slots moved into one buffer laid out as the publisher's segment (``agentrl.engine.slot_layout``),
on layers shaped like vLLM's LoRA linear layers: contents kept in every slot, one copy writes what per-tensor
copies write, and the cases where one copy would not be exact are left alone. The real engine is in
``tests/integration/test_lora_sync.py``."""

from __future__ import annotations

import torch

from agentrl.engine.slot_layout import SlotTensor, rehome
from agentrl.weight_sync.inplace import pack_layout

SLOTS, RANK = 2, 4


class Layer:
    """A LoRA linear layer's stacked buffers: ``slices`` sub-projections of ``(outs[i], inp)``."""

    def __init__(self, inp: int, outs: list[int], rank: int = RANK, gen: torch.Generator | None = None) -> None:
        self.tp_size = 1
        self.lora_a_stacked = tuple(torch.randn(SLOTS, 1, rank, inp, generator=gen) for _ in outs)
        self.lora_b_stacked = tuple(torch.randn(SLOTS, 1, o, rank, generator=gen) for o in outs)


def _model(rank: int = RANK) -> tuple[dict[str, Layer], dict[str, tuple[Layer, int]]]:
    gen = torch.Generator().manual_seed(0)
    layers = {"qkv": Layer(24, [24, 8, 8], rank, gen), "o": Layer(24, [24], rank, gen), "down": Layer(40, [24], rank, gen)}
    # peft module name -> (layer, slice)
    where = {"q_proj": (layers["qkv"], 0), "k_proj": (layers["qkv"], 1), "v_proj": (layers["qkv"], 2),
             "o_proj": (layers["o"], 0), "down_proj": (layers["down"], 0)}
    return layers, where


def _adapter(where: dict[str, tuple[Layer, int]], seed: int, rank: int = RANK) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for module, (layer, s) in where.items():
        inp, o = layer.lora_a_stacked[s].shape[3], layer.lora_b_stacked[s].shape[2]
        out[f"{module}.lora_A.weight"] = torch.randn(rank, inp, generator=gen)
        out[f"{module}.lora_B.weight"] = torch.randn(o, rank, generator=gen)
    return out


def _segment(tensors: dict[str, torch.Tensor]) -> tuple[list, int, torch.Tensor]:
    layout, nbytes = pack_layout(tensors)
    buf = torch.zeros(nbytes, dtype=torch.uint8)
    for name, _dtype, shape, offset in layout:
        t = tensors[name]
        buf[offset:offset + t.numel() * 4].view(torch.float32).view(shape).copy_(t)
    return layout, nbytes, buf


def _slot_tensors(layout: list, where: dict[str, tuple[Layer, int]]) -> list[SlotTensor]:
    out = []
    for name, _dtype, shape, offset in layout:
        module, kind = name.split(".")[0], name.split(".")[1]
        layer, s = where[module]
        out.append(SlotTensor(layer=layer, is_a=kind == "lora_A", index=s, shape=tuple(shape), offset=offset))
    return out


def _stacked(layer: Layer, is_a: bool, s: int) -> torch.Tensor:
    return (layer.lora_a_stacked if is_a else layer.lora_b_stacked)[s]


def test_one_copy_writes_the_slot_every_tensor_copy_would_and_keeps_the_other_slot() -> None:
    layers, where = _model()
    before = {(n, a, s): _stacked(layer, a, s).clone() for n, layer in layers.items() for a in (True, False)
              for s in range(len(layer.lora_a_stacked))}
    tensors = _adapter(where, seed=1)
    layout, nbytes, buf = _segment(tensors)
    plan = _slot_tensors(layout, where)
    with torch.inference_mode():  # as the copy plan calls it
        flat = rehome(plan, nbytes, torch.float32)
    assert flat is not None and flat.numel() == SLOTS * nbytes
    # vLLM loads an adapter into a slot outside inference mode: the moved buffers must take that
    layers["o"].lora_a_stacked[0][0, 0].add_(0.0)
    assert not flat.is_inference() and not layers["o"].lora_a_stacked[0].is_inference()
    for (n, a, s), old in before.items():  # moved, not changed: every slot serves what it served
        new = _stacked(layers[n], a, s)
        assert torch.equal(new, old) and new.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    slot = 1
    flat[slot * nbytes:(slot + 1) * nbytes].copy_(buf)  # the update: one copy
    for t, (name, *_rest) in zip(plan, layout, strict=True):
        assert torch.equal(_stacked(t.layer, t.is_a, t.index)[slot, 0], tensors[name]), name
        # the other slot is untouched
        n = next(k for k, v in layers.items() if v is t.layer)
        assert torch.equal(_stacked(t.layer, t.is_a, t.index)[0], before[(n, t.is_a, t.index)][0])


def test_a_new_layout_moves_the_buffers_again_and_keeps_what_they_hold() -> None:
    layers, where = _model()
    layout, nbytes, buf = _segment(_adapter(where, seed=1))
    first = rehome(_slot_tensors(layout, where), nbytes, torch.float32)
    assert first is not None
    first[:nbytes].copy_(buf)
    held = {n: [t.clone() for t in layer.lora_b_stacked] for n, layer in layers.items()}
    # a layout of fewer modules (o_proj left out): offsets change, the buffers move once more
    smaller = {k: v for k, v in where.items() if k != "o_proj"}
    layout2, nbytes2, buf2 = _segment(_adapter(smaller, seed=2))
    second = rehome(_slot_tensors(layout2, smaller), nbytes2, torch.float32)
    assert second is not None and second.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
    assert all(torch.equal(a, b) for n, layer in layers.items() for a, b in zip(layer.lora_b_stacked, held[n],
                                                                                   strict=True))
    second[nbytes2:].copy_(buf2)
    assert torch.equal(layers["down"].lora_a_stacked[0][1, 0], _adapter(smaller, seed=2)["down_proj.lora_A.weight"])
    # back to the whole layout: o_proj's buffers still view the first buffer, and move too
    third = rehome(_slot_tensors(layout, where), nbytes, torch.float32)
    assert third is not None
    ptr = third.untyped_storage().data_ptr()
    assert all(t.untyped_storage().data_ptr() == ptr for layer in layers.values()
               for t in (*layer.lora_a_stacked, *layer.lora_b_stacked))


def test_where_one_copy_would_not_be_exact_nothing_moves() -> None:
    # a slot wider than the adapter's rank: the slot's bytes are not one block
    layers, where = _model(rank=8)
    layout, nbytes, _ = _segment(_adapter(where, seed=1, rank=4))
    ids = [id(t) for layer in layers.values() for t in layer.lora_a_stacked]
    assert rehome(_slot_tensors(layout, where), nbytes, torch.float32) is None
    assert [id(t) for layer in layers.values() for t in layer.lora_a_stacked] == ids
    # a dtype other than the segment's
    layers, where = _model()
    layout, nbytes, _ = _segment(_adapter(where, seed=1))
    assert rehome(_slot_tensors(layout, where), nbytes, torch.bfloat16) is None
    # buffers held in a list and as views of a larger buffer (how the MoE LoRA layers hold theirs)
    layers, where = _model()
    big = torch.zeros(SLOTS, 1, RANK, 24 * 2)
    layers["o"].lora_a_stacked = (big[..., :24],)
    layout, nbytes, _ = _segment(_adapter(where, seed=1))
    assert rehome(_slot_tensors(layout, where), nbytes, torch.float32) is None
    layers, where = _model()
    layers["o"].lora_b_stacked = list(layers["o"].lora_b_stacked)  # type: ignore[assignment]
    assert rehome(_slot_tensors(layout, where), nbytes, torch.float32) is None
