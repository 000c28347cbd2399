"""The asyncio agent loop: one episode of generate → parse tool calls → run tools → observe → reward.

The loop drives an :class:`~agentrl.rollout.episode.Episode` (which owns every rule of an episode) and adds the
token side. It is token-faithful: turn k+1's prompt is exactly turn k's prompt, plus the ids the engine
generated, plus the template delta for the tool observations; each model token keeps its behaviour
logprob and the policy version that produced it. A bad rollout is data, not a crash: every failure ends
the episode with a stop reason and an ``error``, and the trajectory is returned.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from agentrl.config.run import SamplingConfig
from agentrl.core.masks import SamplingMask
from agentrl.core.types import Routing, StopReason, Trajectory
from agentrl.core.versions import VersionLabelError, token_versions
from agentrl.environment.base import Environment, Task
from agentrl.inference.client import ContextLengthError, InferenceError
from agentrl.inference.wire import RoutingRows
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.episode import BadCall, EnvFailure, Episode, EpisodeLimits, error_text
from agentrl.rollout.generator import Generator
from agentrl.rollout.toolcalls import new_call_id

__all__ = ["Generator", "SamplingConfig", "run_episode"]


def _append(traj: Trajectory, ids: list[int], *, model: bool, logprobs: list[float] | None = None,
            versions: list[int] | None = None, mask: SamplingMask | None = None) -> None:
    """Extend the trajectory's per-token fields in step (``mask``: the engine's kept sets of model tokens;
    the trajectory's masks start at the first one, behind count-0 rows for the tokens before it)."""
    if mask is not None and traj.sampling_mask is None:
        traj.sampling_mask = SamplingMask(vocab=mask.vocab, counts=[0] * len(traj.completion_ids))
    if traj.sampling_mask is not None:
        if mask is None:
            traj.sampling_mask.pad(len(ids))
        else:
            traj.sampling_mask.extend(mask.counts, mask.data)
    traj.completion_ids.extend(ids)
    traj.loss_mask.extend([1 if model else 0] * len(ids))
    traj.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))
    traj.versions.extend(versions if versions is not None else [-1] * len(ids))


def extend_routing(routing: Routing | None, rows: RoutingRows, prompt_len: int, versions: list[int],
                   sent: int) -> None:
    """Append a request's routing to a sequence's ``routing`` (a trajectory's, a policy endpoint row's) from
    the first position it lacks. A position's version is the version that computed it: that of the token
    sampled from it, or, for the request's prefill positions, of the request's first sampled token. Nothing
    happens without a routing record, or when ``rows`` start past its end (a lost answer: the next request
    asks again from there)."""
    have = routing.n if routing is not None else 0
    if routing is None or rows.start > have:
        return
    new = rows.rows[have - rows.start:].astype(routing.dtype, copy=False)
    first = versions[0] if versions else sent
    pos_versions = [versions[p + 1 - prompt_len] if p + 1 >= prompt_len and p + 1 - prompt_len < len(versions)
                    else first for p in range(have, have + len(new))]
    routing.extend(new, pos_versions)


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
    limits: EpisodeLimits | None = None,
    routing: Routing | None = None,
    sampling_masks: bool = False,
) -> Trajectory:
    """Run one episode of ``env_cls`` on ``task`` and return its trajectory (never raises for
    environment or inference failures; those are recorded in the trajectory).

    ``policy_version`` reads the orchestrator's current policy version; a request is tagged with the
    version at send time wherever the engine does not say which weights produced a token.

    ``routing``: for a MoE model, an empty :class:`~agentrl.core.types.Routing` of the engine's shape; each turn
    then asks the engine for the routing of the positions the trajectory does not hold yet.

    ``sampling_masks``: where ``sampling`` truncates (top-k, top-p, min-p), ask the engine for each sampled
    token's kept set (its capture must be on: :meth:`agentrl.inference.InferenceClient.enable_mask_capture`)
    and record them in ``trajectory.sampling_mask``.
    """
    t0 = time.perf_counter()
    traj = Trajectory(task_id=str(task.get("id", "")), env=env_cls.name or env_cls.__name__, group_id=group_id,
                      temperature=sampling.temperature,
                      routing=routing.model_copy(deep=True) if routing is not None else None)
    episode = Episode(env_cls, task, limits, traces=True)
    try:
        await asyncio.wait_for(_loop(episode, traj, client, chat, sampling, model, policy_version,
                                     sampling_masks and sampling.truncates),
                               timeout=env_cls.wall_time_limit_s)
    except asyncio.TimeoutError:
        episode.end(StopReason.WALL_TIMEOUT,
                    f"TimeoutError: the episode's wall clock ran past {env_cls.wall_time_limit_s}s (engine "
                    "queueing, weight updates or a slow environment): an infrastructure failure")
    except EnvFailure:
        pass  # recorded by the episode
    except (InferenceError, VersionLabelError) as e:
        episode.end(StopReason.INFERENCE_ERROR, error_text(e))
    except asyncio.CancelledError:
        episode.end(StopReason.ABORTED, "CancelledError: the run was stopped")
        await asyncio.shield(_finish(episode, traj, t0))
        raise
    except Exception as e:
        episode.end(StopReason.ENV_ERROR, error_text(e, "the agent loop", trace=True))
    await _finish(episode, traj, t0)
    return traj


async def _finish(episode: Episode, traj: Trajectory, t0: float) -> None:
    """Close the episode and copy its record into the trajectory."""
    await episode.close()
    traj.messages = episode.messages
    traj.stop_reason = episode.stop_reason or StopReason.ABORTED
    traj.error = episode.error
    traj.reward = episode.reward if episode.reward is not None else 0.0
    traj.metrics = dict(episode.metrics)
    traj.num_turns = episode.turn
    traj.num_tool_calls = episode.num_tool_calls
    traj.num_malformed_tool_calls = episode.num_malformed_tool_calls
    traj.timings.tool_s = episode.agent_s
    traj.timings.reset_s = episode.reset_s
    traj.timings.reward_s = episode.reward_s
    traj.timings.total_s = time.perf_counter() - t0


async def _loop(
    episode: Episode,
    traj: Trajectory,
    client: Generator,
    chat: ChatFormat,
    sampling: SamplingConfig,
    model: str | None,
    policy_version: Callable[[], int],
    masks: bool,
) -> None:
    messages = await episode.open()
    env = episode.env
    assert env is not None
    tools = env.tool_schemas()
    traj.prompt_ids = chat.prompt_ids([m.to_openai() for m in messages], tools)
    key = uuid.uuid4().hex
    try:
        while not episode.done:
            used = len(traj.prompt_ids) + len(traj.completion_ids)
            budget = min(env.max_tokens_per_turn, sampling.max_context_tokens - used)
            if budget <= 0:
                episode.end(StopReason.MAX_TOKENS)
                break
            sent = policy_version()
            t_gen = time.perf_counter()
            try:
                gen = await client.generate(
                    traj.prompt_ids + traj.completion_ids,
                    max_tokens=budget,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    top_k=sampling.top_k,
                    **({"min_p": sampling.min_p} if sampling.min_p else {}),
                    **({"sampling_mask": True} if masks else {}),
                    stop_token_ids=list(chat.stop_token_ids),
                    model=model,
                    key=key,
                    cache_salt=f"policy-v{sent}",
                    **({"routing_from": traj.routing.n} if traj.routing is not None else {}),
                )
            except ContextLengthError:
                episode.end(StopReason.MAX_TOKENS)
                break
            finally:
                traj.timings.generate_s += time.perf_counter() - t_gen
            versions = token_versions(gen, sent)
            prompt_len = used
            _append(traj, gen.token_ids, model=True, logprobs=list(gen.logprobs), versions=versions,
                    mask=gen.sampling_mask)
            if gen.routing is not None:
                extend_routing(traj.routing, gen.routing, prompt_len, versions, sent)
            parsed = chat.parse(chat.decode(gen.token_ids), tools)
            cut = gen.finish_reason == "length" or not chat.ends_turn(gen.token_ids)
            calls = [*parsed.tool_calls, *(BadCall(err, id=new_call_id()) for err in parsed.errors)]
            results = await episode.step(parsed.content, calls, cut=cut)
            if not episode.done:
                last = gen.token_ids[-1] if gen.token_ids else None
                _append(traj, chat.observation_ids([r.message.to_openai() for r in results], tools, ended_with=last),
                        model=False)
    finally:
        if (forget := getattr(client, "forget", None)) is not None:  # the episode's engine binding
            forget(key)
    await episode.score()
