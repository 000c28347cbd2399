"""``agentrl bench loop`` on the session vLLM server: calc episodes through the agent loop, then the same
requests replayed raw; and `agentrl bench policy`, direct calls vs the policy endpoint. Each JSON report is
well-formed and consistent (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = pytest.mark.integration


def test_bench_loop_reports_both_rates(vllm_server, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.loop import main

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



def test_bench_policy_reports_both_paths(vllm_server, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``agentrl bench policy`` on the session vLLM server: the same calls direct and through the policy
    endpoint; the JSON report is well-formed and its ratios follow from its own figures."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.policy import main

    assert main(["--calls", "4", "--tokens", "8", "--rounds", "1", "--concurrency", "4", "--json",
                 "--model", str(tiny_model_dir), "--endpoint", vllm_server.url]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, "--json prints only the JSON line"
    r = json.loads(out[-1])
    assert r["bench"] == "policy" and r["calls"] == 4 and r["tokens_per_call"] == 8
    assert r["serve_in"] == "thread", "by default the endpoint serves as in a training run: on its own loop"
    for key in ("direct_latency_ms", "endpoint_latency_ms", "direct_calls_per_s_4", "endpoint_calls_per_s_4",
                "endpoint_only_ms", "endpoint_only_per_s", "sdk_client_ms", "sdk_latency_ms", "sdk_calls_per_s_4"):
        assert r[key] > 0, (key, r[key])
    assert r["engine_cores"] is None and r["endpoint_cores"] is None, "a running engine is left as it is"
    assert 0 < r["stream_first_content_ms"] < r["stream_total_ms"], "content was seen before the stream ended"
    assert r["latency_ratio"] == pytest.approx(r["endpoint_latency_ms"] / r["direct_latency_ms"], rel=1e-6)
    assert r["overhead_ms_per_call"] == pytest.approx(r["endpoint_latency_ms"] - r["direct_latency_ms"], rel=1e-6)
    assert r["sdk_throughput_ratio_4"] == pytest.approx(r["sdk_calls_per_s_4"] / r["direct_calls_per_s_4"], rel=1e-6)
    assert r["throughput_ratio"] == r["throughput_ratio_4"] == pytest.approx(
        r["endpoint_calls_per_s_4"] / r["direct_calls_per_s_4"], rel=1e-6)
