"""The environments a server serves: their classes, descriptions, datasets and task lookup by id."""

from __future__ import annotations

import copy
import inspect
import logging
import uuid
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.environment.base import Environment, NoTasksError, Task
from agentrl.environment.registry import load_env
from agentrl.http.errors import ApiError
from agentrl.http.server.protocol import EnvInfo

log = logging.getLogger("agentrl.http.server")

SPLITS = ("train", "test")
"""Splits searched for a ``task_id`` when the request names none."""


class EnvCatalog:
    """Name -> environment class for the served environments, plus cached datasets."""

    def __init__(self, specs: list[str], *, allow_task_payload: bool = True) -> None:
        self.classes: dict[str, type[Environment]] = {}
        for spec in specs:
            cls = load_env(spec)
            self.classes[cls.name or spec] = cls
        self.allow_task_payload = allow_task_payload
        self._datasets: dict[tuple[str, str], list[Task]] = {}
        self._index: dict[tuple[str, str], dict[str, Task]] = {}

    @property
    def names(self) -> list[str]:
        """Served environment names."""
        return list(self.classes)

    def resolve(self, name: str | None) -> tuple[str, type[Environment]]:
        """(name, class) of a served environment; ``None`` picks the only one. Raises ``ApiError``."""
        if name is None:
            if len(self.classes) == 1:
                return next(iter(self.classes.items()))
            raise ApiError(422, f"this server serves several environments; name one of {self.names} in 'env'")
        cls = self.classes.get(name)
        if cls is None:
            raise ApiError(404, f"unknown environment {name[:100]!r}; this server serves {self.names}")
        return name, cls

    def info(self, name: str) -> EnvInfo:
        """The public description of environment ``name``."""
        cls = self.classes[name]
        doc = inspect.getdoc(cls) or ""
        return EnvInfo(
            name=name,
            description=doc.split("\n\n")[0].strip(),
            tools=cls.tool_schemas(),
            system_prompt=cls.system_prompt,
            max_turns=cls.max_turns,
            max_tokens_per_turn=cls.max_tokens_per_turn,
            tool_timeout_s=cls.tool_timeout_s,
            agent_time_limit_s=cls.agent_time_limit_s,
            wall_time_limit_s=cls.wall_time_limit_s,
            accepts_task_payload=self.allow_task_payload,
        )

    def dataset(self, name: str, split: str) -> list[Task]:
        """The tasks of ``split`` (cached). Raises ``ApiError(404)`` when the environment has none."""
        key = (name, split)
        if key not in self._datasets:
            cls = self.classes[name]
            try:
                tasks = [dict(t) for t in cls.tasks(split)]
            except NoTasksError:
                raise ApiError(
                    404,
                    f"environment {name!r} has no built-in dataset; create sessions on a task "
                    "object ('task') instead",
                ) from None
            except (ConfigError, ValueError, KeyError) as e:  # agentrl's unknown split; a user env's own
                raise ApiError(404, f"environment {name!r} has no split {split[:64]!r}: {e}") from None
            for i, t in enumerate(tasks):
                t.setdefault("id", f"{split}-{i}")
            self._datasets[key] = tasks
            self._index[key] = {str(t["id"]): t for t in tasks}
        return self._datasets[key]

    def find(self, name: str, task_id: str, split: str | None = None) -> Task:
        """A copy of the task with id ``task_id``. Raises ``ApiError(404)``."""
        splits = (split,) if split else SPLITS
        searched = []
        for s in splits:
            try:
                self.dataset(name, s)
            except ApiError:
                if split:
                    raise
                continue
            searched.append(s)
            task = self._index[(name, s)].get(task_id)
            if task is not None:
                return copy.deepcopy(task)
        raise ApiError(
            404, f"environment {name!r} has no task {task_id[:100]!r} (searched splits {searched})"
        )

    def task_for(
        self, name: str, task_id: str | None, split: str | None, task: dict[str, Any] | None
    ) -> Task:
        """The task a request names: by id, or its payload (when allowed)."""
        if task_id is not None:
            return self.find(name, task_id, split)
        if not self.allow_task_payload:
            raise ApiError(403, "this server only accepts tasks of its dataset: send 'task_id', not 'task'")
        out = copy.deepcopy(task or {})
        out.setdefault("id", f"task-{uuid.uuid4().hex[:12]}")
        out["id"] = str(out["id"])[:256]
        return out
