"""``bench logprobs``' pure parts: the cases ``--matrix`` runs, each case's summary and targets, and the
human-readable report of every case (the JSON is checked by the real-engine test)."""

from __future__ import annotations

import argparse

import pytest

from agentrl.tools.bench import logprobs as bench


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**{"top_p": None, "top_k": None, "min_p": None, "matrix": False, **kw})


def test_the_matrix_runs_each_truncation_alone_then_all() -> None:
    assert bench.truncations(_args()) == {"none": {}}
    assert bench.truncations(_args(top_k=20)) == {"given": {"top_k": 20}}
    assert bench.truncations(_args(top_k=20, top_p=0.9)) == {"given": {"top_p": 0.9, "top_k": 20}}
    assert bench.truncations(_args(top_k=20, top_p=0.9, min_p=0.05, matrix=True)) == {
        "top_p": {"top_p": 0.9}, "top_k": {"top_k": 20}, "min_p": {"min_p": 0.05},
        "all": {"top_p": 0.9, "top_k": 20, "min_p": 0.05}}


def _res(mae: float, w: float) -> dict:
    return {"logprob_mae": mae, "is_weight_mean": w, "tokens": 100.0,
            "unmasked": {"logprob_mae": 0.2, "is_weight_mean": 0.8}}


@pytest.mark.parametrize(("mae", "w", "met"), [(1e-6, 1.0, True), (5e-4, 1.0, False), (1e-6, 0.97, False)])
def test_a_truncated_case_meets_its_targets_at_both_temperatures(mae: float, w: float, met: bool,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    case = bench._summarise({"truncation": {"top_k": 5}, "t1": _res(1e-6, 1.0), "tT": _res(mae, w),
                             "mask_bytes_per_token": 12.5,
                             "capture": {"tokens_per_s_capture": 90.0, "tokens_per_s_no_capture": 100.0,
                                         "capture_over_none": 0.9}})
    assert case["targets_met"] is met and case["logprob_mae"] == mae
    bench._print_case("top_k", case, 0.7)
    out = capsys.readouterr().out
    assert "T = 0.7" in out and "masks ignored" in out and "12.5 bytes/token" in out and "0.90x" in out
