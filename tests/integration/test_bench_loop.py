"""``agentrl bench loop`` on the session vLLM server: calc episodes through the agent loop, then the same
requests replayed raw; the JSON report is well-formed and consistent (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.integration


def test_bench_loop_reports_both_rates(vllm_server, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.bench.loop import main

    assert main(["--tasks", "3", "--group-size", "2", "--concurrency", "4", "--repeats", "2", "--json",
                 "--model", str(tiny_model_dir), "--endpoint", vllm_server.url, "--profile", "5"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, "--json prints only the JSON line"
    r = json.loads(out[-1])
    assert r["episodes"] == 3 * 2 * 2 and r["failed_episodes"] == 0
    assert sum(r["stop_reasons"].values()) == r["episodes"]
    assert r["requests"] >= r["episodes"] and r["tokens"] > 0
    assert r["loop_tokens_per_s"] > 0 and r["raw_tokens_per_s"] > 0
    assert len(r["loop_over_raw_pairs"]) == 2 and r["loop_over_raw"] > 0
    assert r["loop_over_raw_total"] == pytest.approx(r["loop_tokens_per_s"] / r["raw_tokens_per_s"], rel=1e-2)
    assert r["target_met"] == (r["loop_over_raw"] >= 0.95)
    assert r["loop_client_cpu_s"] > 0 and r["raw_client_cpu_s"] > 0
    assert 0 < len(r["profile_top"]) <= 5 and all(row["calls"] > 0 for row in r["profile_top"])

