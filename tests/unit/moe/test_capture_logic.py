"""`RoutingCapture`'s bookkeeping, driven by a fake router tap and a fake model runner (no vLLM): each
simulated step lays out its tokens (`on_layout`), "runs the forward pass" by writing the tap's step tensor,
and hands the rows out (`on_step_done`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentrl.engine import capture as capture_mod
from agentrl.engine.capture import UNCLAIMED_TTL_S, RoutingCapture

LAYERS, TOP_K, BLOCK = 3, 2, 4


def expected(seed: int, pos: int, experts: int = 16) -> np.ndarray:
    """The routing a forward pass with weights ``seed`` computes at ``pos`` (deterministic, distinct)."""
    layer = np.arange(LAYERS)[:, None]
    k = np.arange(TOP_K)[None, :]
    return (seed * 31 + pos * 5 + layer * 3 + k) % experts


def expected_rows(seed: int, positions: range, experts: int = 16) -> np.ndarray:
    return np.stack([expected(seed, p, experts) for p in positions]) if len(positions) else \
        np.zeros((0, LAYERS, TOP_K))


class Sim:
    """A fake engine: a tap, a block table per request, and steps of ``(request, first position, count, seed)``."""

    def __init__(self, experts: int = 16, max_tokens: int = 64, max_reqs: int = 4, max_blocks: int = 8) -> None:
        self.experts, self.max_reqs, self.max_blocks = experts, max_reqs, max_blocks
        self.tap = SimpleNamespace(layers=LAYERS, top_k=TOP_K, experts=experts, moe_layers=[0, 2],
                                   step=torch.zeros((max_tokens, LAYERS, TOP_K), dtype=torch.int32))
        self.cap = RoutingCapture(self.tap)
        self.blocks: dict[str, list[int]] = {}

    def step(self, chunks: list[tuple[str, int, int, int]], finished: tuple[str, ...] = ()) -> None:
        table = np.full((self.max_reqs, self.max_blocks), -7, dtype=np.int32)  # -7: never read
        per_row = np.zeros(self.max_reqs, dtype=np.int32)
        positions: list[int] = []
        for i, (req, start, count, _) in enumerate(chunks):
            blocks = self.blocks[req]
            assert len(blocks) * BLOCK >= start + count, "the fake's block table is too short"
            table[i, : len(blocks)] = blocks
            per_row[i] = len(blocks)
            positions += range(start, start + count)
        runner = SimpleNamespace(
            input_batch=SimpleNamespace(
                req_ids=[c[0] for c in chunks] + ["not-scheduled"],
                block_table=[SimpleNamespace(block_table=SimpleNamespace(np=table), num_blocks_per_row=per_row,
                                             block_size=BLOCK)],
            ),
            positions=torch.tensor(positions + [999] * 5),  # the engine's buffer is longer than the step
        )
        self.cap.on_layout(runner, np.array([c[2] for c in chunks]))
        # the forward pass: every router writes its rows; rows past the step's tokens hold leftovers
        self.tap.step.fill_(self.experts - 1)
        off = 0
        for _, start, count, seed in chunks:
            for p in range(start, start + count):
                self.tap.step[off] = torch.from_numpy(expected(seed, p, self.experts))
                off += 1
        self.cap.on_step_done(list(finished))

    def prefill_and_decode(self, req: str, prompt: int, decodes: int, seed: int, finish: bool = True) -> None:
        self.step([(req, 0, prompt, seed)])
        for i in range(decodes):
            last = i == decodes - 1
            self.step([(req, prompt + i, 1, seed)], finished=(req,) if finish and last else ())


def test_prefill_then_decode_gives_rows_in_order() -> None:
    sim = Sim()
    sim.blocks["r1"] = [2, 0, 5]
    sim.prefill_and_decode("r1", prompt=6, decodes=3, seed=1)
    n, rows = sim.cap.take("r1")
    assert n == 9  # positions 0..5 prefilled, 6..8 fed by the decodes (the 4th sampled token never fed)
    assert rows.dtype == np.uint8 and rows.shape == (9, LAYERS, TOP_K)
    np.testing.assert_array_equal(rows, expected_rows(1, range(9)))
    assert sim.cap.take("r1") is None  # forgotten once taken


def test_two_requests_in_one_step_get_their_own_rows() -> None:
    sim = Sim()
    sim.blocks |= {"a": [1, 2], "b": [3, 4]}
    sim.step([("a", 0, 5, 1), ("b", 0, 3, 2)])
    sim.step([("b", 3, 1, 2), ("a", 5, 1, 1)])  # the batch order changes between steps
    sim.step([("a", 6, 1, 1)])  # b waits a step
    sim.step([("b", 4, 1, 2)])
    n_a, rows_a = sim.cap.take("a")
    n_b, rows_b = sim.cap.take("b")
    assert (n_a, n_b) == (7, 5)
    np.testing.assert_array_equal(rows_a, expected_rows(1, range(7)))
    np.testing.assert_array_equal(rows_b, expected_rows(2, range(5)))


def test_unscheduled_request_in_the_batch_takes_no_tokens() -> None:
    sim = Sim()
    sim.blocks |= {"a": [1, 2], "idle": [3], "b": [4]}
    sim.step([("a", 0, 3, 1), ("idle", 0, 0, 9), ("b", 0, 2, 2)])
    assert sim.cap.take("idle") is None
    np.testing.assert_array_equal(sim.cap.take("a")[1], expected_rows(1, range(3)))
    np.testing.assert_array_equal(sim.cap.take("b")[1], expected_rows(2, range(2)))


def test_first_write_wins_after_preemption() -> None:
    sim = Sim()
    sim.blocks["r"] = [0, 1]
    sim.prefill_and_decode("r", prompt=4, decodes=2, seed=1, finish=False)  # holds positions 0..5
    # preempted, weights updated, recomputed from position 0 under new weights (seed 2), in two chunks
    sim.blocks["r"] = [6, 7]
    sim.step([("r", 0, 4, 2)])
    sim.step([("r", 4, 3, 2)])  # positions 4, 5 recomputed, 6 is new
    sim.step([("r", 7, 1, 2)], finished=("r",))
    n, rows = sim.cap.take("r")
    assert n == 8
    np.testing.assert_array_equal(rows[:6], expected_rows(1, range(6)))
    np.testing.assert_array_equal(rows[6:], expected_rows(2, range(6, 8)))


def test_prefix_cache_hit_gets_the_earlier_requests_rows() -> None:
    sim = Sim()
    sim.blocks["a"] = [3, 5, 1]
    sim.prefill_and_decode("a", prompt=9, decodes=2, seed=1)  # positions 0..10 in blocks 3, 5, 1
    assert sim.cap.take("a")[0] == 11
    # b shares a's first two blocks (positions 0..7): the engine schedules it from position 8
    sim.blocks["b"] = [3, 5, 6]
    sim.step([("b", 8, 3, 2)])
    # c shares only a's first block: scheduled from position 4
    sim.blocks["c"] = [3, 0]
    sim.step([("c", 4, 2, 3)])
    n_b, rows_b = sim.cap.take("b")
    assert n_b == 11
    np.testing.assert_array_equal(rows_b[:8], expected_rows(1, range(8)))
    np.testing.assert_array_equal(rows_b[8:], expected_rows(2, range(8, 11)))
    n_c, rows_c = sim.cap.take("c")
    assert n_c == 6
    np.testing.assert_array_equal(rows_c[:4], expected_rows(1, range(4)))
    np.testing.assert_array_equal(rows_c[4:], expected_rows(3, range(4, 6)))


def test_same_step_prefix_hit_laid_out_before_the_computing_request() -> None:
    sim = Sim()
    sim.blocks |= {"a": [1, 2, 3], "b": [1, 2, 4]}  # same 9-token prompt: b hits a's blocks 1, 2
    sim.step([("b", 8, 1, 1), ("a", 0, 9, 1)])  # reordered: b (has context) before a (pure prefill)
    n_b, rows_b = sim.cap.take("b")
    assert n_b == 9
    np.testing.assert_array_equal(rows_b, expected_rows(1, range(9)))


def test_same_step_prefix_hit_laid_out_after_the_computing_request() -> None:
    sim = Sim()
    sim.blocks |= {"a": [1, 2, 3], "b": [1, 2, 4]}
    sim.step([("a", 0, 9, 1), ("b", 8, 1, 1)])
    np.testing.assert_array_equal(sim.cap.take("b")[1], expected_rows(1, range(9)))


def test_take_slices_from_start_and_matches_internal_ids() -> None:
    sim = Sim()
    internal = "generate-tokens-3f9c2a-1a2b3c4d"
    sim.blocks[internal] = [0, 1]
    sim.prefill_and_decode(internal, prompt=5, decodes=2, seed=4)
    assert sim.cap.take("unknown") is None
    n, rows = sim.cap.take("3f9c2a", 3)
    assert n == 7
    np.testing.assert_array_equal(rows, expected_rows(4, range(3, 7)))
    assert rows.flags.c_contiguous
    assert sim.cap.take("3f9c2a") is None and sim.cap.take(internal) is None


def test_take_exact_id_and_start_past_the_end() -> None:
    sim = Sim()
    sim.blocks["x"] = [0, 1]
    sim.prefill_and_decode("x", prompt=3, decodes=1, seed=1)
    n, rows = sim.cap.take("x", 10)
    assert n == 4 and rows.shape == (0, LAYERS, TOP_K)


def test_unclaimed_finished_requests_expire(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(capture_mod.time, "monotonic", lambda: clock[0])
    sim = Sim()
    sim.blocks |= {"old": [0], "live": [1], "late": [2]}
    sim.step([("old", 0, 2, 1), ("live", 0, 2, 2), ("late", 0, 2, 3)], finished=("old", "ghost"))
    clock[0] = 1050.0
    sim.step([], finished=("old",))  # a repeated report keeps the first finish time
    sim.step([], finished=("late",))

    def idle(steps: int = 256) -> None:  # one purge every 256 steps
        for _ in range(steps):
            sim.cap.on_step_done([])

    clock[0] = 1000.0 + UNCLAIMED_TTL_S - 1
    idle()
    assert set(sim.cap.held) == {"old", "live", "late"}
    clock[0] = 1000.0 + UNCLAIMED_TTL_S + 1
    idle()
    assert set(sim.cap.held) == {"live", "late"}  # never finished, or finished 71 s ago
    assert sim.cap.take("old") is None
    np.testing.assert_array_equal(sim.cap.take("late")[1], expected_rows(3, range(2)))
    clock[0] = 1e9
    idle()
    assert sim.cap.take("live")[0] == 2  # a running request is never dropped


@pytest.mark.parametrize(("experts", "dtype"), [(8, np.uint8), (256, np.uint8), (257, np.uint16), (512, np.uint16)])
def test_dtype_follows_the_expert_count(experts: int, dtype: type) -> None:
    sim = Sim(experts=experts)
    assert sim.cap.dtype == dtype and sim.cap.slots.dtype == dtype
    sim.blocks["r"] = [0, 1]
    sim.prefill_and_decode("r", prompt=4, decodes=1, seed=9)
    n, rows = sim.cap.take("r")
    assert rows.dtype == dtype
    np.testing.assert_array_equal(rows, expected_rows(9, range(n), experts))
    if experts == 512:
        assert int(rows.max()) > 255  # ids above 255 survive
