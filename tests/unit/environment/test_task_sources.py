"""Task sources beyond JSONL: parquet, CSV, saved and hub datasets, splits, column mapping, the fields an
environment needs, and the SWE environment refusing tasks it cannot run (no engine, no network)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agentrl.core.errors import ConfigError
from agentrl.environment.base import Environment
from agentrl.environment.tasks import MissingDataExtra, TaskSourceError, load_tasks, read_tasks_jsonl
from agentrl.envs.calc import CalcEnv
from agentrl.envs.swe import SweEnv
from agentrl.envs.swe.config import SweConfig
from agentrl.envs.swe.env import BUNDLED_TASKS
from agentrl.sandbox import SandboxConfig
from tests.conftest import require

ROWS = [
    {"id": "a", "q": "1 + 1", "a": "2", "split": "train"},
    {"id": "b", "q": "2 * 3", "a": "6", "split": "test"},
    {"id": "c", "q": "9 - 4", "a": "5", "split": "train"},
]


class QA(Environment):
    """Needs ``question`` and ``answer`` in every task."""

    name: ClassVar[str] = "qa"
    task_fields: ClassVar[tuple[str, ...]] = ("question", "answer")
    checked: ClassVar[list[list[dict[str, Any]]]] = []

    @classmethod
    def tasks(cls, split: str = "train") -> list[dict[str, Any]]:
        return [{"id": f"{split}-0", "question": "1 + 2", "answer": "3"}]

    @classmethod
    def check_tasks(cls, tasks: Any) -> None:
        cls.checked.append(list(tasks))


class Free(Environment):
    """Needs nothing."""


def write_parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(dict.fromkeys(k for r in rows for k in r))  # from_pylist would take the first row's keys
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in names} for r in rows]), path)
    return path


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


QA_COLUMNS = {"question": "q", "answer": "a"}


# ----- the formats ---------------------------------------------------------------------------------------
def test_parquet(tmp_path: Path) -> None:
    tasks = load_tasks(QA, "train", write_parquet(tmp_path / "t.parquet", ROWS), columns=QA_COLUMNS)
    assert [t["id"] for t in tasks] == ["a", "b", "c"]  # no split named: every row
    assert tasks[0] == {"id": "a", "q": "1 + 1", "a": "2", "split": "train", "question": "1 + 1", "answer": "2"}


def test_csv_values_stay_strings(tmp_path: Path) -> None:
    rows = [{"question": "1 + 1", "answer": 2, "n": 7}]
    tasks = load_tasks(QA, "train", str(write_csv(tmp_path / "t.csv", rows)))
    assert tasks == [{"question": "1 + 1", "answer": "2", "n": "7", "id": "t-1"}]


def test_saved_dataset_dir(tmp_path: Path) -> None:
    from datasets import Dataset

    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    tasks = load_tasks(QA, "test", str(tmp_path / "ds"), columns=QA_COLUMNS)
    assert [t["id"] for t in tasks] == ["a", "b", "c"]  # a single Dataset: the default split is not applied
    assert [t["id"] for t in load_tasks(QA, "test", tmp_path / "ds", source_split="train", columns=QA_COLUMNS)] \
        == ["a", "c"]


def test_saved_dataset_dict_split_and_wrong_split(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS[:2]), "validation": Dataset.from_list(ROWS[2:])}).save_to_disk(
        str(tmp_path / "dd"))
    assert [t["id"] for t in load_tasks(QA, "train", str(tmp_path / "dd"), columns=QA_COLUMNS)] == ["a", "b"]
    picked = load_tasks(QA, "train", str(tmp_path / "dd"), source_split="validation", columns=QA_COLUMNS)
    assert [t["id"] for t in picked] == ["c"]
    with pytest.raises(TaskSourceError) as e:
        load_tasks(QA, "test", str(tmp_path / "dd"), columns=QA_COLUMNS)  # the held-out default: none here
    assert "no split 'test'" in str(e.value) and "train, validation" in str(e.value)
    assert "--tasks-split" in str(e.value)
    assert isinstance(e.value, ConfigError) and isinstance(e.value, ValueError)


def test_a_directory_that_is_no_saved_dataset(tmp_path: Path) -> None:
    with pytest.raises(TaskSourceError, match="not a dataset written by save_to_disk"):
        load_tasks(QA, "train", str(tmp_path))


def test_jsonl_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"question": "q", "answer": "1", "instance_id": "x-1"}\n\n{"question": "r", "answer": "2"}\n')
    assert read_tasks_jsonl(path) == [{"question": "q", "answer": "1", "instance_id": "x-1", "id": "x-1"},
                                      {"question": "r", "answer": "2", "id": "t-3"}]
    assert load_tasks(QA, "train", path) == read_tasks_jsonl(path)
    assert load_tasks(QA, "train", str(path)) == read_tasks_jsonl(path)  # a str, as the config holds it
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tasks(QA, "train", str(tmp_path / "missing.jsonl"))  # a file name is never taken for a hub name
    path.write_text("[1]\n")
    with pytest.raises(ValueError, match=r"t.jsonl:1: a task must be a JSON object, got list"):
        load_tasks(QA, "train", path)


def test_environment_tasks_without_a_source_are_checked_too() -> None:
    QA.checked.clear()
    assert load_tasks(QA, "test") == [{"id": "test-0", "question": "1 + 2", "answer": "3"}]
    assert QA.checked == [[{"id": "test-0", "question": "1 + 2", "answer": "3"}]]
    assert load_tasks(QA, "test", source_split="train")[0]["id"] == "train-0"


# ----- columns and required fields ----------------------------------------------------------------------
def test_column_mapping_keeps_other_columns(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "t.jsonl", [{"prompt": "2 + 2", "solution": "4", "extra": [1]}])
    tasks = load_tasks(QA, "train", src, columns={"question": "prompt", "answer": "solution"})
    assert tasks == [{"prompt": "2 + 2", "solution": "4", "extra": [1], "question": "2 + 2", "answer": "4",
                      "id": "t-1"}]


def test_missing_field_names_field_source_columns_and_the_fix(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "t.parquet", ROWS)
    with pytest.raises(TaskSourceError) as e:
        load_tasks(QA, "train", src, columns={"question": "q"})
    msg = str(e.value)
    assert "'answer'" in msg and str(src) in msg and "id, q, a, split" in msg
    assert 'task_columns = {answer = "<column>"}' in msg and "--task-column answer=<column>" in msg


def test_mapping_to_a_column_the_source_lacks(tmp_path: Path) -> None:
    with pytest.raises(TaskSourceError, match=r"column 'nope', which .* does not have"):
        load_tasks(QA, "train", write_parquet(tmp_path / "t.parquet", ROWS), columns={"question": "nope"})


def test_a_row_without_a_value(tmp_path: Path) -> None:
    rows = [{"question": "1", "answer": "1"}, {"question": "2", "answer": None}]  # a null cell: absent
    with pytest.raises(TaskSourceError, match=r"'t-2' \(row 2 of .*\) has no value for task field 'answer'"):
        load_tasks(QA, "train", write_parquet(tmp_path / "t.parquet", rows))


# ----- splits of single files ---------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "csv"])
def test_explicit_split_of_a_single_file(tmp_path: Path, fmt: str) -> None:
    write = {"jsonl": write_jsonl, "parquet": write_parquet, "csv": write_csv}[fmt]
    src = write(tmp_path / f"t.{fmt}", ROWS)
    assert [t["id"] for t in load_tasks(QA, "test", src, source_split="train", columns=QA_COLUMNS)] == ["a", "c"]
    with pytest.raises(TaskSourceError, match="no rows with split 'dev'; its splits: test, train"):
        load_tasks(QA, "test", src, source_split="dev", columns=QA_COLUMNS)
    bare = write(tmp_path / f"bare.{fmt}", [{k: v for k, v in r.items() if k != "split"} for r in ROWS])
    with pytest.raises(TaskSourceError, match=r"has no splits \(no 'split' column\)"):
        load_tasks(QA, "test", bare, source_split="train", columns=QA_COLUMNS)


# ----- hub names ----------------------------------------------------------------------------------------
@pytest.mark.timeout(120)
def test_hub_name_offline_fails_clearly_and_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    # Both libraries read these once, at import: set the values they already hold as well.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    t0 = time.monotonic()
    with pytest.raises(TaskSourceError) as e:
        load_tasks(SweEnv, "test", "agentrl-tests-nosuch/no-such-dataset")
    assert time.monotonic() - t0 < 60
    msg = str(e.value)
    assert "does not exist locally" in msg and "Hugging Face hub" in msg and "split 'test'" in msg
    assert "Nothing else was tried" in msg and "\n" not in msg


def test_missing_optional_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import fails as if not installed
    (tmp_path / "t.parquet").write_bytes(b"")
    with pytest.raises(MissingDataExtra) as e:
        load_tasks(QA, "train", tmp_path / "t.parquet")
    assert "pip install 'agentrl[data]'" in str(e.value) and "pyarrow" in str(e.value)
    assert isinstance(e.value, ImportError) and isinstance(e.value, ValueError)


# ----- the bundled environments ------------------------------------------------------------------------
def test_calc_tasks_from_parquet(tmp_path: Path) -> None:
    rows = [dict(t) for t in CalcEnv.tasks("test")[:5]]
    tasks = load_tasks(CalcEnv, "train", write_parquet(tmp_path / "calc.parquet", rows))
    assert [(t["question"], t["answer"]) for t in tasks] == [(r["question"], r["answer"]) for r in rows]
    with pytest.raises(TaskSourceError, match="'question'"):
        load_tasks(CalcEnv, "train", write_parquet(tmp_path / "bad.parquet", [{"prompt": "x", "answer": 1}]))


def test_swe_fields_come_from_the_task_model() -> None:
    assert SweEnv.task_fields == ("instance_id", "repo", "base_commit", "problem_statement", "patch", "test_patch",
                                  "FAIL_TO_PASS")


def test_bundled_swe_tasks_from_parquet_pass_the_checks(tmp_path: Path) -> None:
    rows = [json.loads(line) for line in BUNDLED_TASKS.read_text().splitlines() if line.strip()]
    tasks = load_tasks(SweEnv, "train", write_parquet(tmp_path / "swe.parquet", rows))
    assert [t["id"] for t in tasks] == [r["instance_id"] for r in rows]
    assert "image" not in tasks[0] and tasks[0]["FAIL_TO_PASS"] == rows[0]["FAIL_TO_PASS"]
    held_out = load_tasks(SweEnv, "train", tmp_path / "swe.parquet", source_split="test")
    assert {t["id"] for t in held_out} == {r["instance_id"] for r in rows if r["split"] == "test"}


PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"


def swe_bench_row(**kw: Any) -> dict[str, Any]:
    """A row shaped like SWE-bench's (test ids as JSON strings)."""
    row = {
        "instance_id": "django__django-11099", "repo": "django/django", "base_commit": "abc123",
        "problem_statement": "UsernameValidator allows a trailing newline.", "patch": PATCH,
        "test_patch": PATCH.replace("x.py", "tests/test_x.py"),
        "FAIL_TO_PASS": json.dumps(["test_x (tests.test_x.T)"]), "PASS_TO_PASS": json.dumps([]),
        "hints_text": "", "created_at": "2019-03-20T03:46:18Z", "version": "3.0",
        "environment_setup_commit": "419a78300f7cd27611196e1e464d50fd0385ff27",
    }
    return {**row, **kw}


def test_swe_bench_row_without_image_is_refused_clearly(tmp_path: Path) -> None:
    src = write_parquet(tmp_path / "lite.parquet", [swe_bench_row(), swe_bench_row(instance_id="django__django-2")])
    with pytest.raises(TaskSourceError) as e:
        load_tasks(SweEnv, "test", src)
    msg = str(e.value)
    assert "'django__django-11099' (and 1 more tasks like it)" in msg and "'django/django'" in msg
    assert "Nothing is fetched or pulled here" in msg and "`image`" in msg and "durations" in msg


def test_swe_row_that_is_not_a_task_names_it(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "t.jsonl", [swe_bench_row(FAIL_TO_PASS="[]")])
    with pytest.raises(TaskSourceError, match=r"task 'django__django-11099' is not a valid SWE task: FAIL_TO_PASS"):
        load_tasks(SweEnv, "test", src)


def test_swe_json_string_test_ids_accepted(tmp_path: Path) -> None:
    row = swe_bench_row(repo="agentrl/durations")  # a bundled repository: runnable without an image
    tasks = load_tasks(SweEnv, "test", write_parquet(tmp_path / "t.parquet", [row]))
    assert tasks[0]["FAIL_TO_PASS"] == row["FAIL_TO_PASS"] and tasks[0]["id"] == "django__django-11099"


class NoEngine(SweEnv):
    config = SweConfig(sandbox=SandboxConfig(docker_host="unix:///nonexistent/agentrl-test.sock"))


def test_swe_image_without_an_engine_says_so(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "t.jsonl", [swe_bench_row(image="sweb.eval.x86_64.django__django-11099")])
    with pytest.raises(TaskSourceError) as e:
        load_tasks(NoEngine, "test", src)
    assert "no Docker engine can be reached" in str(e.value) and "sweb.eval.x86_64.django__django-11099" in str(e.value)


def test_swe_images_are_looked_up_once_each(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import docker.errors

    from agentrl.sandbox import _engine

    asked: list[str] = []

    class Images:
        def get(self, name: str) -> object:
            asked.append(name)
            if name != "here:1":
                raise docker.errors.ImageNotFound(name)
            return object()

    class Client:
        images = Images()

        def close(self) -> None:
            pass

    monkeypatch.setattr(_engine, "make_client", lambda host=None, timeout=30.0: Client())
    rows = [swe_bench_row(instance_id=f"i-{n}", image="here:1" if n % 2 else "gone:1") for n in range(4)]
    with pytest.raises(TaskSourceError) as e:
        load_tasks(SweEnv, "test", write_jsonl(tmp_path / "t.jsonl", rows))
    assert sorted(asked) == ["gone:1", "here:1"]
    msg = str(e.value)
    assert "1 task image(s) are not in the Docker engine" in msg and "'gone:1' (task 'i-0' and 1 more)" in msg
    assert "Nothing is pulled here" in msg and "here:1" not in msg
    ok = [r for r in rows if r["image"] == "here:1"]
    assert [t["id"] for t in load_tasks(SweEnv, "test", write_jsonl(tmp_path / "ok.jsonl", ok))] == ["i-1", "i-3"]


def test_swe_image_missing_from_a_real_engine(tmp_path: Path) -> None:
    from agentrl.sandbox import engine_reachable

    ok, why = engine_reachable()
    require(ok, f"needs a Docker engine: {why}")
    src = write_jsonl(tmp_path / "t.jsonl", [swe_bench_row(image="agentrl-tests/no-such-image:never")])
    with pytest.raises(TaskSourceError, match=r"not in the Docker engine .*'agentrl-tests/no-such-image:never'"):
        load_tasks(SweEnv, "test", src)


# ----- the command line ---------------------------------------------------------------------------------
def test_train_task_column_without_equals_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from agentrl import cli

    monkeypatch.setattr(cli, "_setup", lambda verbose: None)
    r = CliRunner().invoke(cli.app, ["train", "--env", "calc", "--task-column", "bad"])
    assert r.exit_code == 2, r.output
    assert "--task-column 'bad': expected FIELD=COLUMN" in r.output


def test_train_task_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import tomllib
    from typer.testing import CliRunner

    from agentrl import cli

    monkeypatch.setattr(cli, "_setup", lambda verbose: None)
    r = CliRunner().invoke(cli.app, [
        "train", "--env", "calc", "--tasks", "org/data", "--tasks-split", "dev", "--eval-tasks", "e.parquet",
        "--eval-tasks-split", "held", "--task-column", "question=prompt", "--task-column", "answer=gold",
        "--print-config"])
    assert r.exit_code == 0, r.output
    cfg = tomllib.loads(r.stdout)
    assert (cfg["tasks"], cfg["tasks_split"], cfg["eval_tasks"], cfg["eval_tasks_split"]) == \
        ("org/data", "dev", "e.parquet", "held")
    assert cfg["task_columns"] == {"question": "prompt", "answer": "gold"}
