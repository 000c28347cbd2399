"""The full-weight sync benchmark's pure helpers: quantiles, targets, the JSON summary, samples, host probes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from agentrl.tools.bench import full_sync
from agentrl.tools.bench.full_sync import (
    logprob_mae,
    memcpy_ms,
    percentile,
    samples_of,
    summarize,
    targets_met,
    trainer_peak_rss_gib,
)


def test_percentile_is_the_nearest_rank_and_nan_when_empty() -> None:
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 0.0) == 1.0
    assert percentile([4.0, 1.0, 3.0, 2.0], 1.0) == 4.0
    assert math.isnan(percentile([], 0.5))


@pytest.mark.parametrize(("ratio", "after", "stale", "met"), [
    (3.9, 5e-5, 1e-3, True),       # 1e-4 floor: a small stale gap does not demand the impossible
    (3.9, 2e-4, 1e-1, True),       # a hundredth of a large gap
    (4.1, 1e-7, 1e-2, False),      # too slow
    (1.0, 2e-4, 1e-2, False),      # engine does not follow the trainer
])
def test_targets(ratio: float, after: float, stale: float, met: bool) -> None:
    assert targets_met(ratio, after, stale) is met


def _sync(ms: float, after: float, stale: float) -> dict[str, float]:
    stages = {f"full_{st}_ms": ms / 10 for st in full_sync.STAGES}
    return {**stages, "total_ms": ms, "weight_bytes": 800.0, "full_sync_ms": ms,
            "logprob_mae_after_sync": after, "logprob_mae_stale": stale}


def test_summarize_takes_p50s_of_timings_and_means_of_maes() -> None:
    out = summarize([_sync(30.0, 1e-6, 1e-2), _sync(10.0, 3e-6, 3e-2), _sync(20.0, 2e-6, 2e-2)],
                    [4.0, 5.0, 6.0], 1 << 30)
    assert out["full_sync_ms_p50"] == 20.0 and out["full_sync_ms_max"] == 30.0
    assert out["memcpy_ms_p50"] == 5.0 and out["full_sync_over_memcpy"] == 4.0
    assert out["memcpy_gib_s"] == pytest.approx(200.0)
    assert out["bytes"] == 1 << 30
    assert out["full_load_ms_p50"] == 2.0 and out["full_version_reset_ms_p50"] == 2.0
    assert out["logprob_mae_after_sync"] == pytest.approx(2e-6)
    assert out["logprob_mae_stale"] == pytest.approx(2e-2)
    assert out["mae_ratio"] == pytest.approx(1e-4)
    with pytest.raises(ValueError):
        summarize([], [1.0], 1)


def test_samples_of_masks_the_prompt_and_carries_engine_logprobs() -> None:
    gens = [SimpleNamespace(token_ids=[7, 8], logprobs=[-0.5, -1.5]),
            SimpleNamespace(token_ids=[9], logprobs=[-2.0])]
    samples = samples_of([[1, 2, 3], [4, 5]], gens, 3, [1.0, -1.0])
    a, b = samples
    assert a.input_ids == [1, 2, 3, 7, 8] and a.loss_mask == [0, 0, 0, 1, 1]
    assert a.behav_logprobs == [0.0, 0.0, 0.0, -0.5, -1.5] and a.versions == [-1, -1, -1, 3, 3]
    assert (a.advantage, b.advantage) == (1.0, -1.0) and a.temperature == 1.0
    assert samples_of([[1, 2]], gens[:1], 0)[0].advantage == 0.0
    # the trainer's logprobs are per position (0 at position 0); only sampled tokens count
    mae = logprob_mae(samples, [[0.0, -9.0, -9.0, -0.4, -1.5], [0.0, -9.0, -2.3]])
    assert mae == pytest.approx((0.1 + 0.0 + 0.3) / 3)


def test_memcpy_times_every_repetition() -> None:
    times = memcpy_ms(1 << 16, reps=3)
    assert len(times) == 3 and all(t >= 0.0 for t in times)


def test_trainer_peak_rss_reads_the_ranks_among_the_launchers_children() -> None:
    pytest.importorskip("psutil")
    env = {**os.environ, "RANK": "0"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, env=env)
    try:
        rss = trainer_peak_rss_gib(os.getpid())
    finally:
        child.communicate(b"")
    assert rss is not None and len(rss) == 1 and 0.0 < rss[0] < 64.0


def test_bench_sync_full_hands_its_other_arguments_to_the_full_benchmark(monkeypatch) -> None:
    from agentrl.tools.bench import sync

    seen: list[list[str]] = []
    monkeypatch.setattr(full_sync, "main", lambda argv: seen.append(argv) or 0)
    assert sync.main(["--model-size", "0.5b", "--full", "--nproc", "2", "--json"]) == 0
    assert seen == [["--model-size", "0.5b", "--nproc", "2", "--json"]]


def test_a_model_that_is_not_a_directory_is_refused(tmp_path, capsys) -> None:
    from agentrl.tools.bench.full_sync import main

    with pytest.raises(SystemExit) as exc:
        main(["--model", str(tmp_path / "nothing"), "--json"])
    assert exc.value.code == 2 and "not a model directory (no config.json)" in capsys.readouterr().err
