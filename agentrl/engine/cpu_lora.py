"""Serving LoRA slots on vLLM's CPU build at close to the base model's speed: a fast path for the punica ops.

Where vLLM 0.32's CPU LoRA path loses its time (``vllm/lora/ops/torch_ops/lora_ops.py``, called by
``PunicaWrapperCPU``): the model runner always sends ``is_prefill=True``, so every LoRA linear layer, at every
step, for every slice of a packed module (q/k/v, gate/up), does ``repeat_interleave`` of the per-sequence slot
ids into per-token ids, then **gathers a whole weight matrix per token** (``lora_b_weights[indices]``: ``T x out x
R`` floats copied for a ``T``-token step) and multiplies with a batched ``einsum`` (one matrix-vector product per
token), twice (shrink, expand), plus a zeroed ``float32`` buffer per slice. On SmolLM2-135M at rank 16 that gather
alone copies ``T x 24,576`` floats per ``gate_up`` slice per layer, more than the base GEMM reads. Tokens of no
adapter (slot ``-1``) in a batch with adapters are multiplied with the *last* slot's weights (Python's ``-1``):
correct only while that slot is empty.

The fast path computes the same ``y[:, slice_i] += scale * (x @ A_i^T) @ B_i^T`` with plain GEMMs on the slot
tensors the layers hold (views of the one-copy layout of :mod:`agentrl.engine.slot_layout` after the first
in-place update, so an update is served at the next step), and does its index work once per step, when vLLM sets
the step's token-to-slot mapping (:meth:`Groups.of`), not once per layer:

- **no token uses an adapter**: nothing is done;
- **several slot groups** (or one beside tokens of no adapter), at any size, and **a small call of one slot**
  (below :data:`SERIAL_MACS` multiply-adds: decode steps, short prefills), where agentrl's kernel is built
  (:mod:`agentrl.engine.native_lora`, at install): the whole layer is one call of it, every slice of every slot
  group, each group's 16 x 16 weight tiles transposed in registers once and applied to its tokens. Against the
  torch ops below, one thread (tiny model, 32 tokens): 11 against 35 us for ``qkv`` with one slot, 26 against
  121 us with 16 slots. Below :data:`SERIAL_MACS` it runs on one thread, above it on the engine's threads
  (torch's OpenMP runtime; each slot group cut into 32-token items). With several slots it beat the torch ops
  on two threads at every size measured, even on one thread (SmolLM2 ``gate_up``, 16 slots: 0.27 against
  0.64-1.1 ms for 128 decode tokens, 15 against 21-24 ms for a 4,096-token step, 15 against 370-390 ms for a
  prefill chunk beside the other slots' decode tokens, where the padded batched GEMMs below do 12 times the
  work); two threads halve it from 128 to 1,024 tokens;
- **otherwise** (one slot's large prefill, no build, a layout the kernel refuses), torch ops. Every token uses
  one slot (training's case): two GEMMs per slice (``torch.mm`` then ``addmm_`` into the output's column
  slice), no gather: on two threads, 3.8 against the kernel's 15 ms for a 4,096-token ``gate_up`` step.
  Several slots, or tokens of no adapter beside them: ``x`` gathered once per module (a padded ``slots
  x max_tokens`` index), each slice one batched GEMM over the slots for the shrink and one for the expand, the
  rows added back with ``index_add_``: a dozen ops a layer; where the padding would more than double the work
  (groups of very different sizes), two GEMMs per group and slice on its own rows instead.

Tokens of no adapter get nothing added.

The LoRA GEMMs of a step are small (rank ``R`` against the base layer's width): where a call's work is below
:data:`SERIAL_MACS` multiply-adds it runs on one thread (``torch.set_num_threads(1)`` around it, 0.2 us). On two
cores shared with other processes (the trainer), an OpenMP region of two threads waits whenever the second
core is busy: a rank-16 shrink and expand of 128 tokens took 27 ms (median) on two threads on this machine
under load, 27 us on one; every such region the adapter adds to a step pays that wait. vLLM's CPU worker
replaces ``torch.set_num_threads`` with a stub that logs a warning and does nothing (it pins its OpenMP threads
to cores at start): the switch calls the builtin ``torch._C.set_num_threads`` it shadows, which keeps the pinned
threads (one thread runs the region; the pool and its binding stay). Through the stub, the switch did nothing
and logged two lines per LoRA layer per step (156,337 lines, 26 MB, in one ``make train`` engine log): the
tiny model's slots generated at 0.69-0.82 of the base; with the builtin, 0.92-0.98.

It is installed on the CPU build only (:func:`agentrl.engine.vllm_patches.patch_cpu_lora_fast_path`; on CUDA
vLLM's punica kernels stay), and is switched off with ``AGENTRL_CPU_LORA_FAST=0`` in the engine's environment
(to compare). Where a call does not fit (another dtype than the slot tensors', a step whose token count differs
from the mapping's, ``add_inputs=False``), vLLM's own op runs; so it does in any dtype but float32 (the
engine's dtype on the CPU here), where vLLM keeps the shrunk activations in float32.

This module must import without torch at module level (imported inside the functions).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

SERIAL_ENV = "AGENTRL_CPU_LORA_SERIAL_MACS"
"""Overrides :data:`SERIAL_MACS` in the engine's environment (``0``: every call on the engine's threads)."""
SERIAL_MACS = int(os.environ.get(SERIAL_ENV, 1 << 23))
"""A call whose GEMMs do fewer multiply-adds than this (8.4 M: about half a millisecond on one core) runs on one
thread; a larger one (a long prefill) on the engine's threads."""

ENV_SWITCH = "AGENTRL_CPU_LORA_FAST"
"""``0`` in the engine's environment keeps vLLM's own CPU LoRA ops (for comparison); anything else: the fast
path on the CPU build."""


COMPILE_ENV = "AGENTRL_CPU_LORA_COMPILE"
"""``0`` in the engine's environment keeps vLLM's CPU rule that an engine with LoRA runs its model eagerly (to
compare); anything else: the model is compiled as without LoRA, each LoRA layer one opaque op in it."""


def switch_on(name: str, environ: dict[str, str] | None = None) -> bool:
    """Whether the switch ``name`` is on in ``environ`` (default: this process's): anything but ``0``, ``false``,
    ``no``, ``off``; unset is on."""
    env = os.environ if environ is None else environ
    return env.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether the fast path is wanted in this process (``AGENTRL_CPU_LORA_FAST`` is not ``0``)."""
    return switch_on(ENV_SWITCH, environ)


def compile_enabled(environ: dict[str, str] | None = None) -> bool:
    """Whether a LoRA engine compiles its model: the fast path is on and ``AGENTRL_CPU_LORA_COMPILE`` is not
    ``0``."""
    return enabled(environ) and switch_on(COMPILE_ENV, environ)


@dataclass
class Groups:
    """One step's tokens grouped by LoRA slot, computed once per step from the per-token slot ids.

    ``mode`` is ``"none"`` (no token uses a slot), ``"one"`` (every token uses slot ``slot``) or ``"many"``.
    For ``"many"``: ``slots`` (``S`` slot ids, a long tensor), ``gather`` (``S * width`` token rows, each slot's
    tokens padded with its first one), ``keep`` (positions of the real rows in ``gather``, None when nothing is
    padded) and ``rows`` (the token row of each kept position). ``slots``, ``order`` and ``offsets`` (the
    kernel's view of the groups: one group for ``"one"``) are set by :meth:`of` for both modes."""

    n: int
    mode: str
    slot: int = -1
    slots: Any = None
    width: int = 0
    gather: Any = None
    keep: Any = None
    rows: Any = None
    span: tuple[int, int] | None = None
    """``(first, last + 1)`` when ``slots`` are consecutive: their matrices are a view, not a gather."""
    order: Any = None
    """The rows of tokens with a slot, grouped by slot (slot ascending), unpadded."""
    offsets: Any = None
    """Slot group ``k`` owns ``order[offsets[k]:offsets[k + 1]]`` (``S + 1`` entries)."""

    @classmethod
    def of(cls, indices: Any) -> Groups:
        """The grouping of per-token slot ids ``indices`` (a 1-D long tensor; ``-1``: no adapter)."""
        import torch

        n = int(indices.numel())
        idx = indices.to("cpu")
        used = idx >= 0
        n_used = int(used.sum())
        if n_used == 0:
            return cls(n=n, mode="none")
        slots, counts = torch.unique(idx[used], return_counts=True)
        if n_used == n and slots.numel() == 1:
            return cls(n=n, mode="one", slot=int(slots[0]), slots=slots, order=torch.arange(n),
                       offsets=torch.tensor([0, n]))
        rows_used = torch.nonzero(used, as_tuple=True)[0]
        order = torch.argsort(idx[used], stable=True)
        sorted_rows = rows_used[order]  # token rows grouped by slot, slot ascending
        width = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        col = torch.arange(width).unsqueeze(0)  # (1, width)
        real = col < counts.unsqueeze(1)  # (S, width)
        pos = torch.where(real, starts.unsqueeze(1) + col, starts.unsqueeze(1))  # padding: the slot's first token
        gather = sorted_rows[pos.reshape(-1)]
        keep = None if bool(real.all()) else torch.nonzero(real.reshape(-1), as_tuple=True)[0]
        rows = gather if keep is None else gather[keep]
        first, last = int(slots[0]), int(slots[-1])
        span = (first, last + 1) if last - first + 1 == slots.numel() else None
        offsets = torch.cat([starts, starts[-1:] + counts[-1:]])
        return cls(n=n, mode="many", slots=slots, width=width, gather=gather, keep=keep, rows=rows, span=span,
                   order=sorted_rows.contiguous(), offsets=offsets)

    def covers(self, x: Any) -> bool:
        """Whether ``x`` (tokens x features) is this step's tokens (else vLLM's own op must run)."""
        return x.dim() == 2 and x.size(0) == self.n


def logit_rows(samples: Groups | None, tokens: Groups | None, token_slots: Any, x: Any) -> Groups | None:
    """The slots of the output layer's rows ``x``. vLLM's model runner passes it two kinds of rows:

    - the sampled positions, gathered (``hidden_states[logits_indices]``: a tensor of its own), one per sequence,
      with the slots of ``samples`` (vLLM's ``sampler_indices``);
    - one request's prompt positions, for prompt logprobs: a slice of the step's hidden states, whose first row
      is read from ``x``'s offset into them, with the slots of those tokens (``token_slots``).

    A step whose every token has one slot, or none, gives any rows that slot. None where the rows cannot be
    placed (vLLM's own op runs)."""
    n = int(x.size(0))
    width = int(x.size(1)) if x.dim() == 2 else 0
    sliced = x.dim() == 2 and x.untyped_storage().nbytes() > x.numel() * x.element_size()
    if sliced and tokens is not None and x.stride(1) == 1 and x.stride(0) == width and x.storage_offset() % width == 0:
        first = x.storage_offset() // width
        if first + n <= tokens.n:
            return Groups.of(token_slots[first:first + n])
    if samples is not None and samples.n == n and not sliced:
        return samples
    if tokens is not None and tokens.mode in ("none", "one"):
        return Groups(n=n, mode=tokens.mode, slot=tokens.slot)
    return None


class _Serial:
    """Run the block on one thread when ``macs`` is below :data:`SERIAL_MACS` (the engine's count back after),
    through the builtin thread setter (vLLM's worker shadows ``torch.set_num_threads``: the module docstring)."""

    __slots__ = ("macs", "prev")

    def __init__(self, macs: int) -> None:
        self.macs, self.prev = macs, 0

    def __enter__(self) -> None:
        import torch

        if self.macs < SERIAL_MACS:
            n = torch.get_num_threads()
            if n > 1:
                self.prev = n
                torch._C.set_num_threads(1)

    def __exit__(self, *exc: object) -> None:
        if self.prev:
            import torch

            torch._C.set_num_threads(self.prev)


VIEWS = "_agentrl_slot_views"
"""The attribute of a layer's first stacked A tensor that keeps, per slot, the transposed views of that slot's
A and B matrices (views: what an in-place update writes is what the next step reads); tensors that replace
them (a new slot layout) start without it."""


def _slot_views(a_stacked: tuple, b_stacked: tuple, slot: int, output_slices: tuple[int, ...],
                offset_start: int) -> list[tuple[Any, Any, int, int]]:
    """``(A^T, B^T, first column, end column)`` per slice of ``slot``, built once per (buffers, slot)."""
    first = a_stacked[0]
    cache = first.__dict__.get(VIEWS)
    key = (slot, offset_start, tuple(output_slices))
    owners = (*a_stacked, *b_stacked)
    hit = None if cache is None else cache.get(key)
    if hit is not None and len(hit[0]) == len(owners) and all(p is q for p, q in zip(hit[0], owners, strict=True)):
        return hit[1]
    views, off = [], offset_start
    for a, b, size in zip(a_stacked, b_stacked, output_slices, strict=True):
        views.append((a[slot, 0].t(), b[slot, 0, :size].t(), off, off + size))
        off += size
    if cache is None:
        cache = {}
        try:
            setattr(first, VIEWS, cache)
        except (AttributeError, RuntimeError):  # a tensor that takes no attribute: views built per call
            return views
    cache[key] = (owners, views)
    return views


def _weights(stacked: Any, g: Groups) -> Any:
    """The step's slots' matrices of one stacked buffer ``(max_loras, 1, rows, cols)``: ``(S, rows, cols)``."""
    if g.span is not None:
        return stacked[g.span[0]:g.span[1], 0]
    return stacked.index_select(0, g.slots)[:, 0]


def lora_linear(g: Groups, y: Any, x: Any, a_stacked: tuple, b_stacked: tuple, scale: float,
                output_slices: tuple[int, ...], offset_start: int = 0) -> None:
    """``y[:, slice_i] += scale * (x @ A_i^T) @ B_i^T`` for each slice, per token with the token's slot (none
    for tokens of no adapter); ``y`` is written in place."""

    if g.mode == "none":
        return
    rank = a_stacked[0].size(2)
    macs = g.n * rank * (x.size(1) * len(a_stacked) + sum(output_slices))
    if g.order is not None and (g.mode == "many" or macs < SERIAL_MACS) and _native(
            g, y, x, a_stacked, b_stacked, scale, output_slices, offset_start, macs):
        return
    with _Serial(macs):
        _lora_linear(g, y, x, a_stacked, b_stacked, scale, output_slices, offset_start)


def _native(g: Groups, y: Any, x: Any, a_stacked: tuple, b_stacked: tuple, scale: float,
            output_slices: tuple[int, ...], offset_start: int, macs: int) -> bool:
    """The LoRA of one layer, one slot group or several, in one call of agentrl's kernel
    (:mod:`agentrl.engine.native_lora`), where it is built with its vector path for this rank, on one thread below
    :data:`SERIAL_MACS` and on the engine's threads above; whether it ran (a layout it refuses, checked before it
    writes, leaves ``y`` as it was)."""
    import torch

    from agentrl.engine import native_lora

    k = native_lora.kernel()
    tile = native_lora.tile()
    if k is None or not tile or any(a.size(2) % tile for a in a_stacked):  # its plain loops lose to torch ops
        return False
    try:
        k.lora_groups(y, x, list(a_stacked), list(b_stacked), g.order, g.offsets, g.slots, float(scale),
                      list(output_slices), offset_start, 1 if macs < SERIAL_MACS else torch.get_num_threads())
    except RuntimeError:
        return False
    return True


def _lora_linear(g: Groups, y: Any, x: Any, a_stacked: tuple, b_stacked: tuple, scale: float,
                 output_slices: tuple[int, ...], offset_start: int) -> None:
    import torch

    off = offset_start
    if g.mode == "one":
        for a_t, b_t, start, end in _slot_views(a_stacked, b_stacked, g.slot, output_slices, offset_start):
            y[:, start:end].addmm_(torch.mm(x, a_t), b_t, alpha=scale)
        return
    if g.slots.numel() * g.width > 2 * g.rows.numel():  # padding would more than double the work
        _lora_linear_grouped(g, y, x, a_stacked, b_stacked, scale, output_slices, offset_start)
        return
    xg = x.index_select(0, g.gather).view(g.slots.numel(), g.width, x.size(1))
    for a, b, size in zip(a_stacked, b_stacked, output_slices, strict=True):
        h = torch.bmm(xg, _weights(a, g).transpose(1, 2))
        out = torch.bmm(h, _weights(b, g)[:, :size].transpose(1, 2)).view(-1, size)
        if g.keep is not None:
            out = out.index_select(0, g.keep)
        y[:, off:off + size].index_add_(0, g.rows, out, alpha=scale)
        off += size


def _lora_linear_grouped(g: Groups, y: Any, x: Any, a_stacked: tuple, b_stacked: tuple, scale: float,
                         output_slices: tuple[int, ...], offset_start: int) -> None:
    """The torch ops for slot groups of very different sizes (a prefill chunk beside other slots' decode
    tokens): two GEMMs per slot group and slice on the group's rows, no padding to the largest group."""
    import torch

    xs = x.index_select(0, g.order)
    bounds = g.offsets.tolist()
    slots = g.slots.tolist()
    off = offset_start
    for a, b, size in zip(a_stacked, b_stacked, output_slices, strict=True):
        out = torch.empty(xs.size(0), size, dtype=y.dtype)
        for k, slot in enumerate(slots):
            lo, hi = bounds[k], bounds[k + 1]
            torch.mm(torch.mm(xs[lo:hi], a[slot, 0].t()), b[slot, 0, :size].t(), out=out[lo:hi])
        y[:, off:off + size].index_add_(0, g.order, out, alpha=scale)
        off += size


def shrink(g: Groups, y: Any, x: Any, a_stacked: tuple, scale: float) -> None:
    """``y[i] = scale * x @ A_i^T`` for the rows of tokens with a slot (``y``: ``(slices, T, R)``, zeroed by
    the caller; rows of no adapter stay as they are)."""

    if g.mode == "none":
        return
    with _Serial(g.n * a_stacked[0].size(2) * x.size(1) * len(a_stacked)):
        _shrink(g, y, x, a_stacked, scale)


def _shrink(g: Groups, y: Any, x: Any, a_stacked: tuple, scale: float) -> None:
    import torch

    if g.mode == "one":
        for i, a in enumerate(a_stacked):
            h = torch.mm(x, a[g.slot, 0].t())
            y[i].copy_(h if scale == 1.0 else h * scale)
        return
    xg = x.index_select(0, g.gather).view(g.slots.numel(), g.width, x.size(1))
    for i, a in enumerate(a_stacked):
        h = torch.bmm(xg, _weights(a, g).transpose(1, 2)).view(-1, a.size(2))
        if g.keep is not None:
            h = h.index_select(0, g.keep)
        if scale != 1.0:
            h = h * scale
        y[i].index_copy_(0, g.rows, h.to(y.dtype))


def expand(g: Groups, y: Any, x: Any, b_stacked: tuple, output_slices: tuple[int, ...],
           offset_start: int = 0) -> None:
    """``y[:, slice_i] += x[i] @ B_i^T`` for the rows of tokens with a slot (``x``: ``(slices, T, R)``)."""

    if g.mode == "none":
        return
    with _Serial(g.n * x.size(2) * sum(output_slices)):
        _expand(g, y, x, b_stacked, output_slices, offset_start)


def _expand(g: Groups, y: Any, x: Any, b_stacked: tuple, output_slices: tuple[int, ...], offset_start: int) -> None:
    import torch

    off = offset_start
    for i, (b, size) in enumerate(zip(b_stacked, output_slices, strict=True)):
        xi = x[i].to(y.dtype)
        if g.mode == "one":
            y[:, off:off + size].addmm_(xi, b[g.slot, 0, :size].t())
        else:
            xg = xi.index_select(0, g.gather).view(g.slots.numel(), g.width, xi.size(1))
            out = torch.bmm(xg, _weights(b, g)[:, :size].transpose(1, 2)).view(-1, size)
            if g.keep is not None:
                out = out.index_select(0, g.keep)
            y[:, off:off + size].index_add_(0, g.rows, out)
        off += size


WRAPPERS: dict[int, Any] = {}
"""Punica wrappers by key (:func:`wrapper_key`): the compiled op's body finds its wrapper, and the step's
grouping on it, through the integer key the traced graph holds."""


KEY_ATTR = "_agentrl_key"


def wrapper_key(wrapper: Any) -> int:
    """``wrapper``'s key in :data:`WRAPPERS`, registered at its first step's metadata (eagerly, before vLLM
    traces the model in its first dummy step); the trace reads the attribute as a constant."""
    key = getattr(wrapper, KEY_ATTR, None)
    if key is None:
        key = len(WRAPPERS) + 1
        setattr(wrapper, KEY_ATTR, key)
        WRAPPERS[key] = wrapper
    return key


def compiling() -> bool:
    """Whether the caller is being traced by ``torch.compile`` (vLLM's compiled model)."""
    import torch

    return bool(torch.compiler.is_compiling())


_OP: list[Any] = []
CALLS = {"compiled": 0}
"""``compiled``: calls of the compiled op in this process (the engine reports it: proof that its model runs
compiled with the slots' LoRA in it)."""


def compiled_linear_op(body: Any) -> Any:
    """The custom op ``agentrl::lora_linear(y, x, a, b, scale, slices, key)`` that a LoRA linear layer becomes
    in vLLM's compiled model: opaque to the compiler, which keeps its place in the graph (it writes ``y``), so
    that ``body(key, y, x, a, b, scale, slices)`` (the eager fast path) runs each step with that step's slot
    grouping. Registered once per process, directly on the CPU dispatch key (``torch.library.custom_op``'s
    Python dispatch cost 50-60 us a call, more than a tiny model's LoRA GEMMs); the first ``body`` serves."""
    if _OP:
        return _OP[0]
    import torch

    lib = torch.library.Library("agentrl", "FRAGMENT")
    lib.define("lora_linear(Tensor(a0!) y, Tensor x, Tensor[] a, Tensor[] b, float scale, int[] slices, "
               "int key) -> ()")

    def impl(y: Any, x: Any, a: list[Any], b: list[Any], scale: float, slices: list[int], key: int) -> None:
        CALLS["compiled"] += 1
        body(key, y, x, a, b, scale, slices)

    def fake(y: Any, x: Any, a: list[Any], b: list[Any], scale: float, slices: list[int], key: int) -> None:
        return None

    lib.impl("lora_linear", impl, "CPU")
    lib._register_fake("lora_linear", fake)
    _OP.extend([torch.ops.agentrl.lora_linear.default, lib])  # the library object keeps the op registered
    return _OP[0]


def same_dtype(*tensors: Any) -> bool:
    """Whether every tensor (or the first of every tuple) is float32. In another dtype vLLM's ops keep the
    shrunk activations in float32 where the fast path would round them to that dtype: vLLM's ops run there."""
    import torch

    return all((t[0] if isinstance(t, tuple) else t).dtype == torch.float32 for t in tensors)
