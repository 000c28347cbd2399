"""``agentrl bench trainer`` end to end on real torchrun trainers (a tiny random model, a small batch): the
JSON line carries every figure the docs report. The figures' sizes are timings, so only their sense is
checked here; docs/training.md has the measured ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]


def test_bench_trainer_reports_padded_and_packed_side_by_side() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "bench", "trainer", "--mix", "math", "--size", "tiny",
         "--context", "512", "--samples", "12", "--rounds", "1", "--share-reps", "1", "--json"],
        capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    # micro_batch_tokens: by default twice the window, as a run's defaults give it
    assert (res["mix"], res["nproc"], res["samples"], res["micro_batch_tokens"]) == ("math", 2, 12, 1024)
    assert res["tokens"] > 12 * 8 and res["length_median"] <= res["length_max"] <= 512
    for key in ("tokens_per_s_padded", "tokens_per_s_packed", "packed_over_padded"):
        assert res[key] > 0, key
    assert res["packed_over_padded"] == pytest.approx(res["step_s_padded"] / res["step_s_packed"], rel=1e-2)
    assert 0.0 < res["padding_frac"] < 1.0, "a long-tail batch padded longest-first still pads"
    assert [len(v) for v in res["rank_share_s"].values()] == [2, 2]
    assert res["loss_rel_diff"] < 1e-4, res["first_step"]
    assert res["rank_imbalance"] >= 1.0 and res["rank_imbalance_unbalanced"] >= 1.0
    assert res["rank_cost_imbalance"] >= 1.0 and res["rank_cost_imbalance_unbalanced"] >= 1.0
