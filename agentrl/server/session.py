"""One session: an environment instance serving one episode to a remote agent, step by step.

The rules follow the in-process agent loop (``agentrl.rollout``): an assistant turn's tool calls run in
order; tool failures become ``Error: ...`` observations and the episode goes on; a turn without tool
calls, a tool calling ``finish()``, or the turn limit ends the episode and it is scored once. If the
environment itself fails, the episode ends with ``stop_reason: env_error`` and reward 0.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
import uuid
from collections import OrderedDict
from typing import Any

from agentrl.environment import Environment, Task, ToolArgumentError, ToolError
from agentrl.server.config import ServerConfig
from agentrl.server.errors import ApiError
from agentrl.server.metrics import Metrics
from agentrl.server.protocol import (
    Observation,
    RewardRequest,
    RewardResult,
    SessionCreated,
    SessionState,
    StepRequest,
    StepResult,
    ToolCallIn,
    parse_arguments,
)
from agentrl.types import Message, StopReason, ToolCall

log = logging.getLogger("agentrl.server")


class EnvFailure(Exception):
    """The environment raised where it must not (reset, a tool, reward); reported, never re-raised to HTTP."""


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:2000]


def _finite_metrics(result: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k, v in result.items():
        if k == "reward":
            continue
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            out[str(k)] = f
    return out


class Session:
    """An environment instance, its transcript and its episode state. Every mutation holds ``lock``."""

    def __init__(
        self,
        env_name: str,
        env_cls: type[Environment],
        task: Task,
        client: str,
        config: ServerConfig,
        metrics: Metrics,
    ) -> None:
        self.id = uuid.uuid4().hex
        self.env_name = env_name
        self.env_cls = env_cls
        self.task = task
        self.task_id = str(task.get("id", ""))
        self.client = client
        self.config = config
        self.metrics = metrics
        self.env: Environment | None = None
        self.lock = asyncio.Lock()
        self.messages: list[Message] = []
        self.turn = 0
        self.steps = 0
        self.done = False
        self.stop_reason: StopReason | None = None
        self.reward: float | None = None
        self.reward_metrics: dict[str, float] = {}
        self.error: str | None = None
        self.created = self.last_active = time.monotonic()
        self.closed = False
        self._results: OrderedDict[str, tuple[str, StepResult]] = OrderedDict()

    # ----- lifecycle --------------------------------------------------------------------------------
    def touch(self) -> None:
        """Mark activity (restarts the idle clock)."""
        self.last_active = time.monotonic()

    @property
    def idle_s(self) -> float:
        """Seconds since the last request."""
        return time.monotonic() - self.last_active

    @property
    def age_s(self) -> float:
        """Seconds since creation."""
        return time.monotonic() - self.created

    async def open(self) -> SessionCreated:
        """Create the environment and reset it on the task. Raises ``EnvFailure`` (the env is then closed)."""
        try:
            self.env = self.env_cls()
            self.env.task = self.task
            opening = await asyncio.wait_for(self.env.reset(self.task), timeout=self.config.reset_timeout_s)
            if isinstance(opening, str):
                if self.env.system_prompt:
                    self.messages.append(Message(role="system", content=self.env.system_prompt))
                self.messages.append(Message(role="user", content=opening))
            else:
                self.messages.extend(Message.model_validate(m) for m in opening)
        except asyncio.CancelledError:
            await self.close()
            raise
        except Exception as e:
            await self.close()
            if isinstance(e, asyncio.TimeoutError):
                raise EnvFailure(f"reset timed out after {self.config.reset_timeout_s}s") from None
            log.warning("reset of %s on task %r failed", self.env_name, self.task_id, exc_info=True)
            raise EnvFailure(f"reset failed: {_error_text(e)}") from None
        return SessionCreated(
            session_id=self.id,
            env=self.env_name,
            task_id=self.task_id,
            messages=[m.to_openai() for m in self.messages],
            tools=self.env_cls.tool_schemas(),
            max_turns=self.env_cls.max_turns,
            idle_ttl_s=self.config.session_ttl_s,
        )

    async def close(self) -> None:
        """Release the environment's resources (idempotent; a failing ``close`` is logged)."""
        if self.closed:
            return
        self.closed = True
        env, self.env = self.env, None
        if env is None:
            return
        try:
            await asyncio.wait_for(env.close(), timeout=self.config.close_timeout_s)
        except Exception as e:
            log.warning("close of session %s (%s) failed: %s", self.id, self.env_name, _error_text(e))

    def state(self) -> SessionState:
        """A snapshot for ``GET /v1/sessions/{id}``."""
        return SessionState(
            session_id=self.id,
            env=self.env_name,
            task_id=self.task_id,
            turn=self.turn,
            steps=self.steps,
            done=self.done,
            stop_reason=self.stop_reason,
            reward=self.reward,
            metrics=dict(self.reward_metrics),
            messages=[m.to_openai() for m in self.messages],
            age_s=self.age_s,
            idle_s=self.idle_s,
        )

    # ----- steps ------------------------------------------------------------------------------------
    async def step(self, req: StepRequest, key: str | None) -> StepResult:
        """Run one assistant turn; with ``key`` (Idempotency-Key), a repeat returns the first result."""
        fingerprint = hashlib.sha256(req.model_dump_json().encode()).hexdigest()
        async with self.lock:
            self.touch()
            if key is not None and key in self._results:
                seen, result = self._results[key]
                if seen != fingerprint:
                    raise ApiError(422, "this Idempotency-Key was already used for a different step request")
                self.metrics.inc(
                    "agentrl_env_step_replays_total", "Steps answered from the idempotency cache."
                )
                return result
            if self.closed:
                raise ApiError(404, f"session {self.id} is closed")
            if self.done:
                reason = self.stop_reason.value if self.stop_reason else "?"
                raise ApiError(
                    409,
                    f"the episode is over (stop_reason: {reason}); read the reward or close the session",
                    code="episode_over",
                )
            if self.steps >= self.config.max_steps_per_session:
                raise ApiError(409, f"step limit of {self.config.max_steps_per_session} per session reached")
            calls = req.tool_calls or []
            if len(calls) > self.config.max_tool_calls_per_step:
                raise ApiError(
                    422,
                    f"{len(calls)} tool calls in one step; this server allows at most "
                    f"{self.config.max_tool_calls_per_step}",
                )
            t0 = time.perf_counter()
            result = await self._step(req, calls)
            self.metrics.observe(
                "agentrl_env_step_seconds",
                "Step latency (all tool calls of the step).",
                time.perf_counter() - t0,
                env=self.env_name,
            )
            if key is not None:
                self._results[key] = (fingerprint, result)
                while len(self._results) > self.config.idempotency_cache:
                    self._results.popitem(last=False)
            self.touch()
            return result

    async def _step(self, req: StepRequest, calls: list[ToolCallIn]) -> StepResult:
        env = self.env
        assert env is not None
        self.steps += 1
        if req.count_turn:
            self.turn += 1
        parsed = [(c.id or f"call_{uuid.uuid4().hex[:12]}", c) for c in calls]
        self.messages.append(
            Message(
                role="assistant",
                content=req.content or "",
                tool_calls=[
                    ToolCall(
                        id=cid, name=c.function.name, arguments=parse_arguments(c.function.arguments)[0] or {}
                    )
                    for cid, c in parsed
                ]
                or None,
            )
        )
        observations: list[Observation] = []
        if not calls:
            await self._finish(StopReason.COMPLETED)
            return self._result(observations)
        deadline = time.monotonic() + self.config.step_timeout_s
        for cid, call in parsed:
            obs = await self._run_call(env, cid, call, deadline)
            observations.append(obs)
            self.messages.append(Message(role="tool", content=obs.content, tool_call_id=cid, name=obs.name))
            if obs.error == "env_error" or env.finished:
                break
        if self.error is not None:
            await self._finish(StopReason.ENV_ERROR, score=False)
        elif env.finished:
            await self._finish(StopReason.COMPLETED)
        elif req.count_turn and self.turn >= env.max_turns:
            await self._finish(StopReason.MAX_TURNS)
        return self._result(observations)

    async def _run_call(self, env: Environment, cid: str, call: ToolCallIn, deadline: float) -> Observation:
        name = call.function.name
        outcome = "ok"
        try:
            args, problem = parse_arguments(call.function.arguments)
            if args is None:
                outcome = "invalid_arguments"
                return Observation(
                    tool_call_id=cid, name=name, content=f"Error: {problem}", error="invalid_arguments"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = "timeout"
                return Observation(
                    tool_call_id=cid,
                    name=name,
                    error="timeout",
                    content=(
                        f"Error: the step's time limit of {self.config.step_timeout_s}s was used up before {name} ran"
                    ),
                )
            try:
                text = await asyncio.wait_for(env.call_tool(name, args), timeout=remaining)
            except ToolArgumentError as e:
                outcome = "invalid_arguments"
                return Observation(
                    tool_call_id=cid, name=name, content=f"Error: {e}", error="invalid_arguments"
                )
            except ToolError as e:
                outcome = "tool_error"
                return Observation(tool_call_id=cid, name=name, content=f"Error: {e}", error="tool_error")
            except asyncio.TimeoutError:
                outcome = "timeout"
                limit = min(env.tool_timeout_s, self.config.step_timeout_s)
                return Observation(
                    tool_call_id=cid,
                    name=name,
                    error="timeout",
                    content=f"Error: tool {name} timed out after {limit}s",
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:
                outcome = "env_error"
                log.warning("tool %s of %s failed (session %s)", name, self.env_name, self.id, exc_info=True)
                self.error = f"tool {name} failed: {_error_text(e)}"
                return Observation(
                    tool_call_id=cid,
                    name=name,
                    error="env_error",
                    content=f"Error: the environment failed while running {name}: {_error_text(e)}",
                )
            return Observation(tool_call_id=cid, name=name, content=text)
        finally:
            self.metrics.inc(
                "agentrl_env_tool_calls_total",
                "Tool calls by environment and outcome.",
                env=self.env_name,
                outcome=outcome,
            )

    def _result(self, observations: list[Observation]) -> StepResult:
        return StepResult(
            observations=observations,
            messages=[
                {"role": "tool", "tool_call_id": o.tool_call_id, "name": o.name, "content": o.content}
                for o in observations
            ],
            done=self.done,
            stop_reason=self.stop_reason,
            reward=self.reward,
            metrics=dict(self.reward_metrics),
            turn=self.turn,
            error=self.error,
        )

    # ----- reward -----------------------------------------------------------------------------------
    async def _finish(
        self, reason: StopReason, *, score: bool = True, messages: list[Message] | None = None
    ) -> None:
        """End the episode with ``reason`` and score it (once)."""
        self.done = True
        self.stop_reason = reason
        if score and self.env is not None:
            await self._score(messages)
        else:
            self.reward, self.reward_metrics = 0.0, {}
        self.metrics.inc(
            "agentrl_env_episodes_total",
            "Finished episodes by environment and stop reason.",
            env=self.env_name,
            stop_reason=self.stop_reason.value,
        )

    async def _score(self, messages: list[Message] | None) -> None:
        assert self.env is not None
        try:
            result = await asyncio.wait_for(
                self.env.reward(list(messages or self.messages)), timeout=self.config.reward_timeout_s
            )
            if isinstance(result, dict):
                if "reward" not in result:
                    raise KeyError(f"{self.env_cls.__name__}.reward() returned a dict without a 'reward' key")
                reward, extra = float(result["reward"]), _finite_metrics(result)
            else:
                reward, extra = float(result), {}
            if not math.isfinite(reward):
                raise ValueError(f"reward is not a finite number: {reward}")
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if isinstance(e, asyncio.TimeoutError):
                self.error = f"reward timed out after {self.config.reward_timeout_s}s"
            else:
                log.warning("reward of %s failed (session %s)", self.env_name, self.id, exc_info=True)
                self.error = f"reward failed: {_error_text(e)}"
            self.stop_reason = StopReason.ENV_ERROR
            self.reward, self.reward_metrics = 0.0, {}
            return
        self.reward, self.reward_metrics = reward, extra

    async def score(self, req: RewardRequest) -> RewardResult:
        """End the episode if it is not over (``req.stop_reason``, default completed) and return its score."""
        async with self.lock:
            self.touch()
            if self.closed:
                raise ApiError(404, f"session {self.id} is closed")
            if not self.done:
                messages = [m.to_message() for m in req.messages] if req.messages is not None else None
                await self._finish(req.stop_reason or StopReason.COMPLETED, messages=messages)
            assert self.stop_reason is not None and self.reward is not None
            return RewardResult(
                reward=self.reward,
                metrics=dict(self.reward_metrics),
                stop_reason=self.stop_reason,
                error=self.error,
            )
