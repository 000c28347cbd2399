"""The copy plan of an in-place adapter update: which view of the shared buffer goes into which view of the
adapter's live slot and of its cached copy, built once per (adapter object, slot, layout).

How vLLM 0.32 holds an active adapter (TP=1): every LoRA-wrapped layer owns per-slice stacked buffers
``lora_a_stacked[s]`` of shape ``(max_loras, 1, max_rank, in)`` and ``lora_b_stacked[s]`` of shape
``(max_loras, 1, out, max_rank)``; an adapter in GPU slot ``i`` lives in ``[i, 0, :r, :in]`` /
``[i, 0, :out, :r]`` (no transposes: peft's ``lora_A.weight`` is ``(r, in)``, ``lora_B.weight`` is
``(out, r)``). Packed layers (``qkv_proj``, ``gate_up_proj``) have one slice per sub-projection
(q=0, k=1, v=2); the output layer's LoRA (``lm_head``) holds one tensor per side, laid out as one slice
(:func:`agentrl.engine.slot_layout.slices`). Where it is exact, the first plan moves those buffers into one laid out as the publisher's
segment (:mod:`agentrl.engine.slot_layout`), so that an update is one copy instead of one per tensor. The peft scaling (``alpha/r``, or ``alpha/sqrt(r)`` for rsLoRA, per-module patterns) is
folded into B at load (``LoRALayerWeights.optimize``); an update does the same, unless the publisher sent B
already scaled (``meta["b_scaled"]``, checked against each module's scaling), which leaves one copy. The CPU-side ``LoRAModel`` cache keeps the same
(scaled) tensors, from which a slot is refilled after an eviction. An update writes the live slot only; the
cache is brought up to date from the slot when vLLM releases the slot (:func:`release_slot`, called by patch 14
of :mod:`agentrl.engine.vllm_patches`), or at once where that patch is not installed. The manager's layout
is vLLM's private state: :func:`agentrl.engine.vllm_patches.lora_adapter_manager` records what is read here.

This module must import without vLLM and torch (imported inside :func:`build_plan`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agentrl.core.errors import WeightSyncError
from agentrl.engine import vllm_patches
from agentrl.weight_sync.base import ADAPTER_NOT_LOADED, UPDATE_REFUSED


class UpdateError(WeightSyncError, RuntimeError):
    """The in-place update cannot be applied (adapter not loaded, different shapes): reload from a file.
    The update methods return it as a failure record carrying its ``code`` (``failure_of``)."""

    code = UPDATE_REFUSED


class AdapterNotLoaded(UpdateError):
    """The adapter has no slot on this worker (never loaded here, or evicted): load it once from a file."""

    code = ADAPTER_NOT_LOADED


def decode_payload(bufs: dict[str, Any], key: str, payload_b64: str, nbytes: int) -> tuple[Any, bool]:
    """A call body's packed adapter bytes (base64) in a uint8 buffer of this worker, kept in ``bufs`` under
    ``key`` and reused while the key (the layout) stays the same: a new key drops the older buffer. Returns the
    buffer and whether it is new (plans holding views into an older one must go). Raises UpdateError for a
    payload of another size than the layout's, ValueError for bad base64."""
    import base64

    import torch

    raw = base64.b64decode(payload_b64, validate=True)
    if len(raw) != nbytes:
        raise UpdateError(f"payload is {len(raw)} bytes, the layout says {nbytes}")
    new = key not in bufs
    if new:
        bufs.clear()
        bufs[key] = torch.empty(max(nbytes, 1), dtype=torch.uint8)
    buf = bufs[key]
    buf[:nbytes].copy_(torch.frombuffer(bytearray(raw), dtype=torch.uint8))
    return buf, new


class CopyPlan:
    """Precomputed views for one (adapter object, slot, shm layout): the update is a few foreach ops."""

    def __init__(self, lora_model: Any, slot: int | None, key: tuple[int, int] = (0, 0)) -> None:
        self.lora_model = lora_model  # strong ref: `is` check stays valid
        self.slot = slot
        self.key = key  # (id of the manager, adapter id): where its release is announced
        self.src: list[Any] = []     # shm views
        self.live: list[Any] = []    # slot views in the stacked buffers (or the cache when not active)
        self.cache: list[Any] = []   # LoRAModel tensors (only when a slot is live)
        self.scales: dict[float, list[Any]] = {}  # scaling -> live B views
        self.set_lora: list[tuple[Any, Any]] = []  # (layer, layer weights): TP>1 layers re-sliced by vLLM
        self.whole: tuple[Any, Any] | None = None  # (slot's bytes, segment's bytes): one copy does it all

    def copy(self) -> int:
        """Write the live slot from the segment; the number of copies it took (1 where the slots are laid out
        as the segment, :mod:`agentrl.engine.slot_layout`). Call inside ``torch.inference_mode``."""
        import torch

        if self.whole is not None:
            self.whole[0].copy_(self.whole[1])
            return 1
        torch._foreach_copy_(self.live, self.src)
        return len(self.live)


class _Found(NamedTuple):
    """One tensor of the layout, matched to its module: peft ``name``, ``dtype``, ``shape``, byte ``offset``,
    A or B, the vLLM module ``target`` and slice ``s`` (None: not packed), its LoRA ``layer``, the adapter's
    layer weights ``lw`` and the ``cached`` (CPU) tensor."""

    name: str
    dtype: Any
    shape: tuple[int, ...]
    offset: int
    is_a: bool
    target: str
    s: int | None
    layer: Any
    lw: Any
    cached: Any


def build_plan(manager: Any, lora_model: Any, slot: int | None, buf: Any, meta: dict[str, Any],
               path: str | None) -> CopyPlan:
    """Map every peft tensor name of ``meta["tensors"]`` onto (layer, slice, A/B) of ``manager`` and build the
    copy lists from ``buf``; the B views are scaled by the adapter's scaling (from ``path``'s config, else
    ``meta["scaling"]``)."""
    import torch

    from agentrl.engine import slot_layout

    mapper = getattr(manager.model, "hf_to_vllm_mapper", None)
    mapper = mapper.get_rename_mapper() if mapper is not None else None
    sub_to_packed = {sub: (packed, i) for packed, subs in manager.packed_modules.items()
                     for i, sub in enumerate(subs)}
    helper = vllm_patches.peft_helper(path) if path is not None else None
    plan = CopyPlan(lora_model, slot, (id(manager), int(lora_model.id)))
    set_lora: dict[str, tuple[Any, Any]] = {}
    found = []
    for name, dtype, shape, offset in meta["tensors"]:
        module, is_a = vllm_patches.parse_lora_name(name, mapper)
        target, s = sub_to_packed.get(module, (module, None))
        layer, lw = manager.modules.get(target), lora_model.loras.get(target)
        if layer is None or lw is None:
            raise UpdateError(f"{name}: module {target} has no LoRA in the loaded adapter")
        if slot_layout.slices(layer, True) is None or slot_layout.slices(layer, False) is None:
            # vLLM's token-embedding LoRA holds its A transposed, (slots, vocab, R): not written in place here
            raise UpdateError(f"{name}: module {target} ({type(layer).__name__}) is not a linear or output layer's "
                              "LoRA; an in-place update covers those only (load the adapter from a file)")
        cached = (lw.lora_a if is_a else lw.lora_b)
        cached = cached[s] if s is not None else cached
        if cached is None or list(cached.shape) != list(shape):
            got = None if cached is None else list(cached.shape)
            raise UpdateError(f"{name}: shape {list(shape)} differs from the loaded adapter's {got}")
        found.append(_Found(name, getattr(torch, dtype), tuple(shape), offset, is_a, target, s, layer, lw, cached))
    nbytes_all = int(meta.get("nbytes", 0))
    flat = _rehome(found, slot, nbytes_all)
    if flat is not None:
        from agentrl.engine.slot_layout import slot_bytes

        plan.whole = (slot_bytes(flat, slot, nbytes_all), buf[:nbytes_all])
    for name, tdtype, shape, offset, is_a, target, s, layer, lw, cached in found:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=tdtype).element_size()
        src = buf[offset:offset + nbytes].view(tdtype).view(shape)
        live = cached
        if slot is not None and getattr(layer, "tp_size", 1) == 1:
            stacked = (slot_layout.slices(layer, is_a) or ())[s or 0]
            live = stacked[slot, 0, : shape[0], : shape[1]]
        elif slot is not None:
            set_lora[target] = (layer, lw)  # sharded layer: copy into the cache, vLLM slices it into the slot
        plan.src.append(src)
        plan.live.append(live)
        if live is not cached:
            plan.cache.append(cached)
        if is_a:
            continue
        if helper is not None:
            scale = helper.get_rank_and_scaling(vllm_patches.parse_lora_name(name)[0])[1]
        elif "scaling" in meta:
            scale = float(meta["scaling"])
        else:
            raise UpdateError("adapter path unknown on this worker: pass meta['scaling']")
        if "b_scaled" in meta:  # the publisher scaled B already: it must be this module's scaling
            sent = float(meta["b_scaled"])
            if abs(sent - scale) > 1e-6 * max(abs(scale), 1.0):
                raise UpdateError(f"{name}: B was sent scaled by {sent}, the loaded adapter scales this module by "
                                  f"{scale}")
        elif scale != 1.0:
            plan.scales.setdefault(scale, []).append(live)
    if plan.cache and len(plan.cache) != len(plan.live):
        raise UpdateError("mixed sharded/unsharded layers are not supported")
    plan.set_lora = list(set_lora.values())
    return plan


def _rehome(found: list[_Found], slot: int | None, nbytes: int) -> Any:
    """The one buffer the slots of ``found`` (``build_plan``'s tensors) were moved into
    (:func:`agentrl.engine.slot_layout.rehome`), or None where they stay vLLM's (no live slot, a sharded layer,
    mixed dtypes, a padded slot, ...)."""
    from agentrl.engine import slot_layout

    dtypes = {f.dtype for f in found}
    if slot is None or len(dtypes) != 1 or any(getattr(f.layer, "tp_size", 1) != 1 for f in found):
        return None
    tensors = [slot_layout.SlotTensor(layer=f.layer, is_a=f.is_a, index=f.s or 0, shape=f.shape, offset=f.offset)
               for f in found]
    return slot_layout.rehome(tensors, nbytes, dtypes.pop())


CACHE_BEHIND: dict[tuple[int, int], CopyPlan] = {}
"""Adapters whose CPU copy is behind their live slot: (id of the manager, adapter id) -> the last update's plan."""
RELEASE_HOOKED = [False]
"""Whether patch 14 is installed in this process (set by :mod:`agentrl.engine.install`): only then is the cache
copy left for the slot's release."""


def cache_after_update(plan: CopyPlan) -> None:
    """After an update of ``plan``'s live slot: mark its CPU copy behind (copied when the slot is released), or
    copy it now where no release is announced. Call inside ``torch.inference_mode``."""
    import torch

    if not plan.cache:
        return
    if RELEASE_HOOKED[0]:
        CACHE_BEHIND[plan.key] = plan
    else:
        torch._foreach_copy_(plan.cache, plan.live)


def release_slot(manager: Any, lora_id: int) -> None:
    """Before vLLM releases adapter ``lora_id``'s slot in ``manager``: bring its CPU copy up to date from the
    slot (the copy vLLM refills a slot from), if an update left it behind."""
    plan = CACHE_BEHIND.pop((id(manager), int(lora_id)), None)
    if plan is None:
        return
    import torch

    with torch.inference_mode():
        torch._foreach_copy_(plan.cache, plan.live)
