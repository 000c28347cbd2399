"""Black-box training: GRPO groups of episodes of an unmodified agent program, trained through the policy
endpoint.

For each episode the runner creates an endpoint episode, starts the program (its own process group) with
``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` (the episode's key), ``AGENTRL_EPISODE_ID`` and ``AGENTRL_TASK``
(JSON, also on stdin) in its environment, and waits for it. The reward is the environment's ``reward`` on
the episode's last transcript, or the one the program posted. Each of the episode's rows becomes a
:class:`~agentrl.core.types.Trajectory` with the episode's reward and id; the group's advantages are computed
per episode (:func:`agentrl.orchestrator.samples.to_samples`). A program that fails, times out, never calls the
endpoint or (with ``reward = "agent"``) posts no reward is a failed episode: recorded, never trained on.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
import os
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from agentrl.config.policy import AgentConfig
from agentrl.config.run import SamplingConfig
from agentrl.core.types import Message, Routing, StopReason, Trajectory
from agentrl.core.utils.lifeline import own_process, release_process
from agentrl.environment.base import Environment, Task
from agentrl.http.policy.episodes import PolicyEpisode
from agentrl.http.policy.service import PolicyService
from agentrl.http.policy.thread import EndpointHost, SameLoop
from agentrl.rollout.episode import EnvFailure, Episode, error_text

log = logging.getLogger("agentrl.http.policy")

CONTAINER_MOUNT = "/agentrl"
"""Where an agent container sees :func:`agent_mount`'s directory."""
CONTAINER_PORT = 8780
"""The loopback port of the policy endpoint inside an agent container."""
SOCKET = "sock/policy.sock"
"""The endpoint's Unix socket, relative to :func:`agent_mount`'s directory (on the host and in the container)."""


@contextlib.contextmanager
def agent_mount() -> Iterator[tuple[str, str]]:
    """A private directory for agent containers: ``sock/`` for the endpoint's Unix socket (yielded as its
    path, with the directory) and the forwarder ``forward.py``; removed afterwards."""
    root = tempfile.mkdtemp(prefix="agentrl-agents-")
    try:
        os.chmod(root, 0o755)
        os.mkdir(os.path.join(root, os.path.dirname(SOCKET)), 0o755)
        shutil.copy(os.path.join(os.path.dirname(__file__), "forward.py"), os.path.join(root, "forward.py"))
        os.chmod(os.path.join(root, "forward.py"), 0o644)
        yield root, os.path.join(root, SOCKET)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _limit_address_space(limit: int) -> None:
    """In the agent program's process, before it runs: cap its address space at ``limit`` bytes."""
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class BlackBoxRunner:
    """Runs GRPO groups of an agent program's episodes (a :class:`~agentrl.orchestrator.parts.GroupRunner`)."""

    def __init__(self, agent: AgentConfig, service: PolicyService, base_url: str, env_cls: type[Environment],
                 sampling: SamplingConfig, *, run_id: str = "", host: EndpointHost | None = None,
                 mount: str | None = None) -> None:
        self.agent = agent
        self.service = service
        self.host = host or SameLoop()
        """Where the endpoint serves: the episodes' bookkeeping runs there (their locks live there)."""
        self.mount = mount
        """With ``agent.image``: the host directory mounted into each agent container (the endpoint's socket
        in ``sock/``, the forwarder ``forward.py``; see :func:`agent_mount`)."""
        self.base_url = base_url
        self.env_cls = env_cls
        self.run_id = run_id
        self._slots = asyncio.Semaphore(agent.max_running)
        self.sampling = sampling
        """The sampling of these episodes' calls: each episode is created with its temperature."""

    def with_sampling(self, sampling: SamplingConfig) -> BlackBoxRunner:
        """This runner with other sampling settings (an evaluation's temperature), sharing the endpoint and the
        bound on programs running; ``self`` keeps its own (the producer's episodes that start meanwhile sample
        as before)."""
        other = copy.copy(self)
        other.sampling = sampling
        return other

    async def run_group(self, task: Task, group_size: int) -> list[Trajectory]:
        """``group_size`` episodes of ``task``; every row of every episode, sharing a group id."""
        gid = f"{task.get('id', '')}#{uuid.uuid4().hex[:8]}"
        episodes = await asyncio.gather(*(self.run_one(task, gid) for _ in range(group_size)))
        return [t for rows in episodes for t in rows]

    async def run_groups(self, tasks: Sequence[Task], group_size: int,
                         on_done: Callable[[list[Trajectory]], None] | None = None) -> list[list[Trajectory]]:
        """One group per task, all in flight together (bounded by ``agent.max_running``)."""
        async def one(task: Task) -> list[Trajectory]:
            group = await self.run_group(task, group_size)
            if on_done is not None:
                on_done(group)
            return group

        return list(await asyncio.gather(*(one(t) for t in tasks)))

    async def run_one(self, task: Task, group_id: str = "") -> list[Trajectory]:
        """One episode of the program on ``task``: its rows as trajectories (one failed row when it broke)."""
        async with self._slots:
            t0 = time.perf_counter()
            opening = Episode(self.env_cls, task, traces=True)
            try:
                messages = [m.to_openai() for m in await opening.open()]
            except EnvFailure:
                await opening.close()
                return [self._failed(task, group_id, StopReason.ENV_ERROR, opening.error, t0)]
            ep, key = await self.host.run(self._create(task_id=str(task.get("id", "")), group_id=group_id))
            payload = {"id": task.get("id"), "messages": messages}
            if self.agent.reward == "agent":
                payload["task"] = task
            stop, error = await self._launch(ep, key, payload)
            stop, error = await self.host.run(self._close(ep, stop, error))
            if stop is None and not ep.rows:
                stop, error = StopReason.ENV_ERROR, "the agent program made no call to the policy endpoint"
            reward, metrics = 0.0, {}
            if stop is None and self.agent.reward == "env":
                opening.end(StopReason.COMPLETED)
                reward, metrics = await opening.score([Message.model_validate(_plain(m)) for m in ep.transcript])
                if opening.stop_reason is StopReason.ENV_ERROR:
                    stop, error = StopReason.ENV_ERROR, opening.error
                ep.reward = reward
            elif stop is None:
                reward = float(ep.reward or 0.0)
            await opening.close()
            if stop is not None:
                return [self._failed(task, group_id, stop, error, t0, ep)]
            return self._rows(task, group_id, ep, reward, metrics, t0)

    async def _create(self, **labels: str) -> tuple[PolicyEpisode, str]:
        return self.service.book.create(**labels, temperature=self.sampling.temperature)

    async def _close(self, ep: PolicyEpisode, stop: StopReason | None,
                     error: str | None) -> tuple[StopReason | None, str | None]:
        """End ``ep`` once its program has exited (after a call it left in flight is recorded); the episode's
        failure, if any."""
        book = self.service.book
        async with ep.lock:
            if stop is not None:
                book.finish(ep, "closed", error=error)
            elif self.agent.reward == "agent":
                if ep.open:
                    book.finish(ep, "closed", error="the agent program exited without posting a reward")
                    return StopReason.ENV_ERROR, ep.error
                if ep.status != "ended":
                    return StopReason.ENV_ERROR, ep.error
            else:
                book.finish(ep, "ended")
        return stop, error

    async def _launch(self, ep: PolicyEpisode, key: str, payload: dict[str, Any]) -> tuple[StopReason | None, str | None]:
        """Run the program to its end; (None, None) when it exited 0, else the failure."""
        data = json.dumps(payload)
        if self.agent.image:
            return await self._launch_in_container(ep, key, data)
        env = {**os.environ, "OPENAI_BASE_URL": f"{self.base_url}/v1", "OPENAI_API_KEY": key,
               "AGENTRL_EPISODE_ID": ep.id, "AGENTRL_TASK": data, "AGENTRL_RUN_ID": self.run_id}
        limit = None if self.agent.memory_mb is None else self.agent.memory_mb << 20
        try:
            # the limit is set in the child before it runs the program (set from here after the start, a fast
            # program could allocate first)
            proc = await asyncio.create_subprocess_exec(
                *self.agent.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                preexec_fn=None if limit is None else functools.partial(_limit_address_space, limit))
        except (OSError, subprocess.SubprocessError) as e:
            return StopReason.ENV_ERROR, f"the agent program could not start: {error_text(e)}"
        own_process(proc.pid)  # ends with the run, however the run ends
        try:
            _, err = await asyncio.wait_for(proc.communicate(data.encode()), timeout=self.agent.timeout_s)
        except asyncio.TimeoutError:
            _kill(proc)
            await proc.wait()
            return StopReason.WALL_TIMEOUT, f"TimeoutError: the agent program ran past {self.agent.timeout_s:g}s"
        finally:
            if proc.returncode is None:  # cancelled: the run is stopping
                _kill(proc)
        _kill(proc)  # whatever it left running in its process group
        release_process(proc.pid)
        if proc.returncode != 0:
            tail = (err or b"").decode("utf-8", "replace").strip()[-1500:]
            return StopReason.ENV_ERROR, f"the agent program exited with status {proc.returncode}: {tail}"
        return None, None

    async def _launch_in_container(self, ep: PolicyEpisode, key: str, data: str) -> tuple[StopReason | None, str | None]:
        """Run the program in a fresh container of ``agent.image`` (see :class:`~agentrl.config.policy.AgentConfig`),
        removed when it ends, and with the run if the run dies first (the sandbox's ownership)."""
        from agentrl.sandbox import DockerSandbox, SandboxConfig, SandboxError

        assert self.agent.image and self.mount is not None, "agent containers need the endpoint's socket"
        mem = self.agent.memory_mb or 1024
        cfg = SandboxConfig(image=self.agent.image, mem_mb=max(mem, 64), workspace_mb=max(16, mem // 4),
                            tmp_mb=max(16, mem // 8), headroom_mb=16, binds={self.mount: CONTAINER_MOUNT},
                            lifetime_s=max(10, int(self.agent.timeout_s) + 60), default_timeout_s=self.agent.timeout_s,
                            labels={"agentrl.role": "agent", "agentrl.episode": ep.id})
        env = {"OPENAI_BASE_URL": f"http://127.0.0.1:{CONTAINER_PORT}/v1", "OPENAI_API_KEY": key,
               "AGENTRL_EPISODE_ID": ep.id, "AGENTRL_TASK": data, "AGENTRL_RUN_ID": self.run_id, "HOME": "/tmp"}
        argv = ["python3", f"{CONTAINER_MOUNT}/forward.py", f"{CONTAINER_MOUNT}/{SOCKET}",
                str(CONTAINER_PORT), "--", *self.agent.command]
        try:
            async with DockerSandbox(cfg) as box:
                res = await box.exec(shlex.join(argv), timeout=self.agent.timeout_s, env=env)
        except SandboxError as e:
            return StopReason.ENV_ERROR, f"the agent's container failed: {error_text(e)}"
        if res.timed_out:
            return StopReason.WALL_TIMEOUT, f"TimeoutError: the agent program ran past {self.agent.timeout_s:g}s"
        if res.exit_code != 0:
            return StopReason.ENV_ERROR, (f"the agent program exited with status {res.exit_code} in its container: "
                                          f"{res.output.strip()[-1500:]}")
        return None, None

    def _rows(self, task: Task, group_id: str, ep: PolicyEpisode, reward: float, metrics: dict[str, float],
              t0: float) -> list[Trajectory]:
        out = []
        for row in ep.rows:
            t = Trajectory(task_id=str(task.get("id", "")), env=self.env_cls.name or self.env_cls.__name__,
                           group_id=group_id, episode_id=ep.id, prompt_ids=row.prompt_ids,
                           completion_ids=row.completion_ids, loss_mask=row.loss_mask, logprobs=row.logprobs,
                           versions=row.versions, temperature=row.temperature, reward=reward, metrics=dict(metrics),
                           sampling_mask=row.mask, routing=row.routing,
                           messages=[Message.model_validate(_plain(m)) for m in row.messages],
                           stop_reason=StopReason.MAX_TOKENS if row.last_token is not None and not
                           self.service.chat.ends_turn([row.last_token]) else StopReason.COMPLETED,
                           num_turns=row.calls)
            t.timings.total_s = time.perf_counter() - t0
            out.append(t)
        return out

    def _failed(self, task: Task, group_id: str, stop: StopReason, error: str | None, t0: float,
                ep: PolicyEpisode | None = None) -> Trajectory:
        t = Trajectory(task_id=str(task.get("id", "")), env=self.env_cls.name or self.env_cls.__name__,
                       group_id=group_id, episode_id=ep.id if ep else "", stop_reason=stop, error=error)
        t.timings.total_s = time.perf_counter() - t0
        return t


@contextlib.asynccontextmanager
async def blackbox_runner(cfg: Any, client: Any, chat: Any, policy_version: Callable[[], int],
                          env_cls: type[Environment], run_id: str = "",
                          routing: Routing | None = None) -> AsyncIterator[BlackBoxRunner]:
    """A training run's policy endpoint (loopback, a fresh token, the run's policy model, sampling and policy
    version) serving on an event loop of its own (:mod:`agentrl.http.policy.thread`; its generations run on this
    loop's engine client), and the runner of ``cfg.agent``'s program over it."""
    from agentrl.config.policy import PolicyConfig
    from agentrl.http.auth import generate_token
    from agentrl.http.policy.thread import EndpointThread, LoopGenerator

    s = cfg.sampling
    pcfg = PolicyConfig(port=0, max_context_tokens=s.max_context_tokens, temperature=s.temperature,
                        top_p=s.top_p, top_k=s.top_k, min_p=s.min_p, sampling_masks=s.truncates,
                        episode_ttl_s=cfg.agent.timeout_s + 60)
    service = PolicyService(pcfg, LoopGenerator(client, asyncio.get_running_loop()), chat, model=cfg.policy_model,
                            policy_version=policy_version, routing=routing)
    endpoint = EndpointThread(service)
    with contextlib.ExitStack() as stack:
        mount, uds = stack.enter_context(agent_mount()) if cfg.agent.image else (None, None)
        async with endpoint.serving(generate_token(), uds) as url:
            yield BlackBoxRunner(cfg.agent, service, url, env_cls, cfg.sampling, run_id=run_id, host=endpoint,
                                 mount=mount)


def _plain(m: dict[str, Any]) -> dict[str, Any]:
    """A normal-form message as an agentrl :class:`~agentrl.core.types.Message` dict."""
    out: dict[str, Any] = {"role": m["role"], "content": m.get("content") or ""}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"] or uuid.uuid4().hex[:9], "name": c["function"]["name"],
                              "arguments": c["function"]["arguments"] if isinstance(c["function"]["arguments"], dict)
                              else {}} for c in m["tool_calls"]]
    for k in ("tool_call_id", "name"):
        if m.get(k):
            out[k] = m[k]
    return out
