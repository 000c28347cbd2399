"""The CPU LoRA fast path (agentrl.engine.cpu_lora, patch 17) against vLLM's own torch-ops path, on random
slots and token-to-slot mappings: one adapter, several, none, tokens of no adapter beside adapters, packed
slices (q/k/v sizes), the shrink/expand pair row-parallel layers use, and the step grouping itself.

vLLM's CPU ops give a token of no adapter (slot -1) the *last* slot's weights (Python's -1); the reference keeps
that last slot zero, which gives the intended "nothing added", and the fast path must add nothing there."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm.lora.punica_wrapper.punica_cpu")

from vllm.lora.layers.utils import LoRAMapping  # noqa: E402
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU  # noqa: E402

from agentrl.engine import cpu_lora, native_lora, vllm_patches  # noqa: E402
from tests.conftest import require  # noqa: E402

RANK, HIDDEN = 16, 56  # the kernel's vector path takes ranks in multiples of 16 (others: the torch ops)
SLICES = (40, 24, 24)  # packed q/k/v output sizes (none a multiple of 16: the kernel's tails)
SLOTS = 5  # the last one stays empty: vLLM's slot for tokens of no adapter (see the module docstring)


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal up to float32 rounding of sums taken in another order: the error scales with the sums' terms, not
    with an entry's own size (an entry near zero is a difference of terms about the output's largest size)."""
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6 * float(want.abs().max()) + 1e-6)


def _orig(name: str):
    fn = getattr(PunicaWrapperCPU, name)
    return getattr(fn, "_agentrl_original", fn)


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every draw without its own generator is seeded: a test's data never changes between runs."""
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def patched() -> None:
    assert vllm_patches.patch_cpu_lora_fast_path(force=True)


def built_kernel() -> object:
    """agentrl's CPU LoRA kernel (make install builds it); skip locally, fail on CI, where it is not built."""
    k = native_lora.kernel()
    require(k is not None, "agentrl's CPU LoRA kernel is not built (python -m agentrl.engine.native_lora build)")
    return k


def test_ranks_off_the_vector_path_keep_the_torch_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 8 where the kernel's vector path takes multiples of 16: the torch ops serve (its plain loops are
    slower than they are)."""
    k = built_kernel()
    calls: list[int] = []

    class Spy:
        def lora_groups(self, *args: object) -> None:
            calls.append(1)

        def tile(self) -> int:
            return k.tile()

    monkeypatch.setattr(native_lora, "kernel", Spy)
    g = cpu_lora.Groups.of(torch.tensor([0, 1, 1, 0]))
    a, b = (torch.randn(2, 1, 8, 32),), (torch.randn(2, 1, 16, 8),)
    y = torch.zeros(4, 16)
    cpu_lora.lora_linear(g, y, torch.randn(4, 32), a, b, 1.0, (16,))
    assert calls == [] and bool(y.abs().sum() > 0)


class KernelCalls(list):
    """The kernel's calls in a test (``kernel``: whether it serves the slots there, else the torch ops)."""

    kernel = False

    def expect(self, used: bool) -> None:
        assert len(self) == int(self.kernel and used), f"kernel calls: {len(self)}"


@pytest.fixture(params=["kernel", "torch ops"])
def lora_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> KernelCalls:
    """Serve the slots with agentrl's kernel or with the torch ops."""
    calls = KernelCalls()
    if request.param == "torch ops":
        monkeypatch.setattr(native_lora, "kernel", lambda: None)
        return calls
    calls.kernel = True
    k = built_kernel()

    class Spy:
        def lora_groups(self, *args: object) -> None:
            calls.append(1)
            k.lora_groups(*args)

        def tile(self) -> int:
            return k.tile()

    monkeypatch.setattr(native_lora, "kernel", Spy)
    return calls


def _stacked(seed: int, n_slices: int, in_dim: int, outs: tuple[int, ...]) -> tuple[tuple, tuple]:
    gen = torch.Generator().manual_seed(seed)
    a = tuple(torch.randn(SLOTS, 1, RANK, in_dim, generator=gen) for _ in range(n_slices))
    b = tuple(torch.randn(SLOTS, 1, o, RANK, generator=gen) for o in outs)
    for t in (*a, *b):
        t[SLOTS - 1].zero_()
    return a, b


def _wrapper(slot_of_seq: list[int], lens: list[int]) -> PunicaWrapperCPU:
    """A wrapper whose step maps sequence ``i`` (``lens[i]`` tokens) to slot ``slot_of_seq[i]`` (-1: none)."""
    index_to_id = [10 + i for i in range(SLOTS - 1)] + [None]
    ids = [index_to_id[s] if s >= 0 else 0 for s in slot_of_seq]
    token_ids = [i for i, n in zip(ids, lens, strict=True) for _ in range(n)]
    w = PunicaWrapperCPU(256, 32, device="cpu")
    w.update_metadata(LoRAMapping(token_ids, ids, is_prefill=True), index_to_id, SLOTS + 1, 100)
    return w


CASES = {
    "one adapter": ([2, 2, 2], [5, 1, 7]),
    "several adapters": ([0, 3, 1, 0, 3], [4, 1, 1, 6, 2]),
    "no adapter": ([-1, -1], [3, 4]),
    "adapters and none": ([1, -1, 2, -1, 1], [2, 3, 1, 1, 5]),
    "one adapter and none": ([-1, 0, -1], [1, 4, 2]),
    "a prefill beside decode tokens": ([0, 1, -1, 3, 1], [40, 1, 1, 1, 1]),  # padding would triple the work
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_lora_linear_matches_vllm(patched: None, case: str, lora_path: KernelCalls) -> None:
    slots, lens = CASES[case]
    w = _wrapper(slots, lens)
    n = sum(lens)
    a, b = _stacked(1, 3, HIDDEN, SLICES)
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(2))
    y0 = torch.randn(n, sum(SLICES), generator=torch.Generator().manual_seed(3))
    want, got = y0.clone(), y0.clone()
    _orig("add_lora_linear")(w, want, x, a, b, 0.5, SLICES)
    w.add_lora_linear(got, x, a, b, 0.5, SLICES)
    assert w._agentrl_groups.mode == {"no adapter": "none", "one adapter": "one"}.get(case, "many")
    lora_path.expect(w._agentrl_groups.mode != "none")
    _close(got, want)
    if case == "no adapter":
        assert torch.equal(got, y0)


@pytest.mark.parametrize("case", ["one adapter", "several adapters"])
def test_a_large_call_takes_the_kernel_for_several_slots_only(case: str, monkeypatch: pytest.MonkeyPatch,
                                                              lora_path: KernelCalls) -> None:
    """Above the one-thread bound, one slot's GEMMs run on the engine's threads (torch ops) and several slots'
    groups in the kernel (faster there at every size: padded batched GEMMs or a GEMM pair per group cost more)."""
    monkeypatch.setattr(cpu_lora, "SERIAL_MACS", 1)
    slots, lens = CASES[case]
    g = cpu_lora.Groups.of(torch.tensor([s for s, n in zip(slots, lens, strict=True) for _ in range(n)]))
    a, b = _stacked(11, 3, HIDDEN, SLICES)
    x = torch.randn(g.n, HIDDEN)
    want, got = torch.zeros(g.n, sum(SLICES)), torch.zeros(g.n, sum(SLICES))
    cpu_lora._lora_linear(g, want, x, a, b, 0.5, SLICES, 0)
    cpu_lora.lora_linear(g, got, x, a, b, 0.5, SLICES)
    lora_path.expect(g.mode == "many")
    _close(got, want)


@pytest.mark.parametrize("case", sorted(CASES))
def test_shrink_expand_pair_matches_vllm(patched: None, case: str) -> None:
    """The row-parallel layers' (o_proj, down_proj) pair: a zeroed float32 buffer, shrink, expand."""
    slots, lens = CASES[case]
    w = _wrapper(slots, lens)
    n = sum(lens)
    a, b = _stacked(4, 1, HIDDEN, (HIDDEN,))
    x = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(5))
    y0 = torch.randn(n, HIDDEN, generator=torch.Generator().manual_seed(6))
    outs = []
    for shrink, expand in ((_orig("add_shrink"), _orig("add_expand")), (PunicaWrapperCPU.add_shrink,
                                                                         PunicaWrapperCPU.add_expand)):
        buf = torch.zeros(1, n, RANK)
        y = y0.clone()
        shrink(w, buf, x, a, 1.0)
        expand(w, y, buf, b, (HIDDEN,), offset_start=0, add_input=True)
        outs.append(y)
    _close(outs[1], outs[0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_output_layers_lora_matches_vllm(patched: None, case: str, monkeypatch: pytest.MonkeyPatch,
                                            lora_path: KernelCalls) -> None:
    """``add_lora_logits``: one row per sequence (its sampled position), the slots of ``sampler_indices``; the
    logits are wider than the vocabulary the slots hold (padding), which gets nothing added."""
    calls = []
    fast = cpu_lora.lora_linear
    monkeypatch.setattr(cpu_lora, "lora_linear", lambda *a: calls.append(a[0]) or fast(*a))
    slots, lens = CASES[case]
    w = _wrapper(slots, lens)
    rows, vocab, padded = len(lens), 40, 64
    gen = torch.Generator().manual_seed(8)
    a = torch.randn(SLOTS, 1, RANK, HIDDEN, generator=gen)
    b = torch.randn(SLOTS, 1, vocab, RANK, generator=gen)
    a[SLOTS - 1].zero_()
    b[SLOTS - 1].zero_()
    x = torch.randn(rows, HIDDEN, generator=gen)
    y0 = torch.randn(rows, padded, generator=gen)
    want, got = y0.clone(), y0.clone()
    _orig("add_lora_logits")(w, want, x, a, b, 1.0)
    w.add_lora_logits(got, x, a, b, 1.0)
    assert len(calls) == 1 and calls[0] is w._agentrl_rows and w._agentrl_rows.n == rows  # the fast path ran
    lora_path.expect(w._agentrl_rows.mode != "none")
    _close(got, want)
    assert torch.equal(got[:, vocab:], y0[:, vocab:])


def test_prompt_logprob_rows_take_their_tokens_slots(patched: None) -> None:
    """vLLM scores a request's prompt positions (prompt logprobs) through the output layer as a slice of the
    step's hidden states: those rows get the slots of their tokens, not of the step's sampled sequences."""
    slots, lens = [1, -1, 2], [3, 4, 5]
    w = _wrapper(slots, lens)
    gen = torch.Generator().manual_seed(9)
    a = torch.randn(SLOTS, 1, RANK, HIDDEN, generator=gen)
    b = torch.randn(SLOTS, 1, 40, RANK, generator=gen)
    hidden = torch.randn(sum(lens), HIDDEN, generator=gen)
    for first, n, slot in ((0, 3, 1), (3, 4, -1), (7, 5, 2)):  # each request's prompt rows
        x = hidden[first:first + n]
        y0 = torch.randn(n, 48, generator=gen)
        got = y0.clone()
        w.add_lora_logits(got, x, a, b, 1.0)
        want = y0.clone()
        if slot >= 0:
            want[:, :40] += (x @ a[slot, 0].T) @ b[slot, 0].T
        _close(got, want)
    # a step of one slot: any rows take it, sliced or not
    w = _wrapper([3, 3], [2, 6])
    x = torch.randn(5, HIDDEN, generator=gen)
    got = torch.zeros(5, 40)
    w.add_lora_logits(got, x, a, b, 1.0)
    _close(got, (x @ a[3, 0].T) @ b[3, 0].T)


def test_groups_of_a_step() -> None:
    g = cpu_lora.Groups.of(torch.tensor([3, -1, 0, 3, 3, 0]))
    assert g.mode == "many" and g.slots.tolist() == [0, 3] and g.width == 3
    assert g.gather.tolist() == [2, 5, 2, 0, 3, 4]  # slot 0's two tokens padded with its first
    assert g.keep.tolist() == [0, 1, 3, 4, 5] and g.rows.tolist() == [2, 5, 0, 3, 4]
    assert cpu_lora.Groups.of(torch.tensor([-1, -1])).mode == "none"
    one = cpu_lora.Groups.of(torch.tensor([4, 4, 4]))
    assert (one.mode, one.slot) == ("one", 4)
    assert g.span is None  # slots 0 and 3: gathered
    even = cpu_lora.Groups.of(torch.tensor([1, 1, 2, 2]))
    assert even.keep is None and even.span == (1, 3)  # nothing padded; slots 1-2 are a view


def test_a_call_that_does_not_fit_runs_vllms_op(patched: None) -> None:
    """A call in another dtype than the slot tensors': vLLM's own op runs, with its result."""
    w = _wrapper([1], [4])
    a, b = _stacked(7, 1, HIDDEN, (HIDDEN,))
    x = torch.randn(4, HIDDEN).double()
    y = torch.zeros(4, HIDDEN).double()
    w.add_lora_linear(y, x, a, b, 1.0, (HIDDEN,))  # vLLM casts to the output's dtype
    want = x.float() @ a[0][1, 0].t() @ b[0][1, 0].t()
    _close(y.float(), want)


def test_switch_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_lora.ENV_SWITCH, "0")
    assert not cpu_lora.enabled()
    assert not vllm_patches.patch_cpu_lora_fast_path(force=True)
    assert cpu_lora.enabled({})


def test_bfloat16_runs_vllms_op(patched: None) -> None:
    """Every tensor in bfloat16: vLLM's ops run (they keep the shrunk activations in float32), bit for bit."""
    w = _wrapper([1, 2], [3, 2])
    a, b = _stacked(8, 1, HIDDEN, (HIDDEN,))
    a, b = tuple(t.bfloat16() for t in a), tuple(t.bfloat16() for t in b)
    x = torch.randn(5, HIDDEN).bfloat16()
    y0 = torch.randn(5, HIDDEN).bfloat16()
    want, got = y0.clone(), y0.clone()
    _orig("add_lora_linear")(w, want, x, a, b, 1.0, (HIDDEN,))
    w.add_lora_linear(got, x, a, b, 1.0, (HIDDEN,))
    assert torch.equal(got, want)


def test_an_inplace_write_and_a_replaced_buffer_are_served(patched: None) -> None:
    """One slot's views are kept between calls: a write into the slot (the in-place update) is read at the next
    call, and a slice whose buffer the layer replaced (a new slot layout) is read from the new buffer."""
    w = _wrapper([2], [6])
    a, b = _stacked(9, 3, HIDDEN, SLICES)
    x = torch.randn(6, HIDDEN, generator=torch.Generator().manual_seed(10))

    def served(a: tuple, b: tuple) -> torch.Tensor:
        y = torch.zeros(6, sum(SLICES))
        w.add_lora_linear(y, x, a, b, 1.0, SLICES)
        return y

    def want(a: tuple, b: tuple) -> torch.Tensor:
        return torch.cat([x @ ai[2, 0].t() @ bi[2, 0].t() for ai, bi in zip(a, b, strict=True)], dim=1)

    served(a, b)
    a[0][2].mul_(3.0)  # written in place, as the one-copy update writes the slot
    _close(served(a, b), want(a, b))
    moved = (a[0], a[1].clone() * 0.5, a[2])  # slice 1 moved to another buffer, slice 0 (the cache's owner) kept
    _close(served(moved, b), want(moved, b))


def test_one_thread_regions_bypass_the_workers_thread_stub(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CPU worker replaces torch.set_num_threads with a stub that only logs: a small LoRA call still runs
    on one thread (the builtin setter), calls no stub, and gives the engine its thread count back."""
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    before = torch.get_num_threads()
    torch._C.set_num_threads(2)
    seen: list[int] = []
    try:
        with cpu_lora._Serial(1):
            seen.append(torch.get_num_threads())
        after = torch.get_num_threads()
        with cpu_lora._Serial(cpu_lora.SERIAL_MACS):  # large: the engine's threads
            seen.append(torch.get_num_threads())
    finally:
        torch._C.set_num_threads(before)
    assert seen == [1, 2] and after == 2
    assert calls == []


@pytest.mark.parametrize("rank", [8, 16, 32, 12])
@pytest.mark.parametrize("hidden", [64, 72])
def test_the_kernel_equals_the_torch_ops(rank: int, hidden: int) -> None:
    """agentrl's kernel against the torch ops it replaces, at ranks its vector path takes (multiples of 16) and
    others, widths with and without a tail past 16, tokens of no adapter, a slice narrower than B (padded
    logits), slot tensors strided as the one-copy layout holds them, and a column offset."""
    k = built_kernel()
    gen = torch.Generator().manual_seed(rank * 100 + hidden)
    slots, outs, n = 6, (48, 20, 33), 90  # groups past the kernel's 32-token chunks
    per_slot = sum(rank * hidden + (o + 3) * rank for o in outs) + 5  # slot after slot, as slot_layout lays out
    flat = torch.randn(slots * per_slot, generator=gen)
    a, b, at = [], [], 0
    for o in outs:
        a.append(flat.as_strided((slots, 1, rank, hidden), (per_slot, rank * hidden, hidden, 1), at))
        at += rank * hidden
        b.append(flat.as_strided((slots, 1, o + 3, rank), (per_slot, (o + 3) * rank, rank, 1), at))
        at += (o + 3) * rank
    idx = torch.randint(-1, slots, (n,), generator=gen)
    idx[:3] = torch.tensor([0, 2, -1])
    g = cpu_lora.Groups.of(idx)
    assert g.mode == "many"
    x = torch.randn(n, hidden, generator=gen)
    y0 = torch.randn(n, 4 + sum(outs) + 2, generator=gen)
    want, got, team = y0.clone(), y0.clone(), y0.clone()
    cpu_lora._lora_linear(g, want, x, tuple(a), tuple(b), 0.25, outs, 4)
    k.lora_groups(got, x, a, b, g.order, g.offsets, g.slots, 0.25, list(outs), 4, 1)
    _close(got, want)
    k.lora_groups(team, x, a, b, g.order, g.offsets, g.slots, 0.25, list(outs), 4, 2)  # two threads, the same sums
    assert torch.equal(team, got)
    none = idx < 0
    assert torch.equal(got[none], y0[none]) and torch.equal(got[:, :4], y0[:, :4])
    assert torch.equal(got[:, -2:], y0[:, -2:])


def test_the_kernel_refuses_a_layout_it_cannot_read_and_writes_nothing() -> None:
    k = built_kernel()
    g = cpu_lora.Groups.of(torch.tensor([0, 1, 1]))
    a = torch.randn(2, 1, 16, 32)
    b = torch.randn(2, 1, 16, 16)
    x, y = torch.randn(3, 32), torch.randn(3, 16)
    y0 = y.clone()
    with pytest.raises(RuntimeError, match="last dimension must be contiguous"):
        k.lora_groups(y, x, [a], [b.transpose(2, 3)], g.order, g.offsets, g.slots, 1.0, [16], 0, 1)
    with pytest.raises(RuntimeError, match="must fit"):
        k.lora_groups(y, x, [a], [b], g.order, g.offsets, g.slots, 1.0, [16], 4, 1)
    assert torch.equal(y, y0)
    # lora_linear keeps serving such a call with the torch ops
    cpu_lora.lora_linear(g, y, x, (a,), (b.transpose(2, 3).contiguous().transpose(2, 3),), 1.0, (16,))
    assert not torch.equal(y, y0)
