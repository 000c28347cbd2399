"""One episode of an `Environment`, as a state machine: open → step* → score → close.

::

              open()              step() ... step()               score()              close()
      NEW ─────────────► RUNNING ───────────────────► OVER ────────────────► SCORED ─────────────► CLOSED
                            │   (a step's outcome, or end(reason) by the driver:  ▲       (from any state)
                            └── max_tokens, inference_error, wall_timeout, aborted)┘

Every rule of an episode lives here, once, and three drivers share it:

- the agent loop (:func:`agentrl.rollout.loop.run_episode`) generates turns and feeds them to ``step``;
- the env server's sessions (:mod:`agentrl.http.server.session`) add only HTTP concerns (locking,
  idempotency, request limits, metrics) around an ``Episode``;
- :class:`agentrl.environment.remote.RemoteEnvironment` is an environment whose tools and reward run in such a server
  session, so a remote episode follows these rules on both sides.

The rules:

- ``env.task`` is set before ``reset``; a string opening becomes (system prompt, user) messages.
- A turn's tool calls run in order; tool errors, bad arguments, unparsable calls and tool timeouts are
  observations and the episode goes on. A call after ``finish()`` or an environment failure is not run.
- **The agent is charged only for what it controls**: the time its tool calls run (measured in the
  worker thread for a sync tool, so waiting for a thread or a busy event loop is not charged; for any tool,
  less the time its thread waited for a CPU) counts
  against ``Environment.agent_time_limit_s``, checked after each call (one call is bounded by
  ``tool_timeout_s``). Running out ends the episode as ``timeout``, scored 0 and trained on, since the
  agent spent that time. Waiting for the inference engine (queueing, weight updates) and the
  environment's own ``reset`` and ``reward`` is not charged; those have their own limits, and the
  driver's hard wall clock ends an episode as ``wall_timeout``: an infrastructure failure, never trained on.
- A turn with no tool call ends the episode (``completed``), as do ``finish()``, the turn limit
  (``max_turns``) and ``max_parse_errors`` turns in a row with only malformed calls (``parse_error``).
- Scored stop reasons get ``reward()``; ``timeout`` gets 0; failures get 0 and are not trained on.
- **The reward rule**: a finite real number (bools and numpy scalars count), or a dict with a finite
  ``"reward"`` and finite numeric extra metrics. Anything else (NaN, inf, a missing key, a string) is an
  environment error (``env_error``): recorded, reward 0, never trained on.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import numbers
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentrl.core.errors import AgentRLError, EnvError
from agentrl.core.types import SCORED_STOP_REASONS, Message, StopReason, ToolCall
from agentrl.environment.base import AgentTimeLimit, Environment, Task, ToolArgumentError, ToolError, within

log = logging.getLogger(__name__)


class Phase(str, enum.Enum):
    """Where an episode is in its life."""

    NEW = "new"
    RUNNING = "running"
    OVER = "over"
    SCORED = "scored"
    CLOSED = "closed"


class EnvFailure(EnvError):
    """The environment raised where it must not (``reset``); the episode is over as ``env_error``."""

    code = "env.failure"


class EpisodeStateError(AgentRLError, RuntimeError):
    """An episode method was called in the wrong phase (a driver bug, or a client out of order)."""

    code = "rollout.episode_state"


class RewardError(EnvError):
    """``reward()`` returned something the reward rule refuses (see :func:`check_reward`): the episode is an
    ``env_error``. Raised as one of its subclasses, which keep the builtin each case used to raise."""

    code = "env.reward"


class RewardKeyError(RewardError, KeyError):
    """``reward()`` returned a dict without a ``"reward"`` key."""

    code = "env.reward.missing_key"


class RewardTypeError(RewardError, TypeError):
    """``reward()`` returned a reward that is not a number."""

    code = "env.reward.not_a_number"


class RewardValueError(RewardError, ValueError):
    """``reward()`` returned a non-finite reward, or a metric that is not a finite number."""

    code = "env.reward.not_finite"


@dataclass(frozen=True)
class EpisodeLimits:
    """A driver's limits on top of the environment class's own (never charged to the agent)."""

    reset_timeout_s: float | None = None
    """Cap on ``Environment.reset_timeout_s`` (None: the environment's own limit)."""
    reward_timeout_s: float | None = None
    """Cap on ``Environment.reward_timeout_s`` (None: the environment's own limit)."""
    close_timeout_s: float = 30.0
    """``close``."""
    step_timeout_s: float | None = None
    """All tool calls of one step together (the env server's per-request bound); None: no bound."""
    max_parse_errors: int = 3
    """Consecutive turns with only malformed tool calls before the episode stops (``parse_error``)."""


@dataclass(frozen=True)
class BadCall:
    """A tool call that could not be parsed (malformed JSON, missing name): answered with an error."""

    problem: str
    """What is wrong, written for the model to read."""
    id: str | None = None
    """The call id, when the call had one."""
    name: str = "invalid_tool_call"
    """The tool name, when the call had one."""


@dataclass
class ToolResult:
    """The observation of one tool call."""

    message: Message
    """The ``tool`` message appended to the transcript."""
    error: str | None = None
    """None, or the kind of failure: ``invalid_arguments``, ``tool_error``, ``timeout``, ``env_error``."""
    tool_s: float | None = None
    """Seconds charged to the agent for this call (None: the tool did not run)."""


def error_text(e: BaseException, where: str = "", *, trace: bool = False) -> str:
    """``Type: message`` (first line), then where it happened and optionally a short traceback."""
    text = f"{type(e).__name__}: {e}"
    if where:
        text += f"\n  in {where}"
    if trace:
        text += "\n" + "".join(traceback.format_exception(type(e), e, e.__traceback__, limit=5))
    return text[:4000]


def check_reward(result: Any, where: str = "reward()") -> tuple[float, dict[str, float]]:
    """The reward rule: ``(reward, metrics)`` from what ``reward()`` returned, or a :class:`RewardError` (a
    ``KeyError``, ``TypeError`` or ``ValueError``)."""
    if isinstance(result, dict):
        if "reward" not in result:
            raise RewardKeyError(f"{where} returned a dict without a 'reward' key (keys: {sorted(map(str, result))})")
        reward, extra = result["reward"], {k: v for k, v in result.items() if k != "reward"}
    else:
        reward, extra = result, {}
    if not isinstance(reward, numbers.Real):
        raise RewardTypeError(f"{where} returned a {type(reward).__name__} reward ({reward!r:.100}); it must be a number")
    if not math.isfinite(reward):
        raise RewardValueError(f"{where} returned a non-finite reward ({reward})")
    metrics: dict[str, float] = {}
    for k, v in extra.items():
        if not isinstance(v, numbers.Real) or not math.isfinite(v):
            raise RewardValueError(f"{where} returned metric {k!r} = {v!r:.100}; metrics must be finite numbers")
        metrics[str(k)] = float(v)
    return float(reward), metrics


class Episode:
    """One episode of ``env_cls`` on ``task`` (see the module docstring). Not thread-safe; one driver."""

    def __init__(self, env_cls: type[Environment], task: Task, limits: EpisodeLimits | None = None, *,
                 traces: bool = False) -> None:
        self.env_cls = env_cls
        self.traces = traces
        """Append a short traceback to ``error`` when the environment raises (local runs; the env server
        keeps tracebacks in its log, never in answers)."""
        self.task = task
        self.task_id = str(task.get("id", ""))
        self.limits = limits or EpisodeLimits()
        self.env: Environment | None = None
        self.phase = Phase.NEW
        self.messages: list[Message] = []
        """The transcript: opening messages, assistant turns and tool observations."""
        self.turn = 0
        """Model turns counted so far."""
        self.stop_reason: StopReason | None = None
        self.error: str | None = None
        """For an episode that failed: ``Type: message`` and where."""
        self.reward: float | None = None
        self.metrics: dict[str, float] = {}
        self.num_tool_calls = 0
        self.num_malformed_tool_calls = 0
        self.parse_error_streak = 0
        self.agent_s = 0.0
        """Seconds charged to the agent: its tool calls."""
        self.reset_s = self.reward_s = 0.0

    # ----- queries ------------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """The episode is over (scored or not)."""
        return self.phase in (Phase.OVER, Phase.SCORED) or self.stop_reason is not None

    @property
    def reset_timeout_s(self) -> float:
        """The limit on ``reset``: the environment's, capped by the driver's."""
        return min(self.env_cls.reset_timeout_s, self.limits.reset_timeout_s or math.inf)

    @property
    def reward_timeout_s(self) -> float:
        """The limit on ``reward``: the environment's, capped by the driver's."""
        return min(self.env_cls.reward_timeout_s, self.limits.reward_timeout_s or math.inf)

    @property
    def agent_time_left_s(self) -> float:
        """Seconds of tool time the agent has left."""
        return self.env_cls.agent_time_limit_s - self.agent_s

    def _require(self, *phases: Phase) -> None:
        if self.phase not in phases:
            raise EpisodeStateError(f"episode of {self.env_cls.__name__} on task {self.task_id!r} is "
                                    f"{self.phase.value}; expected {' or '.join(p.value for p in phases)}")

    # ----- transitions --------------------------------------------------------------------------------
    async def open(self) -> list[Message]:
        """Create the environment and reset it on the task; returns the opening messages.

        Raises ``EnvFailure`` (the episode is then over as ``env_error``) when ``reset`` fails or times out.
        """
        self._require(Phase.NEW)
        self.phase = Phase.RUNNING
        t0 = time.perf_counter()
        try:
            self.env = self.env_cls()
            self.env.task = self.task
            opening = await within(self.env.reset(self.task), self.reset_timeout_s)
            if isinstance(opening, str):
                if self.env.system_prompt:
                    self.messages.append(Message(role="system", content=self.env.system_prompt))
                self.messages.append(Message(role="user", content=opening))
            else:
                self.messages.extend(Message.model_validate(m) for m in opening)
        except asyncio.TimeoutError:
            self._fail(f"reset timed out after {self.reset_timeout_s}s")
            raise EnvFailure(self.error) from None
        except asyncio.CancelledError:
            self.end(StopReason.ABORTED, "CancelledError: the episode was cancelled during reset")
            raise
        except Exception as e:
            log.debug("reset of %s on task %r failed", self.env_cls.__name__, self.task_id, exc_info=True)
            self._fail(error_text(e, "reset()", trace=self.traces))
            raise EnvFailure(error_text(e)) from None
        finally:
            self.reset_s = time.perf_counter() - t0
        return list(self.messages)

    async def step(self, content: str, calls: Sequence[ToolCall | BadCall] = (), *,
                   count_turn: bool = True, cut: bool = False) -> list[ToolResult]:
        """One assistant turn: record it, run its tool calls in order, decide whether the episode is over.

        ``calls`` are the turn's parsed tool calls and the ones that could not be parsed (``BadCall``), in
        the order the model wrote them. ``count_turn=False`` (a remote agent stepping one call at a time)
        leaves the turn limit to the caller. ``cut``: the turn was cut by its token budget; it ends the
        episode as ``max_tokens`` and its tool calls are not run.
        """
        self._require(Phase.RUNNING)
        good = [c for c in calls if isinstance(c, ToolCall)]
        self.messages.append(Message(role="assistant", content=content, tool_calls=good or None))
        if count_turn:
            self.turn += 1
        if cut:
            self.end(StopReason.MAX_TOKENS)
            return []
        if not calls:
            self.end(StopReason.COMPLETED)
            return []
        deadline = None if self.limits.step_timeout_s is None else time.monotonic() + self.limits.step_timeout_s
        results: list[ToolResult] = []
        for call in calls:
            assert self.env is not None
            result = await (self._run(call, deadline) if isinstance(call, ToolCall) else self._bad(call))
            results.append(result)
            self.messages.append(result.message)
            if self.done or self.env.finished or self.agent_time_left_s <= 0:
                break
        self.parse_error_streak = self.parse_error_streak + 1 if not good else 0
        if self.done:
            return results
        assert self.env is not None
        if self.env.finished:
            self.end(StopReason.COMPLETED)
        elif self.agent_time_left_s <= 0:
            self.end(StopReason.TIMEOUT, f"TimeoutError: the agent's tool time ({self.agent_s:.3g}s) ran past "
                                         f"its limit of {self.env_cls.agent_time_limit_s}s")
        elif self.parse_error_streak >= self.limits.max_parse_errors:
            self.end(StopReason.PARSE_ERROR)
        elif count_turn and self.turn >= self.env_cls.max_turns:
            self.end(StopReason.MAX_TURNS)
        return results

    def end(self, reason: StopReason, error: str | None = None) -> None:
        """End a running episode for ``reason`` (the driver's: max_tokens, inference_error, ...). Idempotent
        once over: the first reason stands."""
        if self.stop_reason is None:
            self.stop_reason = reason
            if error is not None:
                self.error = error
        if self.phase in (Phase.NEW, Phase.RUNNING):
            self.phase = Phase.OVER

    async def score(self, messages: Sequence[Message] | None = None) -> tuple[float, dict[str, float]]:
        """End the episode if it is running (``completed``), then score it once: ``(reward, metrics)``.

        ``messages``: the transcript the reward sees (default: the episode's own). Scored stop reasons
        call ``reward()`` under the reward rule; a broken reward makes the episode an ``env_error``.
        """
        if self.phase is Phase.SCORED:
            assert self.reward is not None
            return self.reward, dict(self.metrics)
        self._require(Phase.RUNNING, Phase.OVER)
        self.end(StopReason.COMPLETED)
        self.reward, self.metrics = 0.0, {}
        if self.stop_reason in SCORED_STOP_REASONS and self.env is not None:
            t0 = time.perf_counter()
            try:
                result = await within(self.env.reward(list(messages or self.messages)), self.reward_timeout_s)
                self.reward, self.metrics = check_reward(result, f"{self.env_cls.__name__}.reward()")
            except asyncio.TimeoutError:
                self._fail(f"TimeoutError: reward timed out after {self.reward_timeout_s}s")
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("reward of %s failed", self.env_cls.__name__, exc_info=True)
                self._fail(error_text(e, "reward()", trace=self.traces and not isinstance(e, (KeyError, TypeError, ValueError))))
            finally:
                self.reward_s = time.perf_counter() - t0
        self.phase = Phase.SCORED
        return self.reward, dict(self.metrics)

    async def close(self) -> None:
        """Release the environment (idempotent, from any phase); a failing ``close`` is recorded and logged."""
        if self.phase is Phase.CLOSED:
            return
        if self.phase in (Phase.NEW, Phase.RUNNING):
            self.end(StopReason.ABORTED, self.error or "the episode was closed before it ended")
        self.phase = Phase.CLOSED
        env, self.env = self.env, None
        if env is None:
            return
        try:
            await asyncio.wait_for(env.close(), timeout=self.limits.close_timeout_s)
        except Exception as e:  # never raised: the episode's data is kept
            log.warning("close() of %s failed: %s", self.env_cls.__name__, error_text(e))
            self.error = (self.error + "\n" if self.error else "") + f"close() failed: {error_text(e)}"

    # ----- internals ----------------------------------------------------------------------------------
    def _fail(self, error: str) -> None:
        """The environment failed: the episode is over as ``env_error`` with reward 0."""
        self.stop_reason, self.error = StopReason.ENV_ERROR, error
        self.reward, self.metrics = 0.0, {}
        if self.phase in (Phase.NEW, Phase.RUNNING):
            self.phase = Phase.OVER

    async def _bad(self, call: BadCall) -> ToolResult:
        self.num_malformed_tool_calls += 1
        msg = Message(role="tool", content=f"Error: {call.problem}", tool_call_id=call.id, name=call.name)
        return ToolResult(msg, "invalid_arguments")

    async def _run(self, call: ToolCall, deadline: float | None) -> ToolResult:
        """Run one tool call under the tool's and the step's time limits; charge its run time to the agent."""
        assert self.env is not None
        env = self.env
        self.num_tool_calls += 1
        name = call.name

        def obs(text: str, error: str | None = None) -> ToolResult:
            return ToolResult(Message(role="tool", content=text, tool_call_id=call.id, name=name), error)

        step_left = None if deadline is None else deadline - time.monotonic()
        if step_left is not None and step_left <= 0:
            return obs(f"Error: the step's time limit of {self.limits.step_timeout_s}s was used up before "
                       f"{name} ran", "timeout")
        env.last_tool_s = None
        t0 = time.perf_counter()
        try:
            pending = env.call_tool(name, call.arguments)
            result = obs(await (pending if step_left is None else within(pending, step_left)))
        except ToolArgumentError as e:
            self.num_malformed_tool_calls += 1
            result = obs(f"Error: {e}", "invalid_arguments")
        except ToolError as e:
            result = obs(f"Error: {e}", "tool_error")
        except AgentTimeLimit as e:
            self.end(StopReason.TIMEOUT, f"TimeoutError: {e}")
            result = obs(f"Error: {e}", "timeout")
        except asyncio.TimeoutError:
            if step_left is not None and time.perf_counter() - t0 >= step_left:
                result = obs(f"Error: tool {name} timed out: the step's time limit of "
                             f"{self.limits.step_timeout_s}s ran out", "timeout")
            else:
                result = obs(f"Error: tool {name} timed out after {self.env_cls.tool_timeout_s}s", "timeout")
        except Exception as e:
            log.debug("tool %s of %s failed", name, self.env_cls.__name__, exc_info=True)
            self._fail(error_text(e, f"tool {name}", trace=self.traces))
            result = obs(f"Error: the environment failed while running {name}: {error_text(e)}", "env_error")
        finally:  # also on cancellation: the time was spent
            charged = env.last_tool_s if env.last_tool_s is not None else time.perf_counter() - t0
            self.agent_s += charged
        result.tool_s = charged
        return result
