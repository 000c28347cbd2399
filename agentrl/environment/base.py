"""The `Environment` base class and the `@tool` decorator: the API users subclass.

Example: a complete tool environment::

    import agentrl

    class Echo(agentrl.Environment):
        name = "echo"
        max_turns = 4
        system_prompt = "Use the tools, then give your final answer."

        @classmethod
        def tasks(cls, split="train"):
            return [{"id": f"{split}-{i}", "word": w} for i, w in enumerate(["apple", "pear"])]

        async def reset(self, task):
            return f"Shout the word {task['word']!r} using the shout tool, then repeat its output."

        @agentrl.tool
        def shout(self, text: str) -> str:
            '''Return the text in capital letters.

            Args:
                text: what to shout.
            '''
            return text.upper()

        async def reward(self, messages):
            return float(self.task["word"].upper() in messages[-1].content)

An instance lives for exactly one episode: the agent loop creates it, calls ``reset(task)``, routes the
model's tool calls to the decorated methods, calls ``reward(messages)`` and finally ``close()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import json
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from agentrl.core.errors import EnvError
from agentrl.core.types import Message
from agentrl.environment.schema import ArgumentSchemaError, function_schema, validate_arguments

Task = dict[str, Any]
"""A task is a JSON object with at least an ``id``; everything else is the environment's business."""

F = TypeVar("F", bound=Callable[..., Any])

_TOOL_ATTR = "__agentrl_tool__"
_T = TypeVar("_T")


async def within(aw: Awaitable[_T], timeout_s: float | None) -> _T:
    """``await aw``, bounded by ``timeout_s`` (``TimeoutError`` past it; None: unbounded), in the calling task.

    ``asyncio.wait_for`` before Python 3.12 wraps a coroutine in a new task, which puts the caller at the back
    of the event loop's ready queue once more: with a hundred episodes answering at once, that round trip
    cost each agent turn more than the turn's own work. ``asyncio.timeout`` (3.11+) runs it in place.
    """
    if timeout_s is None:
        return await aw
    if sys.version_info >= (3, 11):
        async with asyncio.timeout(timeout_s):
            return await aw
    return await asyncio.wait_for(aw, timeout=timeout_s)  # pragma: no cover (Python 3.10)


class ToolError(EnvError):
    """Raise inside a tool to send an error observation to the model (the episode goes on)."""

    code = "env.tool_error"


class ToolArgumentError(ToolError):
    """The model called a tool with arguments that do not fit its schema (counted as malformed)."""

    code = "env.tool_arguments"


class ToolTimeoutError(EnvError, asyncio.TimeoutError):
    """A remote environment reports that a tool call ran past its time limit (an observation; the episode goes
    on, as for a local tool that times out)."""

    code = "env.tool_timeout"


class EnvDefinitionError(EnvError, TypeError):
    """An ``Environment`` subclass sets a class attribute agentrl no longer reads (raised as the class is
    defined; the message names what replaced it)."""

    code = "env.definition"


class ToolShadowedError(EnvError, AttributeError):
    """An environment assigned to an attribute that names one of its tools, which would hide the tool."""

    code = "env.tool_shadowed"


class TaskPromptError(EnvError, KeyError):
    """The default ``reset`` found neither ``prompt`` nor ``messages`` in the task."""

    code = "env.task_prompt"


class NoTasksError(EnvError, NotImplementedError):
    """The environment has no dataset of its own: tasks must come from a file or a dataset (``--tasks``)."""

    code = "env.no_tasks"


class EnvStateError(EnvError, RuntimeError):
    """An environment's methods were called out of order (``call_tool`` before ``reset``, a second
    ``reset`` on one instance)."""

    code = "env.state"


# Not an AgentRLError, deliberately: a control-flow signal (the episode ends as ``timeout``, an outcome the
# episode records and scores), not a failure of agentrl or of the environment.
class AgentTimeLimit(Exception):
    """Raised by a tool when the episode's agent time budget is used up: the episode ends as ``timeout``
    (``RemoteEnvironment`` raises it when its server session ran out of agent time)."""


TOOL_THREADS = 256
"""Threads that run synchronous (``def``) tools, shared by every environment in the process."""
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _tool_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The thread pool of synchronous tools (created on first use: no import side effects)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(TOOL_THREADS, thread_name_prefix="agentrl-tool")
        return _pool


@dataclass
class ToolTime:
    """The seconds one tool call ran, written where it ran (a sync tool's worker thread), also when the
    tool raised; ``None`` while it has not finished (a call abandoned at its timeout)."""

    seconds: float | None = None


def cpu_wait_s() -> float:
    """The seconds the calling thread has spent runnable but waiting for a CPU (Linux's per-thread scheduler
    statistics); 0 where the kernel does not report them."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


async def run_sync_tool(fn: Callable[..., Any], kwargs: dict[str, Any], timeout_s: float,
                        spent: ToolTime | None = None) -> Any:
    """``fn(**kwargs)`` in a worker thread, waited for at most ``timeout_s``.

    ``spent`` receives the seconds ``fn`` itself ran, measured in the thread, whether it returned or
    raised: waiting for a free thread, for the busy event loop to pick the result up, or for a CPU while the
    machine is oversubscribed (the thread runnable, another process running) is not included.

    The event loop keeps running other episodes meanwhile. A thread cannot be killed: after a timeout the
    call is abandoned (its result dropped) and finishes in the background.
    """
    spent = spent if spent is not None else ToolTime()

    def timed() -> Any:
        t0, waited = time.perf_counter(), cpu_wait_s()
        try:
            return fn(**kwargs)
        finally:
            spent.seconds = max(0.0, time.perf_counter() - t0 - (cpu_wait_s() - waited))

    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, timed)
    return await asyncio.wait_for(loop.run_in_executor(_tool_pool(), call), timeout=timeout_s)


def tool(fn: F | None = None, *, name: str | None = None) -> Any:
    """Mark an `Environment` method as a tool the model can call.

    The JSON schema is derived from the type hints; the description and per-argument descriptions come
    from the docstring. The method may be sync or async and returns a string (or anything JSON-able).
    Async tools run on the event loop; sync (``def``) tools run in a worker thread, so a blocking tool
    (``time.sleep``, ``subprocess.run``, a slow library) never stalls the other episodes. Both are bounded
    by ``tool_timeout_s``. A sync tool must not touch asyncio objects of the loop.
    """

    def mark(f: F) -> F:
        setattr(f, _TOOL_ATTR, name or f.__name__)
        return f

    return mark(fn) if fn is not None else mark


@contextlib.asynccontextmanager
async def run_scope(env_cls: type[Environment], run_id: str) -> AsyncIterator[None]:
    """``async with run_scope(EnvClass, run_id):`` calls ``setup_run`` on entry and ``teardown_run`` on
    exit (also on errors and interrupts). Training and evaluation wrap their episodes in it."""
    await env_cls.setup_run(run_id)
    try:
        yield
    finally:
        await env_cls.teardown_run()


@dataclass(frozen=True)
class ToolSpec:
    """A tool of an environment class: its name, method name and OpenAI schema."""

    name: str
    attr: str
    schema: dict[str, Any]


class Environment:
    """Base class for tool environments. Subclass it; see the module docstring for an example."""

    name: ClassVar[str] = ""
    """Registry name (``agentrl train --env NAME``)."""
    system_prompt: ClassVar[str | None] = None
    """Optional system message placed before the opening prompt."""
    max_turns: ClassVar[int] = 8
    """Maximum number of model turns per episode."""
    agent_time_limit_s: ClassVar[float] = 120.0
    """Seconds the agent's tool calls may take in total in one episode. Only time the agent's actions cost
    counts: waiting for the inference engine (queueing, weight updates) and the environment's own
    ``reset`` and ``reward`` do not. Running out ends the episode as ``timeout`` (scored 0, trained on)."""
    wall_time_limit_s: ClassVar[float] = 3600.0
    """Hard safety limit on one episode's wall clock, everything included. An episode cut by it ends as
    ``wall_timeout``: an infrastructure failure, recorded and never trained on."""
    tool_timeout_s: ClassVar[float] = 60.0
    """Wall-clock limit for one tool call (a timed-out call is an error observation; the episode goes on)."""
    reset_timeout_s: ClassVar[float] = 300.0
    """Wall-clock limit for ``reset`` (not charged to the agent; running past it is an ``env_error``)."""
    reward_timeout_s: ClassVar[float] = 300.0
    """Wall-clock limit for ``reward``, e.g. a test suite (not charged to the agent; past it: ``env_error``)."""
    max_tokens_per_turn: ClassVar[int] = 256
    """Token budget of one model turn."""
    task_fields: ClassVar[tuple[str, ...]] = ()
    """Fields every task must have (``id`` aside), checked when tasks are read from a file or dataset
    (``--tasks``): a source whose columns are named otherwise maps them (``task_columns = {field = "column"}``
    in the run config, ``--task-column FIELD=COLUMN``). Empty: nothing is required."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "episode_timeout_s" in cls.__dict__:
            raise EnvDefinitionError(
                f"{cls.__name__}.episode_timeout_s is no longer used: the episode clock was split into "
                "agent_time_limit_s (the agent's tool time, the limit the model is judged by) and "
                "wall_time_limit_s (a hard safety limit; episodes cut by it are infrastructure failures)")

    def __init__(self) -> None:
        self.task: Task = {}
        self.finished = False
        self.last_tool_s: float | None = None
        """Seconds the last tool call itself ran (in its thread for a sync tool; on the event loop for an
        async one), set by ``call_tool``: what the agent's time limit is charged. None: not measured."""

    # ----- what subclasses define -------------------------------------------------------------
    @classmethod
    def tasks(cls, split: str = "train") -> Sequence[Task]:
        """The environment's own dataset for ``split`` ("train" or "test"). Optional: tasks may come
        from a file or a dataset instead (``--tasks``: JSONL, parquet, CSV, a saved or a hub dataset)."""
        raise NoTasksError(
            f"{cls.__name__} has no built-in dataset; pass tasks with --tasks (a JSONL, parquet or CSV file, "
            "or a dataset) instead"
        )

    async def reset(self, task: Task) -> str | list[dict[str, Any]]:
        """Start an episode: return the opening user prompt, or a list of chat messages.

        The default uses ``task["prompt"]`` (a string) or ``task["messages"]`` (a list).
        """
        if "messages" in task:
            return list(task["messages"])
        if "prompt" in task:
            return str(task["prompt"])
        raise TaskPromptError(f"task {task.get('id')!r} has neither 'prompt' nor 'messages'; override reset()")

    async def reward(self, messages: list[Message]) -> float | dict[str, float]:
        """Score the finished episode. Return a float, or a dict with a ``"reward"`` key plus extra metrics."""
        raise NotImplementedError(f"{type(self).__name__} must implement reward()")

    async def close(self) -> None:
        """Release what the episode holds (sandboxes, files). Called exactly once, even after errors."""

    # ----- optional class-level hooks ----------------------------------------------------------
    @classmethod
    async def setup_run(cls, run_id: str) -> None:
        """Called once before the first episode of a training or evaluation run (see `run_scope`): start
        resources the episodes share (e.g. a sandbox pool) and clean up after crashed earlier runs.
        Default: nothing."""

    @classmethod
    async def teardown_run(cls) -> None:
        """Called once after the run's last episode, also when the run fails or is interrupted: release
        what `setup_run` started. Default: nothing."""

    @classmethod
    def upcoming(cls, tasks: Sequence[Task]) -> None:
        """Called by the run with the tasks it is about to start, in order (evaluation: all of them;
        training: each batch), so that the environment can prepare for them (e.g. warm sandboxes of the
        tasks' images). Must be fast and never fail the run. Default: nothing."""

    @classmethod
    def check_tasks(cls, tasks: Sequence[Task]) -> None:
        """Called by ``load_tasks`` with every task a run will use (from ``--tasks`` or ``tasks()``) before
        anything starts: raise ``ValueError`` (naming the task and what to do) for tasks this environment
        cannot run, e.g. a repository or an image that is not here. Must not fetch anything. Default:
        nothing."""

    @classmethod
    def demonstration(cls, task: Task) -> list[dict[str, Any]] | None:
        """An ideal conversation for ``task`` as OpenAI chat messages (the system prompt, the user's opening,
        assistant turns with their tool calls, tool results, the final answer), for a supervised warm-up before
        RL (``agentrl sft``). Optional: None (the default) means the environment has none."""
        return None

    @classmethod
    def reference_solution(cls, task: Task) -> list[tuple[str, dict[str, Any]]]:
        """Tool calls ``(name, arguments)`` that solve ``task``, in order. Optional; ``agentrl eval
        --policy oracle`` replays them through the normal tool dispatch to check tools and reward."""
        raise NotImplementedError(f"{cls.__name__} has no reference solution (needed by --policy oracle)")

    # ----- helpers for tools -------------------------------------------------------------------
    def finish(self) -> None:
        """End the episode after the current tool call (e.g. from a ``submit`` tool)."""
        self.finished = True

    # ----- machinery ---------------------------------------------------------------------------
    def __setattr__(self, attr: str, value: Any) -> None:
        if any(spec.attr == attr for spec in type(self).tool_specs().values()):
            raise ToolShadowedError(f"{type(self).__name__}.{attr} is a tool; assigning self.{attr} would hide "
                                    "it from the model's calls. Store the value under another name.")
        super().__setattr__(attr, value)

    @classmethod
    def tool_specs(cls) -> dict[str, ToolSpec]:
        """All tools of this class, by name (cached per class)."""
        cache = cls.__dict__.get("_tool_spec_cache")
        if cache is not None:
            return cache
        specs: dict[str, ToolSpec] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                tool_name = getattr(value, _TOOL_ATTR, None)
                if tool_name is not None:
                    specs[tool_name] = ToolSpec(tool_name, attr, function_schema(value, tool_name))
        cls._tool_spec_cache = specs
        return specs

    @classmethod
    def tool_schemas(cls) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list for this environment."""
        return [s.schema for s in cls.tool_specs().values()]

    async def call_tool(self, name: str, arguments: Any) -> str:
        """Run one tool call and return its observation text.

        Raises ToolArgumentError for an unknown tool or bad arguments, ToolError for tool-reported
        errors, TimeoutError when the tool runs past ``tool_timeout_s``. Other exceptions propagate.
        """
        self.last_tool_s = 0.0  # a call refused before it runs costs the agent nothing
        specs = self.tool_specs()
        spec = specs.get(name)
        if spec is None:
            raise ToolArgumentError(f"unknown tool {name!r}; available tools: {sorted(specs)}")
        try:
            kwargs = validate_arguments(spec.schema, arguments)
        except ArgumentSchemaError as e:
            raise ToolArgumentError(str(e)) from e
        method = getattr(self, spec.attr)
        spent = ToolTime()  # set by a sync tool's thread; otherwise the time since ``t0`` on this thread
        t0, waited = time.perf_counter(), cpu_wait_s()
        try:
            if inspect.iscoroutinefunction(method):
                result = await within(method(**kwargs), self.tool_timeout_s)
            else:
                result = await run_sync_tool(method, kwargs, self.tool_timeout_s, spent)
                if inspect.isawaitable(result):
                    spent.seconds = None  # it goes on on the event loop: measured from the start
                    result = await within(result, self.tool_timeout_s)
        finally:  # on an error too: the tool's time was spent; not the time this thread waited for a CPU
            self.last_tool_s = (spent.seconds if spent.seconds is not None
                                else max(0.0, time.perf_counter() - t0 - (cpu_wait_s() - waited)))
        return result if isinstance(result, str) else json.dumps(result)
