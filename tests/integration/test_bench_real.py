"""``agentrl bench pipeline --real`` on real parts: its own vLLM server and torchrun trainer, a short
PolyTrace-shaped trace replayed in sync then async mode; the JSON report must be consistent."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_bench_pipeline_real_mode(vllm_server, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.pipeline_real import main

    r = main(["--real", "--mix", "tool", "--steps", "3", "--groups-per-step", "2",
              "--group-size", "2", "--model", str(tiny_model_dir), "--endpoint", vllm_server.url, "--token-scale", "0.05",
              "--time-scale", "0.2", "--max-len", "512"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last) == r, "the last printed line is the JSON report"
    assert r["real"] is True and r["steps"] == 3
    assert r["wall_s_sync"] > 0 and r["wall_s_async"] > 0 and r["async_over_sync"] > 0
    for key in ("trainer_idle_sync", "trainer_idle_async", "inference_idle_sync", "inference_idle_async"):
        assert 0.0 <= r[key] <= 1.0, (key, r[key])
    # every trained group (3 steps x 2 groups) is in the histogram
    assert sum(r["staleness_hist"].values()) == 3 * 2
    assert r["update_ms_p50_async"] > 0
    # an async run's defaults: η 2 at admission, nothing dropped for staleness, tokens past η + 2 masked (none
    # can be that old within 3 steps)
    assert (r["eta"], r["drop_policy"], r["max_token_age"]) == (2, "accept", 4)
    assert r["dropped_groups"] == 0 and r["dropped_token_frac"] == 0.0


def test_bench_logprobs_engine_and_trainer_agree(vllm_server, tiny_model_dir: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``agentrl bench logprobs`` on the session vLLM server and its own torchrun trainer: at T = 0.7 the engine's
    logprobs and the trainer's (scaled by the trajectory's temperature) agree, and a trainer that ignored
    the temperature would not."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.logprobs import main

    assert main(["--temperature", "0.7", "--episodes", "16", "--json", "--model", str(tiny_model_dir),
                 "--endpoint", vllm_server.url]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert r["temperature"] == 0.7 and r["tokens"] > 100 and r["failed_episodes"] == 0
    assert abs(r["is_weight_mean"] - 1.0) <= 0.03 and abs(r["t1"]["is_weight_mean"] - 1.0) <= 0.03
    assert r["logprob_mae"] < 1e-3 and r["mae_ratio_vs_t1"] <= 1.5 and r["targets_met"] is True
    assert r["untempered"]["logprob_mae"] > 10 * r["logprob_mae"], "the check must see a missing temperature"


def test_bench_logprobs_truncation_matrix_scores_with_masks(vllm_server, tiny_model_dir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``agentrl bench logprobs --matrix`` with top-p, top-k and min-p: each alone and together, at T = 1 and
    0.7, the trainer renormalised over the engine's recorded sets scores what the engine sampled (float noise),
    and a trainer that ignores the masks does not; the masks' bytes and the capture's cost are reported."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.logprobs import main

    assert main(["--temperature", "0.7", "--episodes", "8", "--json", "--model", str(tiny_model_dir),
                 "--endpoint", vllm_server.url, "--top-p", "0.8", "--top-k", "5", "--min-p", "0.1", "--matrix",
                 "--burst", "4"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sorted(r["cases"]) == ["all", "min_p", "top_k", "top_p"]
    for name, case in r["cases"].items():
        for res in (case, case["t1"]):
            assert res["failed_episodes"] == 0 and res["tokens"] > 20, name
            assert res["logprob_mae"] <= 1e-4 and abs(res["is_weight_mean"] - 1.0) <= 0.02, (name, res)
            assert res["unmasked"]["logprob_mae"] > 10 * max(res["logprob_mae"], 1e-6), (name, res)
        assert case["targets_met"] is True and case["mask_bytes_per_token"] > 0
        assert case["capture"]["tokens_per_s_capture"] > 0 and case["capture"]["tokens_per_s_no_capture"] > 0
    assert r["truncation"] == {"top_p": 0.8, "top_k": 5, "min_p": 0.1} and r["targets_met"] is True
