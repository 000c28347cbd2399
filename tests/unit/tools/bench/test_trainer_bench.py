"""The pure parts of ``agentrl bench trainer``: the batch's lengths and the padded trainer's padding."""

from __future__ import annotations

from agentrl.config.run import SamplingConfig
from agentrl.config.trainer import TrainerConfig
from agentrl.tools.bench.trainer import default_budget, lengths_for, make_samples, padding_frac


def test_lengths_follow_the_mix_scaled_to_the_context() -> None:
    swe, math = lengths_for("swe", 64, 4096), lengths_for("math", 64, 4096)
    assert len(swe) == len(math) == 64 and lengths_for("swe", 64, 4096) == swe, "deterministic"
    assert all(8 <= n <= 4096 for n in swe + math)
    assert sorted(swe)[32] > 2 * sorted(math)[32], "swe trajectories are long, math ones short"
    assert max(math) > 4 * sorted(math)[32], "a long tail"
    doubled = lengths_for("math", 64, 8192)
    assert all(abs(b - 2 * a) <= 1 for a, b in zip(math, doubled, strict=True) if 8 < a and b < 8192)


def test_padding_frac_counts_the_padded_micro_batches() -> None:
    # one rank, budget 100: longest first -> [60] alone (60 + 40 padded to 2 x 60 = 120 > 100), then
    # [40, 30] padded to 2 x 40 = 80: real 130 of 140 positions
    assert abs(padding_frac([60, 40, 30], 1, 100) - 10 / 140) < 1e-9
    assert padding_frac([50, 50], 2, 100) == 0.0


def test_samples_train_three_quarters_of_each_trajectory() -> None:
    samples = make_samples([8, 40], vocab=300)
    assert [s.num_loss_tokens for s in samples] == [6, 30]
    assert {s.advantage > 0 for s in samples} == {True, False}


def test_the_default_budget_scales_the_window_as_a_runs_defaults_do() -> None:
    per_window = TrainerConfig(model_path="m").micro_batch_tokens / SamplingConfig().max_context_tokens
    assert default_budget(4096) == round(4096 * per_window) == 8192
    assert default_budget(512) == 1024
