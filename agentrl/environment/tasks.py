"""Task sources: an environment's built-in splits, or a file, a saved dataset or a hub dataset of task rows.

``load_tasks`` reads a source (``--tasks``) as:

* a JSONL file: one JSON object per line (any existing file that is not ``.parquet`` or ``.csv``);
* a parquet file (``.parquet``), read with ``pyarrow``;
* a CSV file (``.csv``): a header line, then one task per line (every value stays a string);
* a directory written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk`` (``datasets``);
* anything else (no such file or directory): a Hugging Face hub dataset name, e.g.
  ``princeton-nlp/SWE-bench_Lite``, loaded with ``datasets.load_dataset``. When that fails (no network, no
  such dataset), nothing else is tried.

``pyarrow`` and ``datasets`` are optional (``pip install 'agentrl[data]'``); JSONL and CSV need neither.

Splits: a ``DatasetDict`` or a hub dataset holds several; the caller's default (``train`` for training tasks,
``test`` for held-out ones) is used unless the user names one (``--tasks-split``). A single table (a file, a
saved ``Dataset``) is used whole unless the user names a split: then its rows whose ``split`` column equals it.

Each row then gets the column mapping (``task_columns``: task field -> the source's column), must hold every
field of the environment's ``task_fields``, and gets an ``id`` (its own, else its ``instance_id``, else
``<name>-<n>``). A null cell of a table counts as an absent field. Finally the environment's ``check_tasks``
may refuse tasks it cannot run, before anything starts.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError, first_line
from agentrl.environment.base import Environment, Task

DATA_EXTRA = "pip install 'agentrl[data]'"
"""How to install the optional packages that parquet files and datasets need."""
_FILE_SUFFIXES = (".jsonl", ".json", ".ndjson", ".parquet", ".csv")
"""A source with one of these suffixes is a file; when it does not exist it is not taken for a hub name."""
_SPLIT_SETTING = ("the split setting (--tasks-split; --eval-tasks-split for a training run's held-out tasks; run "
                  "config: tasks_split, eval_tasks_split)")


class TaskSourceError(ConfigError, ValueError):
    """A task source cannot be used: it cannot be read, lacks a split or a field the environment needs, or
    holds tasks the environment cannot run. The message names the source and what to change."""

    code = "config.task_source"


def check_split(split: str, splits: Any) -> None:
    """Raise :class:`TaskSourceError` when ``split`` is not one of an environment's built-in ``splits``."""
    if split not in splits:
        raise TaskSourceError(f"unknown split {split!r}; expected one of {sorted(splits)}")


class MissingDataExtra(TaskSourceError, ImportError):
    """Reading the task source needs an optional package that is not installed (``agentrl[data]``)."""

    code = "config.task_source.missing_extra"


class TaskFileNotFound(ConfigError, FileNotFoundError):
    """The task file named as the task source does not exist."""

    code = "config.task_source.not_found"


def task_rng(seed: int, step: int) -> random.Random:
    """The generator a run draws its training tasks from (one ``choice`` over the train split per group), when
    it starts or resumes at ``step``: the one place this rule lives, so that a benchmark can replay a run's
    sequence of tasks."""
    return random.Random(seed * 100_003 + step)


def read_tasks_jsonl(path: Path) -> list[Task]:
    """Tasks from a JSONL file: one JSON object per line, each with an ``id`` (added if missing)."""
    path = Path(path)
    tasks: list[Task] = []
    for lineno, obj in _jsonl_rows(path):
        obj.setdefault("id", obj.get("instance_id", f"{path.stem}-{lineno}"))
        tasks.append(obj)
    return tasks


def _jsonl_rows(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, object)`` of each non-blank line of a JSONL file."""
    if not path.is_file():
        raise TaskFileNotFound(f"task file {path} does not exist")
    rows: list[tuple[int, dict[str, Any]]] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskSourceError(f"{path}:{lineno}: not valid JSON: {e.msg}") from e
        if not isinstance(obj, dict):
            raise TaskSourceError(f"{path}:{lineno}: a task must be a JSON object, got {type(obj).__name__}")
        rows.append((lineno, obj))
    if not rows:
        raise TaskSourceError(f"task file {path} holds no tasks")
    return rows


def load_tasks(
    env_cls: type[Environment],
    split: str,
    source: str | Path | None = None,
    *,
    source_split: str | None = None,
    columns: Mapping[str, str] | None = None,
) -> list[Task]:
    """The tasks of a run: read from ``source`` (see the module docstring), else the environment's own.

    ``split``: the environment's split, and the split of a ``DatasetDict`` or hub dataset unless
    ``source_split`` (the user's explicit choice; None: not given) names another; a single table is filtered
    by its ``split`` column only when ``source_split`` is given. Without a ``source`` the environment's
    ``tasks(source_split or split)`` are used as they are. ``columns`` maps task fields to the source's
    columns. The environment's ``check_tasks`` sees the result in every case.

    Raises :class:`TaskFileNotFound` (a ``FileNotFoundError``) for a missing file, :class:`TaskSourceError`
    (a ``ValueError``) for a source that cannot be used, :class:`MissingDataExtra` when ``pyarrow``/``datasets``
    is needed and missing.
    """
    if source is None:
        tasks = list(env_cls.tasks(source_split or split))
        if not tasks:
            raise TaskSourceError(f"environment {env_cls.__name__} returned no tasks for split {source_split or split!r}")
    else:
        table = _read_source(source, split, source_split)
        tasks = _as_tasks(env_cls, table, dict(columns or {}))
    env_cls.check_tasks(tasks)
    return tasks


# ----- reading -------------------------------------------------------------------------------------------


@dataclass
class _Table:
    """Rows read from a source, before mapping."""

    name: str
    """The source as the user gave it (for messages)."""
    stem: str
    """Prefix of the ids of rows that have none."""
    columns: list[str]
    rows: list[dict[str, Any]]
    numbers: list[int]
    """Each row's number in its source (a JSONL line number, else 1-based), for ids and messages."""
    single: bool
    """One table (a file, a saved ``Dataset``): filtered by its ``split`` column when a split is named."""


def _read_source(source: str | Path, split: str, source_split: str | None) -> _Table:
    name = str(source)
    path = Path(source).expanduser()
    if path.is_dir():
        table = _read_saved_dataset(path, name, split, source_split)
    elif path.is_file():
        suffix = path.suffix.lower()
        table = (_read_parquet(path, name) if suffix == ".parquet" else _read_csv(path, name) if suffix == ".csv"
                 else _read_jsonl(path, name))
    elif _looks_like_path(name):
        raise TaskFileNotFound(f"task file {path} does not exist")
    else:
        table = _read_hub(name, source_split or split)
    if table.single and source_split is not None:
        table = _only_split(table, source_split)
    if not table.rows:
        raise TaskSourceError(f"task source {name} holds no tasks")
    return table


def _looks_like_path(source: str) -> bool:
    """Whether a source that does not exist was meant as a local path rather than a hub dataset name."""
    return source.lower().endswith(_FILE_SUFFIXES) or source.startswith(("/", "./", "../", "~", "\\"))


def _read_jsonl(path: Path, name: str) -> _Table:
    pairs = _jsonl_rows(path)
    rows = [row for _, row in pairs]
    return _Table(name, path.stem, _union_keys(rows), rows, [n for n, _ in pairs], single=True)


def _read_parquet(path: Path, name: str) -> _Table:
    pq = _require("pyarrow.parquet", "pyarrow", f"reading the parquet file {name}")
    try:
        table = pq.read_table(path)
    except Exception as e:
        raise TaskSourceError(f"{name}: not a readable parquet file: {first_line(e)}") from e
    return _table(name, path.stem, list(table.column_names), table.to_pylist())


def _read_csv(path: Path, name: str) -> _Table:
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header = list(reader.fieldnames or [])
        rows: list[dict[str, Any]] = []
        for row in reader:
            if None in row:  # DictReader's key for the cells past the header
                raise TaskSourceError(f"{name}:{reader.line_num}: more cells than the header has columns")
            rows.append(row)
    return _table(name, path.stem, header, rows)


def _read_saved_dataset(path: Path, name: str, split: str, source_split: str | None) -> _Table:
    if not ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file()):
        raise TaskSourceError(
            f"task source {name} is a directory but not a dataset written by save_to_disk (no dataset_dict.json "
            "or state.json in it); give a JSONL, parquet or CSV file, a saved dataset directory or a hub dataset name")
    datasets = _require("datasets", "datasets", f"reading the saved dataset {name}")
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as e:
        raise TaskSourceError(f"{name}: the saved dataset cannot be read: {first_line(e)}") from e
    stem = path.resolve().name
    if isinstance(loaded, datasets.DatasetDict):
        wanted = source_split or split
        if wanted not in loaded:
            how = "named" if source_split is not None else "the default for these tasks"
            raise TaskSourceError(
                f"{name} is a dataset with splits {', '.join(sorted(loaded))}; it has no split {wanted!r} ({how}): "
                f"choose one with {_SPLIT_SETTING}")
        ds = loaded[wanted]
        return _table(name, stem, list(ds.column_names), ds.to_list(), single=False)
    return _table(name, stem, list(loaded.column_names), loaded.to_list())


def _read_hub(name: str, split: str) -> _Table:
    datasets = _require("datasets", "datasets",
                        f"{name!r} is not a local file or directory; loading it from the Hugging Face hub")
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as e:
        raise TaskSourceError(
            f"task source {name!r} does not exist locally (no such file or directory), and loading it as a "
            f"Hugging Face hub dataset (split {split!r}) failed: {type(e).__name__}: {first_line(e)}. Nothing "
            "else was tried: give a JSONL, parquet or CSV file, a directory written by save_to_disk, or a hub "
            "dataset name that loads here (network access, or the datasets cache)") from e
    return _table(name, name.rstrip("/").rsplit("/", 1)[-1], list(ds.column_names), ds.to_list(), single=False)


def _table(name: str, stem: str, columns: list[str], rows: list[dict[str, Any]], single: bool = True) -> _Table:
    """A table's rows without their null cells (a null is an absent field, as in a JSONL object), in JSON
    types (dates and times as ISO strings, decimals as floats)."""
    clean = [{k: _plain(v) for k, v in row.items() if v is not None} for row in rows]
    return _Table(name, stem, columns, clean, list(range(1, len(clean) + 1)), single)


def _plain(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time)):  # datetime.datetime is a date
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _only_split(table: _Table, wanted: str) -> _Table:
    """The rows of a single table whose ``split`` column is ``wanted``."""
    if "split" not in table.columns:
        raise TaskSourceError(
            f"{table.name} has no splits (no 'split' column), so split {wanted!r} cannot be taken from it: leave "
            f"{_SPLIT_SETTING} unset to use every row, or add a 'split' column")
    keep = [i for i, row in enumerate(table.rows) if row.get("split") == wanted]
    if not keep:
        have = sorted({str(row["split"]) for row in table.rows if row.get("split") is not None})
        raise TaskSourceError(f"{table.name} has no rows with split {wanted!r}; its splits: {', '.join(have) or 'none'}")
    return _Table(table.name, table.stem, table.columns, [table.rows[i] for i in keep],
                  [table.numbers[i] for i in keep], table.single)


# ----- mapping and checks --------------------------------------------------------------------------------


def _as_tasks(env_cls: type[Environment], table: _Table, columns: dict[str, str]) -> list[Task]:
    """Map columns to task fields, give every row an ``id`` and check the environment's ``task_fields``."""
    for field, column in columns.items():
        if column not in table.columns:
            raise TaskSourceError(
                f"task_columns maps task field {field!r} to column {column!r}, which {table.name} does not have; "
                f"its columns: {', '.join(table.columns)}")
    have = set(table.columns) | set(columns)
    env = env_cls.name or env_cls.__name__
    for field in env_cls.task_fields:
        if field not in have:
            raise TaskSourceError(
                f"task field {field!r} is missing: {table.name} has no column {field!r} (its columns: "
                f"{', '.join(table.columns)}), and environment {env} needs {', '.join(env_cls.task_fields)} in "
                f"every task. Map a column to it: task_columns = {{{field} = \"<column>\"}} at the top level of "
                f"the run config, or --task-column {field}=<column>")
    tasks: list[Task] = []
    for row, n in zip(table.rows, table.numbers, strict=True):
        for field, column in columns.items():
            if column in row:
                row[field] = row[column]
            else:
                row.pop(field, None)
        if row.get("id") is None:
            row["id"] = row["instance_id"] if row.get("instance_id") is not None else f"{table.stem}-{n}"
        for field in env_cls.task_fields:
            if row.get(field) is None:
                raise TaskSourceError(f"task {row['id']!r} (row {n} of {table.name}) has no value for task field "
                                      f"{field!r}, which environment {env} needs")
        tasks.append(row)
    return tasks


# ----- helpers -------------------------------------------------------------------------------------------


def _require(module: str, package: str, what: str) -> Any:
    """``import module``, or :class:`MissingDataExtra` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDataExtra(f"{what} needs the optional package {package!r}, which is not installed "
                               f"({first_line(e)}): {DATA_EXTRA}") from e


def _union_keys(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """Every key of ``rows``, in order of first appearance."""
    return list(dict.fromkeys(k for row in rows for k in row))

