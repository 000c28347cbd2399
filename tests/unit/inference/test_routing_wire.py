"""Routing on the wire: the worker's take record (`RoutingCaptureMixin`) and vLLM's own `routed_experts`,
read back by `routing_rows` / `native_routing`."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from agentrl.engine.capture import RoutingCapture
from agentrl.engine.routing import ROUTING_MISSING, ROUTING_UNAVAILABLE, RoutingCaptureMixin
from agentrl.inference.wire import RoutingRows, native_routing, parse_generate, routing_rows

LAYERS, TOP_K = 2, 2


def tap(experts: int = 8) -> SimpleNamespace:
    return SimpleNamespace(layers=LAYERS, top_k=TOP_K, experts=experts, moe_layers=[1],
                           step=torch.zeros((32, LAYERS, TOP_K), dtype=torch.int32))


def runner(t: SimpleNamespace, req_ids: list[str], positions: list[int]) -> SimpleNamespace:
    table = np.arange(4 * 4, dtype=np.int32).reshape(4, 4)  # request i owns blocks 4i .. 4i+3
    return SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=req_ids, block_table=[SimpleNamespace(
            block_table=SimpleNamespace(np=table), num_blocks_per_row=np.full(4, 4), block_size=4)]),
        positions=torch.tensor(positions), _agentrl_router_tap=t)


def run_step(cap: RoutingCapture, req: str, start: int, count: int, experts: int = 8) -> None:
    """One step of one request whose routing at position p is ``p + layer + k`` (mod experts)."""
    cap.on_layout(runner(cap.tap, [req], list(range(start, start + count))), np.array([count]))
    for i, p in enumerate(range(start, start + count)):
        cap.tap.step[i] = torch.tensor([[(p + layer + k) % experts for k in range(TOP_K)] for layer in range(LAYERS)])
    cap.on_step_done([])


def routing_of(positions: range, experts: int = 8) -> np.ndarray:
    return np.array([[[(p + layer + k) % experts for k in range(TOP_K)] for layer in range(LAYERS)]
                     for p in positions]).reshape(len(positions), LAYERS, TOP_K)


class Worker(RoutingCaptureMixin):
    """A plain object standing in for vLLM's worker."""


def test_take_record_round_trips_through_routing_rows() -> None:
    w = Worker()
    w._agentrl_routing = cap = RoutingCapture(tap())
    run_step(cap, "generate-tokens-abc-0badf00d", 0, 5)
    run_step(cap, "generate-tokens-abc-0badf00d", 5, 1)
    rec = w.agentrl_routing_take("abc", "2")
    assert rec["ok"] and (rec["n"], rec["start"], rec["shape"], rec["dtype"]) == (6, 2, [4, LAYERS, TOP_K], "uint8")
    got = routing_rows(rec)
    assert isinstance(got, RoutingRows) and got.start == 2
    assert got.rows.dtype == np.uint8
    np.testing.assert_array_equal(got.rows, routing_of(range(2, 6)))
    again = w.agentrl_routing_take("abc", "0")  # taken: forgotten
    assert (again["ok"], again["code"]) == (False, ROUTING_MISSING) and "abc" in again["error"]


def test_take_record_uint16_and_empty() -> None:
    w = Worker()
    w._agentrl_routing = cap = RoutingCapture(tap(experts=300))
    run_step(cap, "r", 0, 3, experts=300)
    rec = w.agentrl_routing_take("r", "3")  # nothing new past the end
    assert rec["ok"] and (rec["n"], rec["start"], rec["shape"], rec["dtype"]) == (3, 3, [0, LAYERS, TOP_K], "uint16")
    got = routing_rows(rec)
    assert got.start == 3 and got.rows.shape == (0, LAYERS, TOP_K)
    w._agentrl_routing = cap = RoutingCapture(tap(experts=300))
    cap.on_layout(runner(cap.tap, ["s"], [0, 1]), np.array([2]))
    cap.tap.step[:2] = torch.tensor([[[299, 256], [1, 2]], [[3, 4], [280, 0]]])
    cap.on_step_done(["s"])
    got = routing_rows(w.agentrl_routing_take("s"))
    assert got.rows.dtype == np.uint16
    np.testing.assert_array_equal(got.rows, [[[299, 256], [1, 2]], [[3, 4], [280, 0]]])


def test_take_without_capture_is_a_record() -> None:
    rec = Worker().agentrl_routing_take("x")
    assert (rec["ok"], rec["code"]) == (False, ROUTING_UNAVAILABLE) and "not enabled" in rec["error"]


def test_enable_reports_the_shape_and_is_idempotent() -> None:
    w = Worker()
    w._agentrl_routing = RoutingCapture(tap(experts=512))
    assert w.agentrl_routing_enable() == {"ok": True, "layers": LAYERS, "top_k": TOP_K, "experts": 512,
                                          "moe_layers": [1], "dtype": "uint16", "new": False}


def test_enable_installs_on_the_runner_once() -> None:
    t = tap()
    calls: list[str] = []
    r = runner(t, ["req-1"], [0, 1, 2])

    def prepare(scheduler_output: Any, num_scheduled: Any) -> str:
        calls.append("prepare")
        return "prepared"

    def execute(scheduler_output: Any) -> str:
        calls.append("execute")
        t.step[:3] = torch.tensor(routing_of(range(3)))
        return "executed"

    r._prepare_inputs, r.execute_model = prepare, execute
    r.vllm_config = SimpleNamespace(model_config=SimpleNamespace(get_num_experts=lambda: 8, model="m"))
    w = Worker()
    w.model_runner = r
    first = w.agentrl_routing_enable()
    assert first["ok"] and first["dtype"] == "uint8" and first["new"]
    wrapped = (r._prepare_inputs, r.execute_model)
    assert w.agentrl_routing_enable() == {**first, "new": False} and (r._prepare_inputs, r.execute_model) == wrapped
    out = SimpleNamespace(finished_req_ids={"req-1"})
    assert r._prepare_inputs(out, [3]) == "prepared" and r.execute_model(out) == "executed"
    assert calls == ["prepare", "execute"]
    got = routing_rows(w.agentrl_routing_take("req-1"))
    np.testing.assert_array_equal(got.rows, routing_of(range(3)))


@pytest.mark.parametrize(("experts", "needle"), [(0, "is not a mixture-of-experts model"),
                                                 (8, "has no MoE router whose decisions can be captured")])
def test_enable_on_an_engine_that_cannot_capture(experts: int, needle: str) -> None:
    w = Worker()
    w.model_runner = SimpleNamespace(vllm_config=SimpleNamespace(
        model_config=SimpleNamespace(get_num_experts=lambda: experts, model="org/model")))
    rec = w.agentrl_routing_enable()
    assert (rec["ok"], rec["code"]) == (False, ROUTING_UNAVAILABLE)
    assert rec["error"] == f"RoutingNotCapturable: org/model {needle}"  # a ValueError, caught by the engine
    assert "_agentrl_routing" not in w.__dict__
    rec = Worker().agentrl_routing_enable()  # no model runner at all
    assert (rec["ok"], rec["code"]) == (False, ROUTING_UNAVAILABLE) and rec["error"].startswith("AttributeError")


def npy_b64(arr: np.ndarray) -> str:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def test_native_routing_reads_vllms_npy() -> None:
    small = np.arange(24, dtype=np.int32).reshape(4, 3, 2)
    got = native_routing(npy_b64(small))
    assert got.start == 0 and got.rows.dtype == np.uint8
    np.testing.assert_array_equal(got.rows, small)
    big = small + 250
    got = native_routing(npy_b64(big.astype(np.int64)))
    assert got.rows.dtype == np.uint16
    np.testing.assert_array_equal(got.rows, big)
    empty = native_routing(npy_b64(np.zeros((0, 3, 2), dtype=np.int32)))
    assert empty.rows.shape == (0, 3, 2) and empty.rows.dtype == np.uint8
    with pytest.raises(ValueError, match="expected \\[positions, layers, top_k\\]"):
        native_routing(npy_b64(np.zeros((4, 6), dtype=np.int32)))


def test_parse_generate_reads_routed_experts() -> None:
    arr = np.arange(12, dtype=np.int32).reshape(3, 2, 2)
    choice = {"token_ids": [5, 6], "finish_reason": "stop", "routed_experts": npy_b64(arr),
              "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]}}
    gen = parse_generate({"choices": [choice]}, "http://e")
    assert gen.routing is not None and gen.routing.start == 0
    np.testing.assert_array_equal(gen.routing.rows, arr)
    del choice["routed_experts"]
    assert parse_generate({"choices": [choice]}, "http://e").routing is None
