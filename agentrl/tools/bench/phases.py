"""The measured phases the generation benchmarks share (``agentrl bench loop``, ``--adapter``): calc episodes
through the agent loop, recording their requests, and those requests replayed as bare generations."""

from __future__ import annotations

import asyncio
import cProfile
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.tools.bench.errors import BenchFailed


@dataclass
class Request:
    """One generation request of an episode: its prompt ids and how many tokens it produced."""

    prompt_ids: list[int]
    max_tokens: int


@dataclass
class PhaseResult:
    """One measured phase: tokens, wall time and this process's CPU time."""

    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    requests: int = 0
    episodes: int = 0
    failed: int = 0
    stop_reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: PhaseResult) -> None:
        """Accumulate ``other`` (another repeat of the same phase)."""
        self.tokens += other.tokens
        self.wall_s += other.wall_s
        self.cpu_s += other.cpu_s
        self.requests += other.requests
        self.episodes += other.episodes
        self.failed += other.failed
        for k, v in other.stop_reasons.items():
            self.stop_reasons[k] = self.stop_reasons.get(k, 0) + v


def requests_of(traj: Any) -> list[Request]:
    """The generation requests an episode made, recovered from its trajectory: each run of model tokens
    (loss mask 1) is one turn's output, and its prompt is everything before it."""
    out: list[Request] = []
    mask = traj.loss_mask
    i, n = 0, len(mask)
    while i < n:
        if not mask[i]:
            i += 1
            continue
        j = i
        while j < n and mask[j]:
            j += 1
        out.append(Request(list(traj.prompt_ids) + list(traj.completion_ids[:i]), j - i))
        i = j
    return out


async def _timed(run: Any) -> tuple[Any, float, float]:
    """Run the coroutine ``run``; its result, wall seconds and this process's CPU seconds."""
    w0, c0 = time.perf_counter(), time.process_time()
    res = await run
    return res, time.perf_counter() - w0, time.process_time() - c0


async def run_loop_phase(env_cls: Any, tasks: list[Any], group_size: int, client: Any, chat: Any, sampling: Any,
                         concurrency: int, salt_version: int,
                         profiler: cProfile.Profile | None = None) -> tuple[PhaseResult, list[list[Request]]]:
    """The episodes through the agent loop; the phase's figures and each episode's requests."""
    from agentrl.rollout.groups import RolloutWorkers

    workers = RolloutWorkers(env_cls, client, chat, sampling, max_concurrency=concurrency,
                             policy_version=lambda: salt_version)
    if profiler is not None:
        profiler.enable()
    try:
        groups, wall, cpu = await _timed(workers.run_groups(tasks, group_size))
    finally:
        if profiler is not None:
            profiler.disable()
    trajs = [t for g in groups for t in g]
    res = PhaseResult(wall_s=wall, cpu_s=cpu, episodes=len(trajs))
    reqs = [requests_of(t) for t in trajs]
    for t, r in zip(trajs, reqs, strict=True):
        res.tokens += sum(q.max_tokens for q in r)
        res.requests += len(r)
        res.failed += int(t.failed)
        res.stop_reasons[t.stop_reason.value] = res.stop_reasons.get(t.stop_reason.value, 0) + 1
    return res, reqs


async def run_raw_phase(episodes: list[list[Request]], client: Any, sampling: Any, concurrency: int,
                        salt: str, model: str | list[str] | None = None, per: int = 1) -> PhaseResult:
    """The same requests as bare generations: per episode in turn order, ``concurrency`` episodes at once
    (``model``: the served model or adapter they name; None: the client's; a list: episode ``i`` names
    ``model[(i // per) % len(model)]``, requests spread over several adapters in the same batches, ``per``
    consecutive episodes (a GRPO group) on the same one)."""
    import uuid

    slots = asyncio.Semaphore(concurrency)
    names = model if isinstance(model, list) else [model]

    async def one(reqs: list[Request], model: str | None) -> int:
        key, got = uuid.uuid4().hex, 0
        async with slots:
            for q in reqs:
                gen = await client.generate(q.prompt_ids, max_tokens=q.max_tokens, temperature=sampling.temperature,
                                            top_p=sampling.top_p, top_k=sampling.top_k, key=key, cache_salt=salt,
                                            ignore_eos=True, model=model)
                got += len(gen.token_ids)
        return got

    counts, wall, cpu = await _timed(asyncio.gather(*(one(r, names[(i // per) % len(names)])
                                                      for i, r in enumerate(episodes))))
    want = sum(q.max_tokens for r in episodes for q in r)
    if sum(counts) != want:
        raise BenchFailed(f"the raw replay produced {sum(counts)} tokens, the loop {want} (the engine did not "
                           "honour max_tokens with ignore_eos)")
    return PhaseResult(tokens=sum(counts), wall_s=wall, cpu_s=cpu, requests=sum(len(r) for r in episodes),
                       episodes=len(episodes))
