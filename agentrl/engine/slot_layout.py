"""The adapter's slots in one buffer, laid out as the publisher's segment: an in-place update is one copy.

vLLM gives every LoRA-wrapped linear layer (and the output layer) stacked buffers of its own, one per slice (``lora_a_stacked[s]`` of
shape ``(max_loras, 1, R, in)``, ``lora_b_stacked[s]`` of ``(max_loras, 1, out, R)``), so updating an adapter
on every linear layer of a 30-layer model is 420 small copies, bound by dispatch (2 to 3 us each on a CPU: 12x
a memcpy of the same 1.2 MB at rank 1). :func:`rehome` moves the stacked buffers an adapter's tensors land in
into one buffer owned here, each at the byte offset its tensor has in the publisher's segment layout
(:func:`agentrl.weight_sync.inplace.pack_layout`), slot after slot (slot ``k`` holds bytes ``[k * P, k * P +
nbytes)``, ``P`` the layout's size), and gives them back to the layers as views of it. The layers read them as
before (vLLM's CPU LoRA ops index the stacked tensors by slot); the contents are copied over, so every slot
serves what it served. An update of one slot is then one copy of the layout's bytes.

It applies only where that one copy is exact, else the plan copies tensor by tensor as before
(:func:`rehome` returns None):

- every tensor of the layout fills its slot (the adapter's rank is the slot rank: no padding to skip);
- one dtype throughout, the segment's;
- tensors on the CPU: a CUDA engine keeps vLLM's buffers, whose addresses its CUDA graphs and the Triton LoRA
  kernels' pointer tables hold, and where a foreach copy is already a few fused kernels (never run here);
- each buffer is a tensor of vLLM's own allocation (or a view this module made, :data:`MOVED`), held in a tuple
  attribute of the layer, or the output layer's one tensor per side (:func:`slices`): the MoE LoRA layers
  hold views into larger expert buffers in lists, and the token embedding's A is transposed; both are left
  alone.

This module must import without torch (imported inside the functions).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOVED = "_agentrl_slots_moved"
"""The attribute that marks a layer whose stacked buffers are views of a buffer made here: they may move again
(a new layout); the older buffer is freed once no layer holds a view of it."""


@dataclass(frozen=True)
class SlotTensor:
    """Where one tensor of the segment goes: ``layer``'s ``lora_a_stacked`` (``is_a``) or ``lora_b_stacked``,
    slice ``index``; its ``shape`` and the byte ``offset`` in the layout."""

    layer: Any
    is_a: bool
    index: int
    shape: tuple[int, ...]
    offset: int


def slices(layer: Any, is_a: bool) -> tuple[Any, ...] | None:
    """``layer``'s stacked A (``is_a``) or B buffers, one per slice: a linear layer's tuple as it is, the output
    layer's one 4-D tensor (vLLM's ``LogitsProcessorWithLoRA``: ``(max_loras, 1, R, hidden)`` and ``(max_loras,
    1, vocab, R)``, laid out as a linear slice) as a tuple of one; None for any other layout (the token
    embedding's A is ``(max_loras, vocab, R)``, transposed; the MoE layers' are lists of views)."""
    stacked = getattr(layer, "lora_a_stacked" if is_a else "lora_b_stacked", None)
    if isinstance(stacked, tuple):
        return stacked
    other = getattr(layer, "lora_b_stacked" if is_a else "lora_a_stacked", None)
    if all(getattr(t, "dim", lambda: 0)() == 4 for t in (stacked, other)):
        return (stacked,)
    return None


def _set_slices(layer: Any, is_a: bool, views: dict[int, Any]) -> None:
    """Give ``layer`` its stacked buffers back with slice ``i`` replaced by ``views[i]``, in the form it held them."""
    name = "lora_a_stacked" if is_a else "lora_b_stacked"
    held = getattr(layer, name)
    new = tuple(views.get(i, s) for i, s in enumerate(slices(layer, is_a) or ()))
    setattr(layer, name, new if isinstance(held, tuple) else new[0])


def _stacked(t: SlotTensor) -> Any:
    return (slices(t.layer, t.is_a) or ())[t.index]


def _movable(t: SlotTensor, dtype: Any) -> bool:
    if slices(t.layer, True) is None or slices(t.layer, False) is None:
        return False
    stacked = _stacked(t)
    if stacked.device.type != "cpu" or stacked.dtype != dtype or stacked.dim() != 4 or stacked.shape[1] != 1:
        return False
    if tuple(stacked.shape[2:]) != t.shape:  # a padded slot (rank below the slot rank): not one block
        return False
    storage = stacked.untyped_storage()
    own = stacked.storage_offset() == 0 and storage.nbytes() == stacked.numel() * stacked.element_size()
    return own or bool(getattr(t.layer, MOVED, False))


def rehome(tensors: list[SlotTensor], nbytes: int, dtype: Any) -> Any:
    """Move the stacked buffers of ``tensors`` (a whole layout of ``nbytes`` bytes, every tensor ``dtype``) into
    one buffer laid out as the layout, slot after slot; the buffer (uint8, ``max_loras * nbytes`` bytes), or
    None where the move would not be exact (the module docstring). The buffer and its views are ordinary
    tensors even when called inside ``torch.inference_mode`` (as the copy plan is): vLLM writes a slot outside
    it when it loads an adapter, which an inference tensor would refuse."""
    import torch

    if not tensors or nbytes <= 0:
        return None
    esize = torch.empty((), dtype=dtype).element_size()
    seen: set[int] = set()
    for t in tensors:
        if not _movable(t, dtype) or t.offset % esize or id(stacked := _stacked(t)) in seen:
            return None
        seen.add(id(stacked))
    slots = {_stacked(t).shape[0] for t in tensors}
    if len(slots) != 1 or nbytes % esize:
        return None
    (n_slots,) = slots
    with torch.inference_mode(False):
        flat = torch.empty(n_slots * nbytes, dtype=torch.uint8, device="cpu")
        typed = flat.view(dtype)
        per_slot = nbytes // esize
        moved: dict[tuple[int, bool], tuple[Any, dict[int, Any]]] = {}  # (layer, is_a) -> (layer, slice -> view)
        for t in tensors:
            rows, cols = t.shape
            view = typed.as_strided((n_slots, 1, rows, cols), (per_slot, rows * cols, cols, 1), t.offset // esize)
            view.copy_(_stacked(t))  # every slot keeps what it serves
            moved.setdefault((id(t.layer), t.is_a), (t.layer, {}))[1][t.index] = view
    for (_, is_a), (layer, views) in moved.items():
        _set_slices(layer, is_a, views)
        setattr(layer, MOVED, True)
    return flat


def slot_bytes(flat: Any, slot: int, nbytes: int) -> Any:
    """The bytes of slot ``slot`` in a buffer :func:`rehome` made for a layout of ``nbytes`` bytes: where one
    copy of the segment writes that slot."""
    return flat[slot * nbytes:(slot + 1) * nbytes]
