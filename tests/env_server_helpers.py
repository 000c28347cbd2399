"""Helpers for environment-server tests: a probe environment, and a real uvicorn server in a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any, ClassVar

import agentrl
from agentrl.config.server import ServerConfig

TOKEN = "test-token-0123456789abcdef"
BAD_REWARDS: dict[str, Any] = {
    "nan": float("nan"),
    "inf": float("-inf"),
    "no_key": {"score": 1.0},
    "text": "1.0",
    "nan_metric": {"reward": 1.0, "partial": float("nan")},
    "text_metric": {"reward": 1.0, "partial": "most"},
}
"""What ``Probe.reward`` returns for a task with ``bad_reward: <key>``: each breaks the reward rule."""
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Probe(agentrl.Environment):
    """A test environment that counts what happens to it (class-level, per task id)."""

    name: ClassVar[str] = "probe"
    system_prompt: ClassVar[str | None] = "Probe the tools."
    max_turns: ClassVar[int] = 3
    tool_timeout_s: ClassVar[float] = 1.0
    calls: ClassVar[Counter[str]] = Counter()
    closed: ClassVar[Counter[str]] = Counter()
    runs: ClassVar[list[str]] = []

    @classmethod
    async def setup_run(cls, run_id: str) -> None:
        cls.runs.append(f"setup:{run_id}")

    @classmethod
    async def teardown_run(cls) -> None:
        cls.runs.append("teardown")

    @classmethod
    def tasks(cls, split: str = "train") -> list[agentrl.Task]:
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}")
        return [{"id": f"{split}-{i}", "n": i} for i in range(250 if split == "train" else 5)]

    async def reset(self, task: agentrl.Task) -> str:
        if task.get("fail_reset"):
            raise RuntimeError("reset exploded")
        return f"task {task['id']}"

    @agentrl.tool
    def count(self, tag: str = "x") -> str:
        """Count a call and return the running total for this task.

        Args:
            tag: any label.
        """
        key = f"{self.task['id']}:{tag}"
        Probe.calls[key] += 1
        return str(Probe.calls[key])

    @agentrl.tool
    async def sleep(self, seconds: float) -> str:
        """Sleep, then answer.

        Args:
            seconds: how long.
        """
        await asyncio.sleep(seconds)
        return "slept"

    @agentrl.tool
    def fail(self, kind: str) -> str:
        """Fail in one of several ways.

        Args:
            kind: "tool" (a ToolError) or "crash" (an environment bug).
        """
        if kind == "tool":
            raise agentrl.ToolError("as requested")
        raise RuntimeError("environment bug")

    @agentrl.tool
    def submit(self, answer: str) -> str:
        """End the episode with an answer.

        Args:
            answer: the answer.
        """
        self.answer = answer
        self.finish()
        return "submitted"

    async def reward(self, messages: list[agentrl.Message]) -> dict[str, float]:
        if self.task.get("fail_reward"):
            raise ValueError("reward exploded")
        if self.task.get("bad_reward"):
            return BAD_REWARDS[self.task["bad_reward"]]
        last = messages[-1].content if messages else ""
        return {"reward": float(getattr(self, "answer", last) == "42"), "turns": float(len(messages))}

    async def close(self) -> None:
        Probe.closed[str(self.task.get("id"))] += 1


def config(**kw: Any) -> ServerConfig:
    """A test server config: probe + calc, no sandbox cleanup (no engine needed), the test token."""
    base: dict[str, Any] = {
        "envs": ["tests.env_server_helpers:Probe", "calc"],
        "sandbox_gc": False,
        "token": TOKEN,
    }
    return ServerConfig(**{**base, **kw})


class ThreadServer:
    """A real uvicorn server for an app, on a free loopback port, in a daemon thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ThreadServer:
        import uvicorn

        from agentrl.http.serve import bind_socket, url_of

        sock = bind_socket("127.0.0.1", 0)
        self.url = url_of(sock)
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        assert self._thread is not None
        self._thread.join(20)
