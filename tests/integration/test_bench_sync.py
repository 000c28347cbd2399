"""``agentrl bench sync`` on a real vLLM engine (its own, a random tiny Qwen2 with a rank-8 adapter): the in-place
update is checked against a file load on both control paths, each stage is reported, and the engine's own floors
(a one-token request with nothing published, the pace of a running stream) sit beside the end-to-end figures
they bound, with two other adapters holding slots beside the benchmarked one, every adapter with a LoRA on the
output layer too (``--unembed``). The JSON follows from its own figures (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.integration


def test_bench_sync_reports_the_stages_and_the_engines_floors(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.sync import main

    # two other adapters hold slots beside the benchmarked one: its updates must land in its own slot of three,
    # the output layer's LoRA with the rest (one copy)
    assert main(["--updates", "4", "--rank", "8", "--slots", "3", "--unembed", "--json",
                 "--work-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, "--json prints only the JSON line"
    r = json.loads(out[-1])
    assert r["correctness"]["ok"] and r["correctness_control"]["ok"]
    assert r["slots_held"] == 3 and "3 adapters held in slots" in r["model"] and "/lm_head" in r["model"]
    assert r["engine_copies"] == 1, "the slots were laid out as the segment: one copy an update"
    for path in ("", "control_"):
        assert 0 < r[f"{path}engine_ms_p50"] <= r[f"{path}total_ms_p50"] <= r[f"{path}end_to_end_ms_p50"], path
        assert r[f"{path}request_ms_p50"] > 0, path
        assert r[f"{path}sync_adds_ms_p50"] == pytest.approx(r[f"{path}end_to_end_ms_p50"] - r[f"{path}request_ms_p50"])
    assert r["token_gap_ms_p50"] > 0 and r["in_flight_samples"] >= 1
    assert r["control_in_flight_over_token_gap"] == pytest.approx(
        r["control_in_flight_end_to_end_ms_p50"] / r["token_gap_ms_p50"])
    assert r["memcpy_ms_p50"] > 0 and r["cold_memcpy_ms_p50"] > 0
