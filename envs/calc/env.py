"""`CalcEnv`: arithmetic word problems solved with a ``calculate`` tool.

An episode: the model reads a word problem, calls ``calculate`` with an expression, reads the result and
answers with the number. The reward is 1.0 when the last number of the final answer is correct.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.core.types import Message, message_field, tool_call_names
from agentrl.environment.base import Environment, Task, ToolError, tool
from agentrl.environment.tasks import check_split
from agentrl.envs.calc.evaluator import CalcError, format_number, safe_eval
from agentrl.envs.calc.tasks import make_tasks

SPLIT_SIZES = {"train": 2000, "test": 200}
SPLIT_SEEDS = {"train": 0, "test": 1}

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@functools.cache
def _cached_tasks(split: str) -> tuple[dict[str, Any], ...]:
    return tuple(make_tasks(split, SPLIT_SIZES[split], seed=SPLIT_SEEDS[split]))


def last_number(text: str) -> float | None:
    """The last number written in ``text`` (commas as thousands separators allowed), or None."""
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def ideal_messages(task: Task, system_prompt: str | None) -> list[dict[str, Any]]:
    """The ideal episode for ``task``: one ``calculate`` call, its result, and the final answer."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    call = {"type": "function", "function": {"name": "calculate", "arguments": {"expression": task["expression"]}}}
    messages += [
        {"role": "user", "content": task["question"]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": str(task["answer"])},
        {"role": "assistant", "content": f"The answer is {task['answer']}."},
    ]
    return messages


class CalcEnv(Environment):
    """Arithmetic word problems with a safe calculator tool (2000 train / 200 test tasks)."""

    name: ClassVar[str] = "calc"
    system_prompt: ClassVar[str | None] = (
        "You are a careful assistant. Use the calculate tool, then answer with the number."
    )
    max_turns: ClassVar[int] = 4
    max_tokens_per_turn: ClassVar[int] = 64
    task_fields: ClassVar[tuple[str, ...]] = ("question", "answer")
    # Only the agent's tool time counts (the calculator answers in microseconds); time waiting for a busy
    # engine does not, so the limit stays tight however many episodes share one engine.
    agent_time_limit_s: ClassVar[float] = 10.0
    tool_timeout_s: ClassVar[float] = 5.0

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """The built-in problems of ``split`` ("train": 2000, "test": 200), generated once and cached."""
        check_split(split, SPLIT_SIZES)
        return [dict(t) for t in _cached_tasks(split)]

    async def reset(self, task: Task) -> str:
        self.task = task
        return str(task["question"])

    # An async tool runs on the event loop, in the episode's own task: the evaluator's limits keep every
    # call to microseconds, so a worker thread (for tools that may block) would only add a round trip
    # through the thread pool and the event loop to every turn.
    @tool
    async def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression and return the result.

        Args:
            expression: numbers with + - * / and parentheses, e.g. "23 + 3 * 12".
        """
        try:
            return format_number(safe_eval(expression))
        except CalcError as e:
            raise ToolError(str(e)) from None

    @classmethod
    def demonstration(cls, task: Task) -> list[dict[str, Any]]:
        """One ``calculate`` call with the task's expression, its result, and the answer."""
        return ideal_messages(task, cls.system_prompt)

    async def reward(self, messages: list[Message]) -> dict[str, float]:
        """1.0 if the last assistant message has no tool call and ends with the right number; else 0.0."""
        used_tool = any("calculate" in tool_call_names(m) for m in messages if message_field(m, "role") == "assistant")
        assistant = [m for m in messages if message_field(m, "role") == "assistant"]
        correct = False
        if assistant and not message_field(assistant[-1], "tool_calls"):
            value = last_number(message_field(assistant[-1], "content") or "")
            correct = value is not None and value == float(self.task["answer"])
        return {"reward": 1.0 if correct else 0.0, "used_tool": 1.0 if used_tool else 0.0}
