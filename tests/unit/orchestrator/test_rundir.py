"""Run directories: a new run never writes into another's, a resume is checked, metrics read as one run."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.config.run import load_config
from agentrl.orchestrator.metrics import MetricsWriter, plot_run, read_jsonl, supersede_after
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
