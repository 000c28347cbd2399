"""The asyncio agent loop: one episode of generate → parse tool calls → run tools → observe → reward.

The loop is token-faithful: turn k+1's prompt is exactly turn k's prompt, plus the ids the engine
generated, plus the template delta for the tool observations. A bad rollout is data, not a crash:
every failure ends the episode with a stop reason and an ``error``, and the trajectory is returned.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from pydantic import BaseModel, Field

from agentrl.chat import ChatFormat, parse_tool_calls
from agentrl.environment import Environment, Task, ToolArgumentError, ToolError
from agentrl.inference.client import ContextLengthError, Generation, InferenceError
from agentrl.types import Message, StopReason, Trajectory


class SamplingConfig(BaseModel):
    """How the policy samples during rollouts."""

    temperature: float = Field(1.0, ge=0.0)
    """Sampling temperature (1.0 samples from the policy itself, as RL needs)."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass; keep 1.0 for unbiased policy-gradient estimates."""
    max_context_tokens: int = Field(2048, ge=16)
    """Prompt plus completion may not exceed this many tokens (the engine's max_model_len)."""
    max_parse_errors: int = Field(3, ge=1)
    """Consecutive turns with only malformed tool calls before the episode stops (parse_error)."""


class Generator(Protocol):
    """What the loop needs from an inference client."""

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_token_ids: list[int] | None = None,
        model: str | None = None,
        key: str | None = None,
        cache_salt: str | None = None,
    ) -> Generation: ...


def _token_versions(gen: Generation, fallback: int) -> list[int]:
    """Per-token policy versions from the engine's weight-version spans (or ``fallback``)."""
    n = len(gen.token_ids)
    out = [fallback] * n
    for version, start, end in gen.weight_versions or []:
        try:
            v = int(version)
        except (TypeError, ValueError):
            continue
        for i in range(max(0, start), min(n, end)):
            out[i] = v
    return out


class _Episode:
    """State of one running episode (kept small; the Trajectory is the record)."""

    def __init__(self, traj: Trajectory) -> None:
        self.traj = traj
        self.parse_error_streak = 0

    def append(self, ids: list[int], *, model: bool, logprobs: list[float] | None = None,
               versions: list[int] | None = None) -> None:
        t = self.traj
        t.completion_ids.extend(ids)
        t.loss_mask.extend([1 if model else 0] * len(ids))
        t.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
        t.versions.extend(versions if versions is not None else [-1] * len(ids))


async def run_episode(
    env_cls: type[Environment],
    task: Task,
    client: Generator,
    chat: ChatFormat,
    sampling: SamplingConfig,
    *,
    model: str | None = None,
    group_id: str = "",
    policy_version: Callable[[], int] = lambda: 0,
) -> Trajectory:
    """Run one episode of ``env_cls`` on ``task`` and return its trajectory (never raises for
    environment or inference failures; those are recorded in the trajectory)."""
    t0 = time.perf_counter()
    traj = Trajectory(task_id=str(task.get("id", "")), env=env_cls.name or env_cls.__name__, group_id=group_id)
    ep = _Episode(traj)
    env: Environment | None = None
    try:
        env = env_cls()
        await asyncio.wait_for(
            _loop(env, task, ep, client, chat, sampling, model, policy_version),
            timeout=env.episode_timeout_s,
        )
    except asyncio.TimeoutError:
        traj.stop_reason = StopReason.TIMEOUT
        traj.error = f"TimeoutError: episode exceeded {env_cls.episode_timeout_s}s"
    except InferenceError as e:
        traj.stop_reason = StopReason.INFERENCE_ERROR
        traj.error = f"{type(e).__name__}: {e}"
    except asyncio.CancelledError:
        traj.stop_reason = StopReason.ABORTED
        traj.error = "CancelledError: the run was stopped"
        raise
    except Exception as e:
        traj.stop_reason = StopReason.ENV_ERROR
        traj.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=5)}"
    finally:
        if env is not None:
            try:
                await asyncio.wait_for(env.close(), timeout=30)
            except Exception as e:  # a failing close is recorded, never raised
                traj.error = (traj.error or "") + f"\nclose() failed: {type(e).__name__}: {e}"
        traj.timings.total_s = time.perf_counter() - t0
    return traj


async def _loop(
    env: Environment,
    task: Task,
    ep: _Episode,
    client: Generator,
    chat: ChatFormat,
    sampling: SamplingConfig,
    model: str | None,
    policy_version: Callable[[], int],
) -> None:
    traj = ep.traj
    opening = await env.reset(task)
    env.task = task
    messages: list[Message] = []
    if isinstance(opening, str):
        if env.system_prompt:
            messages.append(Message(role="system", content=env.system_prompt))
        messages.append(Message(role="user", content=opening))
    else:
        messages.extend(Message.model_validate(m) for m in opening)
    traj.messages = messages
    tools = env.tool_schemas()
    traj.prompt_ids = chat.prompt_ids([m.to_openai() for m in messages], tools)
    key = uuid.uuid4().hex

    for turn in range(env.max_turns):
        used = len(traj.prompt_ids) + len(traj.completion_ids)
        budget = min(env.max_tokens_per_turn, sampling.max_context_tokens - used)
        if budget <= 0:
            traj.stop_reason = StopReason.MAX_TOKENS
            break
        t_gen = time.perf_counter()
        try:
            gen = await client.generate(
                traj.prompt_ids + traj.completion_ids,
                max_tokens=budget,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                stop_token_ids=[chat.eos_token_id],
                model=model,
                key=key,
                cache_salt=f"policy-v{policy_version()}",
            )
        except ContextLengthError:
            traj.stop_reason = StopReason.MAX_TOKENS
            break
        finally:
            traj.timings.generate_s += time.perf_counter() - t_gen
        ep.append(gen.token_ids, model=True, logprobs=list(gen.logprobs),
                  versions=_token_versions(gen, policy_version()))
        if gen.routed_experts is not None:
            traj.routed_experts = (traj.routed_experts or []) + [gen.routed_experts]
        parsed = parse_tool_calls(chat.decode(gen.token_ids))
        messages.append(Message(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls or None))
        traj.num_turns = turn + 1
        if gen.finish_reason == "length" or (gen.token_ids and gen.token_ids[-1] != chat.eos_token_id):
            traj.stop_reason = StopReason.MAX_TOKENS
            break
        if not parsed.tool_calls and not parsed.errors:
            traj.stop_reason = StopReason.COMPLETED
            break
        tool_msgs = await _run_tools(env, parsed.tool_calls, traj)
        for err in parsed.errors:
            traj.num_malformed_tool_calls += 1
            tool_msgs.append(Message(role="tool", content=f"Error: {err}", name="invalid_tool_call"))
        ep.parse_error_streak = ep.parse_error_streak + 1 if not parsed.tool_calls else 0
        messages.extend(tool_msgs)
        if env.finished:
            traj.stop_reason = StopReason.COMPLETED
            break
        if ep.parse_error_streak >= sampling.max_parse_errors:
            traj.stop_reason = StopReason.PARSE_ERROR
            break
        if turn == env.max_turns - 1:
            traj.stop_reason = StopReason.MAX_TURNS
            break
        ep.append(chat.observation_ids([m.to_openai() for m in tool_msgs], tools), model=False)

    t_rew = time.perf_counter()
    result = await env.reward(messages)
    traj.timings.reward_s = time.perf_counter() - t_rew
    if isinstance(result, dict):
        if "reward" not in result:
            raise KeyError(f"{type(env).__name__}.reward() returned a dict without a 'reward' key")
        traj.reward = float(result["reward"])
        traj.metrics.update({k: float(v) for k, v in result.items() if k != "reward"})
    else:
        traj.reward = float(result)


async def _run_tools(env: Environment, calls: list[Any], traj: Trajectory) -> list[Message]:
    """Run the turn's tool calls in order; errors become observations for the model."""
    out: list[Message] = []
    for call in calls:
        traj.num_tool_calls += 1
        t = time.perf_counter()
        try:
            obs = await env.call_tool(call.name, call.arguments)
        except ToolArgumentError as e:
            traj.num_malformed_tool_calls += 1
            obs = f"Error: {e}"
        except ToolError as e:
            obs = f"Error: {e}"
        except asyncio.TimeoutError:
            obs = f"Error: tool {call.name} timed out after {env.tool_timeout_s}s"
        finally:
            traj.timings.tool_s += time.perf_counter() - t
        out.append(Message(role="tool", content=obs, tool_call_id=call.id, name=call.name))
        if env.finished:
            break
    return out
