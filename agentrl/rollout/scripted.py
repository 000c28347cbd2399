"""Scripted policies (``agentrl eval --policy oracle|null``): tool calls without a model, through the real loop.

A scripted policy writes each assistant turn as text with Hermes-style ``<tool_call>`` blocks, exactly what
a model emits. The text goes through `run_episode` unchanged (tool-call parsing, `Environment.call_tool`
with schema validation, observations, ``reward``, ``close``), so an oracle that scores 100% shows that the
tools and the reward work, and a null policy that scores 0% shows that doing nothing is not rewarded.
No inference server is needed: `ScriptChat` stands in for the tokenizer (one token per text).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

from agentrl.config.run import SamplingConfig
from agentrl.core.errors import ConfigError
from agentrl.core.types import Trajectory
from agentrl.environment.base import Environment, Task, run_scope
from agentrl.inference.wire import Generation
from agentrl.rollout.loop import run_episode


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """One tool call as the model writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptChat:
    """Chat-format stand-in for scripted policies: every distinct text is one token id (a lookup table)."""

    eos_token_id = 0
    stop_token_ids: ClassVar[list[int]] = [0]

    def __init__(self) -> None:
        self._texts: list[str] = [""]
        self._ids: dict[str, int] = {}

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> Any:
        """Hermes-style calls, read as vLLM's ``hermes`` parser reads the text a scripted policy writes
        (checked against it in the tests), without importing vLLM: an oracle evaluation needs no engine."""
        from agentrl.rollout.toolcalls import parse_hermes

        return parse_hermes(text)

    def ends_turn(self, ids: list[int]) -> bool:
        return bool(ids) and ids[-1] == self.eos_token_id

    def encode(self, text: str) -> list[int]:
        if text not in self._ids:
            self._ids[text] = len(self._texts)
            self._texts.append(text)
        return [self._ids[text]]

    def decode(self, ids: list[int]) -> str:
        return "".join(self._texts[i] for i in ids if i != self.eos_token_id)

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        return self.encode(json.dumps(messages))

    def observation_ids(self, new_messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        ended_with: int | None = None) -> list[int]:
        return self.encode(json.dumps(new_messages))


class ScriptedGenerator:
    """A `Generator` that answers with prepared assistant turns (an empty answer once they run out)."""

    def __init__(self, turns: Sequence[str], chat: ScriptChat) -> None:
        self.turns = list(turns)
        self.chat = chat

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, **_: Any) -> Generation:
        text = self.turns.pop(0) if self.turns else ""
        ids = [*self.chat.encode(text), self.chat.eos_token_id]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop", weight_versions=None,
                          endpoint="scripted")


class ScriptedPolicy(Protocol):
    """Writes the assistant turns of one episode."""

    name: ClassVar[str]

    def turns(self, env_cls: type[Environment], task: Task) -> list[str]: ...


class OraclePolicy:
    """Replays the environment's `reference_solution`: one tool call per turn (the rest in the last turn
    when there are more calls than ``max_turns``)."""

    name: ClassVar[str] = "oracle"

    def turns(self, env_cls: type[Environment], task: Task) -> list[str]:
        calls = [tool_call_text(n, a) for n, a in env_cls.reference_solution(task)]
        keep = max(env_cls.max_turns - 1, 0)
        if len(calls) > env_cls.max_turns:
            calls = [*calls[:keep], "\n".join(calls[keep:])]
        return calls


class NullPolicy:
    """Gives up at once: calls ``submit`` (with no arguments) when the environment has it, else answers
    with an empty message."""

    name: ClassVar[str] = "null"

    def turns(self, env_cls: type[Environment], task: Task) -> list[str]:
        return [tool_call_text("submit", {})] if "submit" in env_cls.tool_specs() else [""]


POLICIES: dict[str, type[ScriptedPolicy]] = {"oracle": OraclePolicy, "null": NullPolicy}
"""Scripted policies by name."""


class UnknownScriptedPolicy(ConfigError, ValueError):
    """The evaluation policy named (``--policy``) is neither ``model`` nor a scripted policy."""

    code = "config.scripted_policy"


async def run_scripted(env_cls: type[Environment], tasks: Sequence[Task], policy: ScriptedPolicy,
                       *, max_concurrency: int = 4) -> list[Trajectory]:
    """One episode per task under ``policy``, at most ``max_concurrency`` at once (trajectories in task order)."""
    chat = ScriptChat()
    slots = asyncio.Semaphore(max_concurrency)
    sampling = SamplingConfig(temperature=0.0)

    async def one(task: Task) -> Trajectory:
        async with slots:
            gen = ScriptedGenerator(policy.turns(env_cls, task), chat)
            return await run_episode(env_cls, task, gen, chat, sampling)  # type: ignore[arg-type]

    env_cls.upcoming(tasks)
    return list(await asyncio.gather(*(one(t) for t in tasks)))


def summarize(trajs: list[Trajectory]) -> dict[str, Any]:
    """An evaluation's summary (:func:`agentrl.rollout.stats.summarize`) and the tasks left unsolved."""
    from agentrl.rollout.stats import summarize as summary

    return {**summary(trajs), "unsolved": sorted(t.task_id for t in trajs if t.reward < 1.0)}


async def run_scripted_eval(cfg: Any, policy: str, *, n: int = 200, split: str = "test") -> dict[str, Any]:
    """Evaluate scripted ``policy`` on the first ``n`` tasks of ``split`` (or ``cfg.eval_tasks``) for the
    environment of ``cfg`` (a RunConfig), inside the environment's run scope."""
    import time

    from agentrl.environment.registry import load_env
    from agentrl.environment.tasks import load_tasks

    if policy not in POLICIES:
        raise UnknownScriptedPolicy(f"unknown policy {policy!r}; expected model or one of {sorted(POLICIES)}")
    env_cls = load_env(cfg.env)
    tasks = load_tasks(env_cls, split, cfg.eval_tasks, source_split=cfg.eval_tasks_split,
                       columns=cfg.task_columns)[:n]
    t0 = time.perf_counter()
    async with run_scope(env_cls, f"eval-{env_cls.name or env_cls.__name__}"):
        trajs = await run_scripted(env_cls, tasks, POLICIES[policy](), max_concurrency=cfg.max_concurrency)
    out = summarize(trajs)
    out.update({"env": cfg.env, "policy": policy, "num_tasks": len(tasks), "wall_s": time.perf_counter() - t0})
    return out
