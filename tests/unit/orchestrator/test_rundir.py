"""Run directories: a new run never writes into another's, a resume is checked, metrics read as one run;
the reward curve's rolling mean and error bars."""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.config.run import load_config
from agentrl.core.utils.stats import binomial_stderr
from agentrl.orchestrator.metrics import (
    MetricsWriter,
    eval_stderrs,
    format_estimate,
    plot_run,
    read_jsonl,
    rolling_mean,
    rolling_window,
    supersede_after,
)
from agentrl.orchestrator.rundir import RUN_FILE, RunDirError, open_run


def cfg(tmp_path: Path, **over):
    return load_config(None, {"output_dir": str(tmp_path), "model": "some/model", **over})


def test_default_names_take_the_first_free_suffix_and_keep_both_runs(tmp_path: Path) -> None:
    first, id1 = open_run(cfg(tmp_path), resume=False)
    (tmp_path / "calc" / "metrics.jsonl").write_text('{"step": 1}\n')
    second, id2 = open_run(cfg(tmp_path), resume=False)
    assert (first.name, second.name) == ("calc", "calc-2") and id1 != id2
    assert (tmp_path / "calc" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert json.loads((tmp_path / "calc-2" / RUN_FILE).read_text())["run_id"] == id2
    (tmp_path / "calc-3").mkdir()  # an empty directory is free
    assert open_run(cfg(tmp_path), resume=False)[0].name == "calc-3"
    assert cfg(tmp_path, env="my_env.py:Weather").run_dir == tmp_path / "weather"


def test_runs_started_at_once_never_share_a_directory(tmp_path: Path) -> None:
    with ThreadPoolExecutor(8) as pool:
        names = list(pool.map(lambda _: open_run(cfg(tmp_path), resume=False)[0].name, range(8)))
    assert sorted(names) == sorted(["calc", *(f"calc-{i}" for i in range(2, 9))])


def test_an_explicit_name_that_holds_a_run_is_refused_without_resume(tmp_path: Path) -> None:
    open_run(cfg(tmp_path, name="exp"), resume=False)
    with pytest.raises(RunDirError, match=r"exp already holds a run; continue it with --resume, or .* --name"):
        open_run(cfg(tmp_path, name="exp"), resume=False)


def test_resume_continues_the_same_run_and_refuses_a_different_one(tmp_path: Path) -> None:
    _, run_id = open_run(cfg(tmp_path, name="exp"), resume=False)
    again, same_id = open_run(cfg(tmp_path, name="exp", steps=200), resume=True)  # steps may change
    assert again.name == "exp" and same_id == run_id
    with pytest.raises(RunDirError, match=r"model: 'some/model' -> 'other/model'"):
        open_run(cfg(tmp_path, name="exp", model="other/model"), resume=True)
    with pytest.raises(RunDirError, match=r"lora\.rank: 16 -> 32"):
        open_run(cfg(tmp_path, name="exp", trainer={"lora_rank": 32}), resume=True)
    with pytest.raises(RunDirError, match=r"env: 'calc' -> 'swe'"):
        open_run(cfg(tmp_path, name="exp", env="swe"), resume=True)
    with pytest.raises(RunDirError, match=r"there is no run in .*nothing"):
        open_run(cfg(tmp_path, name="nothing"), resume=True)


def test_resume_without_a_name_takes_the_latest_run_of_the_default_name(tmp_path: Path) -> None:
    open_run(cfg(tmp_path), resume=False)
    _, second = open_run(cfg(tmp_path), resume=False)
    resumed, run_id = open_run(cfg(tmp_path), resume=True)
    assert (resumed.name, run_id) == ("calc-2", second)


def test_a_run_from_before_run_ids_is_resumed_and_given_one(tmp_path: Path) -> None:
    old = tmp_path / "calc"
    old.mkdir()
    (old / "config.json").write_text(cfg(tmp_path, name="calc").model_dump_json())
    resumed, run_id = open_run(cfg(tmp_path), resume=True)
    assert resumed.name == "calc" and json.loads((old / RUN_FILE).read_text())["run_id"] == run_id


def test_resume_moves_the_interrupted_steps_aside_and_metrics_read_as_one_run(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path, "r1")
    for step in (0, 1, 2, 3):
        writer.write({"kind": "train", "step": step, "reward_mean": step / 10})
    with path.open("a") as f:
        f.write('{"kind": "train", "step": 4, "rew')  # torn by a SIGKILL
    assert supersede_after(path, 2) == 1
    writer.write({"kind": "train", "step": 3, "reward_mean": 0.5})
    recs = read_jsonl(path)
    assert [r["step"] for r in recs] == [0, 1, 2, 3] and {r["run_id"] for r in recs} == {"r1"}
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.superseded.jsonl")] == [3]
    assert plot_run(path, tmp_path / "curve.png", "r1").stat().st_size > 1000


def test_rolling_window_is_a_tenth_of_the_steps_between_3_and_10_and_never_more_than_the_points() -> None:
    assert [rolling_window(n) for n in (0, 1, 2, 3, 5, 30, 44, 50, 76, 100, 500)] == [1, 1, 2, 3, 3, 3, 4, 5, 8, 10, 10]


def test_rolling_mean_is_trailing_uses_partial_windows_at_the_start_and_skips_nans() -> None:
    assert rolling_mean([1.0, 2.0, 3.0, 4.0, 5.0], 3) == [1.0, 1.5, 2.0, 3.0, 4.0]
    assert rolling_mean([0.5], 3) == [0.5] and rolling_mean([], 3) == []
    got = rolling_mean([math.nan, 1.0, None, 3.0, math.nan, math.nan, math.nan], 2)
    assert math.isnan(got[0]) and got[1:5] == [1.0, 1.0, 3.0, 3.0] and math.isnan(got[5]) and math.isnan(got[6])
    with pytest.raises(ValueError, match="window"):
        rolling_mean([1.0], 0)


def test_binomial_stderr_of_a_rate_and_none_without_a_usable_count_or_rate() -> None:
    assert binomial_stderr(0.35, 200) == pytest.approx(math.sqrt(0.35 * 0.65 / 200))  # 0.03373
    assert binomial_stderr(0.5, 100.0) == pytest.approx(0.05) and binomial_stderr(1.0, 50) == 0.0
    assert [binomial_stderr(0.5, n) for n in (None, 0, -3, math.nan)] == [None] * 4
    assert binomial_stderr(1.5, 100) is None and binomial_stderr(math.nan, 100) is None


def test_eval_error_bars_only_for_rates_and_the_annotation_text() -> None:
    assert eval_stderrs([0.5, 0.19], [100, None]) == [pytest.approx(0.05), None]
    assert eval_stderrs([0.5, 2.5], [100, 100]) == [None, None]  # a reward beyond [0, 1] is no rate
    assert format_estimate(0.35, binomial_stderr(0.35, 200)) == "0.35 ± 0.03" and format_estimate(0.35, None) == "0.35"


def test_the_reward_curve_renders_train_and_eval_records_and_degenerate_metrics(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.jsonl"
    writer = MetricsWriter(path, "r1")
    writer.write({"kind": "eval", "step": 0, "success": 0.35, "reward_mean": 0.4, "num_episodes": 200.0})
    writer.write({"kind": "warmup", "step": 0, "warmup_s": 1.0})
    for step in range(1, 21):
        writer.write({"kind": "train", "step": step, "reward_mean": 0.3 + 0.02 * step + (0.1 if step % 2 else -0.1)})
    writer.write({"kind": "train", "step": 21, "reward_mean": math.nan})
    writer.write({"kind": "eval", "step": 10, "success": 0.5})  # no num_episodes: no error bar
    writer.write({"kind": "eval", "step": 20, "success": 0.62, "num_episodes": 200.0})
    writer.write({"kind": "groups", "step": 20, "n": 3})
    png = plot_run(path, tmp_path / "run" / "reward_curve.png", "r1")
    sizes = {}
    for name, lines in {"empty": [], "one": ['{"kind": "train", "step": 1, "reward_mean": 0.5}'],
                        "no_reward": ['{"kind": "train", "step": 1}', '{"kind": "eval", "step": 1}']}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(line + "\n" for line in lines))
        sizes[name] = plot_run(tmp_path / name / "metrics.jsonl", tmp_path / name / "c.png").stat().st_size
        assert sizes[name] > 1000
    # the curves, bars and labels add far more to the PNG than an empty frame holds (~17 kB vs ~68 kB)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 2 * sizes["empty"]
