"""`ShellEnv`: a small sandbox-backed environment, one Docker sandbox per episode.

Used to measure and test the environment server with real sandboxes (``agentrl bench env-server --env
agentrl.tools.bench.shell_env:ShellEnv``): each session starts its own container in ``reset`` and removes it in
``close``; the ``run`` tool executes a shell command in it. A task asks for a file with given content;
the reward checks the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.core.types import Message
from agentrl.environment.base import Environment, Task, ToolError, tool
from agentrl.tools.bench.errors import BenchArgumentError

WORDS = ("apple", "birch", "cedar", "delta", "ember", "fjord", "gamma", "heron")


class ShellEnv(Environment):
    """Write a file with given content using shell commands in a Docker sandbox (one per episode)."""

    name: ClassVar[str] = "shell"
    system_prompt: ClassVar[str | None] = "Use the run tool to execute shell commands, then say done."
    max_turns: ClassVar[int] = 8
    tool_timeout_s: ClassVar[float] = 30.0
    agent_time_limit_s: ClassVar[float] = 300.0
    command_timeout_s: ClassVar[float] = 10.0
    """Limit of one command inside the sandbox."""

    def __init__(self) -> None:
        super().__init__()
        self.sandbox: Any = None

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """Write ``<word>.txt`` holding ``<word>`` repeated (8 tasks per split)."""
        if split not in ("train", "test"):
            raise BenchArgumentError(f"unknown split {split!r}; expected train or test")
        k = 2 if split == "train" else 3
        return [
            {"id": f"shell-{split}-{i}", "file": f"{w}.txt", "content": w * k} for i, w in enumerate(WORDS)
        ]

    async def reset(self, task: Task) -> str:
        from agentrl.sandbox import DockerSandbox, SandboxConfig

        self.task = task
        self.sandbox = await DockerSandbox(SandboxConfig(lifetime_s=3600)).start()
        return (
            f"Create the file {task['file']} in the current directory containing exactly {task['content']!r}."
        )

    @tool
    async def run(self, command: str) -> str:
        """Run a shell command in the sandbox and return its exit code and output.

        Args:
            command: the command line, run with sh -c in the workspace.
        """
        if self.sandbox is None:
            raise ToolError("the sandbox is not running")
        r = await self.sandbox.exec(command, timeout=self.command_timeout_s)
        status = "timed out" if r.timed_out else f"exit {r.exit_code}"
        return f"[{status}]\n{r.output}"

    async def reward(self, messages: list[Message]) -> float:
        """1.0 if the file holds exactly the requested content."""
        if self.sandbox is None:
            return 0.0
        try:
            data = await self.sandbox.read_file(str(self.task["file"]))
        except Exception:
            return 0.0
        return float(data.decode("utf-8", "replace").strip() == str(self.task["content"]))

    async def close(self) -> None:
        if self.sandbox is not None:
            sandbox, self.sandbox = self.sandbox, None
            await sandbox.close()
