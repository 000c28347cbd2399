"""`GuessEnv`: find a hidden number with a ``guess`` tool that answers higher or lower.

An episode: the model learns the range (``low..high``, 100 to 250 numbers) and calls ``guess`` once a turn; each
wrong guess is answered "higher" or "lower" with the guesses left; a right guess ends the episode. Binary
search needs up to 7 or 8 guesses (the task's budget). The reward (`agentrl.envs.guess.tasks.score`) is 1.0
for finding the number within the budget, 0.1 less for each guess beyond it (at most 5 more, down to 0.5), and
0.0 when it is not found: when the guesses or the turns run out, or the model stops guessing.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, ClassVar

from agentrl.core.errors import EnvError
from agentrl.core.types import Message
from agentrl.environment.base import Environment, Task, ToolError, tool
from agentrl.environment.tasks import check_split
from agentrl.envs.guess.tasks import binary_search, budget, make_tasks, max_guesses, score

SPLIT_SIZES = {"train": 2000, "test": 200}


class GuessTaskError(EnvError, ValueError):
    """A guess task is malformed: ``low``, ``high`` and ``target`` must be integers with low <= target <= high."""

    code = "env.guess.task"


@functools.cache
def _cached_tasks(split: str) -> tuple[dict[str, Any], ...]:
    return tuple(make_tasks(split, SPLIT_SIZES[split]))


def feedback(task: Task, number: int, made: int) -> tuple[str, bool]:
    """What guess number ``made`` of ``number`` shows, and whether it ends the episode (right, or the last)."""
    low, high, target = task["low"], task["high"], task["target"]
    if not low <= number <= high:
        raise ToolError(f"{number} is outside the range; guess a whole number from {low} to {high}")
    if number == target:
        return f"Correct: the number is {number}, found in {made} guesses.", True
    hint = f"Too low: the number is higher than {number}." if number < target else (
        f"Too high: the number is lower than {number}.")
    left = max_guesses(low, high) - made
    if left <= 0:
        return f"{hint} No guesses left; the number was {target}.", True
    return f"{hint} {left} guess{'es' if left > 1 else ''} left.", False


def opening(task: Task) -> str:
    """The task as the model reads it."""
    low, high = task["low"], task["high"]
    return (f"I am thinking of a whole number from {low} to {high}. Find it with the guess tool: after each "
            f"wrong guess I say whether the number is higher or lower. You have {max_guesses(low, high)} "
            f"guesses; finding it within {budget(low, high)} earns the full reward.")


class GuessEnv(Environment):
    """Find a hidden number from higher/lower feedback (2000 train / 200 test tasks)."""

    name: ClassVar[str] = "guess"
    system_prompt: ClassVar[str | None] = (
        "You play a number-guessing game. Call guess with one number per turn and use the feedback: guess the "
        "middle of the numbers still possible, so that each answer halves them, until a guess is correct."
    )
    max_turns: ClassVar[int] = 16
    max_tokens_per_turn: ClassVar[int] = 128
    task_fields: ClassVar[tuple[str, ...]] = ("low", "high", "target")
    agent_time_limit_s: ClassVar[float] = 10.0
    tool_timeout_s: ClassVar[float] = 5.0

    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """The built-in tasks of ``split`` ("train": 2000, "test": 200), generated once and cached."""
        check_split(split, SPLIT_SIZES)
        return [dict(t) for t in _cached_tasks(split)]

    @classmethod
    def check_tasks(cls, tasks: Sequence[Task]) -> None:
        """Every task has integers ``low <= target <= high``."""
        for task in tasks:
            values = [task.get(k) for k in ("low", "high", "target")]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in values) or not (
                    values[0] <= values[2] <= values[1]):
                raise GuessTaskError(f"guess task {task.get('id')!r}: needs integers low <= target <= high; "
                                     f"got low={values[0]!r}, high={values[1]!r}, target={values[2]!r}")

    async def reset(self, task: Task) -> str:
        self.task = task
        self.made = 0
        self.found_at: int | None = None
        return opening(task)

    @tool
    async def guess(self, number: int) -> str:
        """Guess the hidden number: the answer says whether it is right, higher or lower.

        Args:
            number: a whole number in the task's range.
        """
        shown, over = feedback(self.task, number, self.made + 1)
        self.made += 1
        if number == self.task["target"]:
            self.found_at = self.made
        if over:
            self.finish()
        return shown

    @classmethod
    def reference_solution(cls, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """Binary search: the middle of the numbers still possible, until it is the target."""
        return [("guess", {"number": n}) for n in binary_search(task["low"], task["high"], task["target"])]

    @classmethod
    def demonstration(cls, task: Task) -> list[dict[str, Any]]:
        """Binary search as a conversation: each guess and its feedback, the last one correct."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": cls.system_prompt},
                                          {"role": "user", "content": opening(task)}]
        for made, (name, arguments) in enumerate(cls.reference_solution(task), start=1):
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "content": feedback(task, arguments["number"], made)[0]}]
        return messages

    async def reward(self, messages: list[Message]) -> dict[str, float]:
        """`score` of the guess that found the number (0.0 if none did), with whether and when it was found."""
        return {"reward": score(self.task["low"], self.task["high"], self.found_at),
                "found": 1.0 if self.found_at is not None else 0.0, "guesses": float(self.made)}
