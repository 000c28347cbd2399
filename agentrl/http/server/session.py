"""One session: an environment instance serving one episode to a remote agent, step by step.

The episode itself is an :class:`agentrl.rollout.episode.Episode`, the same state machine the in-process agent
loop drives, so its rules (tool calls in order, failures as observations, the agent's time limit, when the
episode ends, the reward rule) are written once. A session adds only the HTTP concerns: a lock per session,
idempotent steps, per-request limits, snapshots and metrics.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import uuid
from collections import OrderedDict

from agentrl.config.server import ServerConfig
from agentrl.core.types import StopReason, ToolCall
from agentrl.environment.base import Environment, Task
from agentrl.http.errors import ApiError
from agentrl.http.server.metrics import Metrics
from agentrl.http.server.protocol import (
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
from agentrl.rollout.episode import BadCall, EnvFailure, Episode, EpisodeLimits, ToolResult

log = logging.getLogger("agentrl.http.server")

__all__ = ["EnvFailure", "Session"]


def limits_of(config: ServerConfig) -> EpisodeLimits:
    """The episode limits a server's configuration sets."""
    return EpisodeLimits(
        reset_timeout_s=config.reset_timeout_s,
        reward_timeout_s=config.reward_timeout_s,
        close_timeout_s=config.close_timeout_s,
        step_timeout_s=config.step_timeout_s,
    )


def _call_of(c: ToolCallIn) -> ToolCall | BadCall:
    """A wire tool call as the episode takes it: parsed, or a ``BadCall`` when its arguments do not parse."""
    cid = c.id or f"call_{uuid.uuid4().hex[:12]}"
    args, problem = parse_arguments(c.function.arguments)
    if args is None:
        return BadCall(problem or "invalid arguments", id=cid, name=c.function.name)
    return ToolCall(id=cid, name=c.function.name, arguments=args)


def _observation(r: ToolResult) -> Observation:
    m = r.message
    return Observation(tool_call_id=m.tool_call_id or "", name=m.name or "", content=m.content, error=r.error,
                       tool_s=r.tool_s)


class Session:
    """An episode served over HTTP. Every mutation holds ``lock``."""

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
        self.task_id = str(task.get("id", ""))
        self.client = client
        self.config = config
        self.metrics = metrics
        self.episode = Episode(env_cls, task, limits_of(config))
        self.lock = asyncio.Lock()
        self.steps = 0
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
            messages = await self.episode.open()
        except BaseException as e:
            if isinstance(e, EnvFailure):
                log.warning("reset of %s on task %r failed: %s", self.env_name, self.task_id, e)
            await self.close()
            raise
        return SessionCreated(
            session_id=self.id,
            env=self.env_name,
            task_id=self.task_id,
            messages=[m.to_openai() for m in messages],
            tools=self.env_cls.tool_schemas(),
            max_turns=self.env_cls.max_turns,
            idle_ttl_s=self.config.session_ttl_s,
        )

    async def close(self) -> None:
        """Release the environment's resources (idempotent; a failing ``close`` is logged)."""
        if self.closed:
            return
        self.closed = True
        await self.episode.close()

    def state(self) -> SessionState:
        """A snapshot for ``GET /v1/sessions/{id}``."""
        ep = self.episode
        return SessionState(
            session_id=self.id,
            env=self.env_name,
            task_id=self.task_id,
            turn=ep.turn,
            steps=self.steps,
            done=ep.done,
            stop_reason=ep.stop_reason,
            reward=ep.reward,
            metrics=dict(ep.metrics),
            messages=[m.to_openai() for m in ep.messages],
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
            if self.episode.done:
                reason = self.episode.stop_reason.value if self.episode.stop_reason else "?"
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
            self.steps += 1
            results = await self.episode.step(req.content or "", [_call_of(c) for c in calls],
                                              count_turn=req.count_turn)
            for r in results:
                self.metrics.inc("agentrl_env_tool_calls_total", "Tool calls by environment and outcome.",
                                 env=self.env_name, outcome=r.error or "ok")
            if self.episode.done:
                await self._score()
            result = self._result([_observation(r) for r in results])
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

    def _result(self, observations: list[Observation]) -> StepResult:
        ep = self.episode
        return StepResult(
            observations=observations,
            messages=[
                {"role": "tool", "tool_call_id": o.tool_call_id, "name": o.name, "content": o.content}
                for o in observations
            ],
            done=ep.done,
            stop_reason=ep.stop_reason,
            reward=ep.reward,
            metrics=dict(ep.metrics),
            turn=ep.turn,
            error=ep.error,
        )

    # ----- reward -----------------------------------------------------------------------------------
    async def _score(self, messages: list | None = None) -> None:
        """Score the finished episode (once) and count it."""
        await self.episode.score(messages)
        self.metrics.inc(
            "agentrl_env_episodes_total",
            "Finished episodes by environment and stop reason.",
            env=self.env_name,
            stop_reason=(self.episode.stop_reason or StopReason.COMPLETED).value,
        )

    async def score(self, req: RewardRequest) -> RewardResult:
        """End the episode if it is not over (``req.stop_reason``, default completed) and return its score."""
        async with self.lock:
            self.touch()
            if self.closed:
                raise ApiError(404, f"session {self.id} is closed")
            ep = self.episode
            if ep.reward is None:
                if not ep.done:
                    ep.end(req.stop_reason or StopReason.COMPLETED)
                messages = [m.to_message() for m in req.messages] if req.messages is not None else None
                await self._score(messages)
            assert ep.stop_reason is not None and ep.reward is not None
            return RewardResult(
                reward=ep.reward,
                metrics=dict(ep.metrics),
                stop_reason=ep.stop_reason,
                error=ep.error,
            )
