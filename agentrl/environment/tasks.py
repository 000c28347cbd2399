"""Task sources: an environment's built-in splits, or a JSONL file of task objects."""

from __future__ import annotations

import json
from pathlib import Path

from agentrl.environment.base import Environment, Task


def read_tasks_jsonl(path: Path) -> list[Task]:
    """Tasks from a JSONL file: one JSON object per line, each with an ``id`` (added if missing)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file {path} does not exist")
    tasks: list[Task] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{lineno}: not valid JSON: {e.msg}") from e
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{lineno}: a task must be a JSON object, got {type(obj).__name__}")
        obj.setdefault("id", obj.get("instance_id", f"{path.stem}-{lineno}"))
        tasks.append(obj)
    if not tasks:
        raise ValueError(f"task file {path} holds no tasks")
    return tasks


def load_tasks(env_cls: type[Environment], split: str, path: Path | None = None) -> list[Task]:
    """Tasks from ``path`` if given, else the environment's own ``split``."""
    if path is not None:
        return read_tasks_jsonl(path)
    tasks = list(env_cls.tasks(split))
    if not tasks:
        raise ValueError(f"environment {env_cls.__name__} returned no tasks for split {split!r}")
    return tasks
