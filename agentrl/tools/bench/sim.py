"""A deterministic discrete-event simulator of one RL pipeline (virtual clock, an event heap, no sleeping).

Inference: ``engines`` engines sharing ``slots`` (each ``slots / engines`` concurrent requests, a FIFO
queue beyond), each request a prefill delay then decode. Decode is processor sharing within an engine:
every request decoding there advances at ``decode_rate(n)`` tokens/s, n = requests decoding on that engine,
tracked with a per-engine "virtual work" clock W (dW/dt = decode_rate(n)) so a request that starts at W0
with k tokens to decode ends when W = W0 + k. Weight syncs pause every engine. With several engines, an
episode's first request is dispatched by the inference client's own rule
(``agentrl.inference.routing.EndpointPool``: least outstanding requests, or with ``dispatch="tokens"``
least outstanding tokens) and its later turns stay on that engine (its prefix cache).

Trainer: a batch of B groups costs ``train_s_per_token · tokens + train_step_s``, then ``sync_s`` to
publish the weights (version + 1). Per-token versions are tracked as token counts per version for each
episode; a weight update in the middle of a turn splits it (partial rollouts).

``mode="sync"``: start B groups, wait for the slowest, train, sync, repeat.
``mode="async"``: producers start groups whenever ``agentrl.orchestrator.buffer.BufferCore`` admits them (the same
admission, capacity and staleness logic as training), the trainer takes a batch whenever
``BufferCore.try_take`` has one.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.config.run import PipelineConfig
from agentrl.core.versions import PolicyVersion, past_age_cap, staleness, staleness_version
from agentrl.inference.routing import Endpoint, EndpointPool
from agentrl.orchestrator.buffer import BufferCore
from agentrl.tools.bench.errors import BenchArgumentError, BenchFailed
from agentrl.tools.bench.traces import Episode, Trace


@dataclass(frozen=True)
class SimParams:
    """Hardware model; defaults: a 7B dense model, 8 H100 for inference + 8 H100 for training."""

    slots: int = 512
    """Concurrent requests across the inference GPUs (64 per GPU × 8 vLLM replicas). Assumed."""
    engines: int = 1
    """Engines the slots and ``decode_half_n`` are split over. 1 (default): one pooled engine, i.e. a
    perfectly balanced set of replicas; ``for_gpus(..., engines=N)`` models N replicas and their dispatch."""
    kv_tokens: int = 0
    """KV-cache capacity in tokens over all engines (split evenly); 0 (default): unlimited, only ``slots``
    bound concurrency. A request holds its whole context plus its output from the moment it takes a slot
    until it finishes, and waits (first in, first out) while that does not fit. A 7B model with grouped-query
    attention (8 KV heads × 128 × 32 layers × K and V × 2 bytes = 128 KiB per token) leaves ~60 GB of an
    H100 for ~470k tokens. Assumed; vLLM allocates blocks as tokens are generated and preempts when full,
    which this reservation approximates from the safe side."""
    decode_tok_s: float = 80.0
    """Per-request decode speed at low concurrency (7B bf16 on one H100, contexts of a few k tokens). Assumed."""
    decode_half_n: float = 256.0
    """Concurrency at which per-request speed halves (32 per GPU); aggregate → 80 · 256 ≈ 20k tok/s. Assumed."""
    prefill_tok_s: float = 20_000.0
    """Per-request prefill speed of new tokens (earlier turns hit the prefix cache). Assumed."""
    request_overhead_s: float = 0.02
    """Scheduling and HTTP overhead per model call. Assumed."""
    train_s_per_token: float = 18.75e-6
    """Trainer cost per sequence token of a LoRA step (what this project trains): the frozen base needs no
    weight gradients, so forward + activation backward + logprob recompute ≈ 6 · 7e9 = 42 GFLOP/token;
    at ~2.2 PFLOP/s sustained on 8 H100 (~30 % of bf16 peak, an assumed MFU) ≈ 53k tokens/s."""
    train_step_s: float = 5.0
    """Fixed cost per step: optimizer step, gradient all-reduce, batch assembly. Assumed."""
    sync_s: float = 0.06
    """LoRA adapter publication, as measured in this project's training (``docs/async.md``, pinned calc
    run, medians): trainer-side gather 40 ms + shared-memory RPC 8 ms + pause/resume round trips (~4 ms
    each, ``agentrl bench sync``'s ``rpc_ms``). Measured on CPU; an adapter (not 14 GB of full weights
    over NCCL, ~0.4 s) is what moves. ``--sync-s`` overrides it."""

    @classmethod
    def for_gpus(cls, inference_gpus: int = 8, trainer_gpus: int = 8, kv_tokens_per_gpu: int = 0,
                 **overrides: Any) -> SimParams:
        """The defaults rescaled to another split of H100s: 64 slots, half speed at 32 requests and
        ``kv_tokens_per_gpu`` of KV cache per inference GPU; trainer throughput linear in its GPUs."""
        return cls(**{"slots": 64 * inference_gpus, "decode_half_n": 32.0 * inference_gpus,
                      "kv_tokens": kv_tokens_per_gpu * inference_gpus,
                      "train_s_per_token": 18.75e-6 * 8 / trainer_gpus, **overrides})

    def decode_rate(self, n: int) -> float:
        """Tokens/s of each decoding request when ``n`` requests decode concurrently on one engine."""
        return self.decode_tok_s / (1.0 + n * self.engines / self.decode_half_n)


@dataclass(eq=False)
class _Engine:
    """One engine's decode state: its virtual work clock, decoding heap, queue and busy slots."""

    slots: int
    endpoint: Endpoint
    kv_tokens: int = 0
    """KV-cache capacity (0: unlimited)."""
    w: float = 0.0
    used: int = 0
    kv_used: int = 0
    decoding: list[tuple[float, int, _Ep]] = field(default_factory=list)
    waiting: deque[_Ep] = field(default_factory=deque)


@dataclass(eq=False)
class _Group:
    k: int
    members: list[_Ep] = field(default_factory=list)
    remaining: int = 0
    admitted_version: int = 0

    @property
    def tokens(self) -> int:
        return sum(m.episode.total_tokens for m in self.members)

    def generated(self) -> float:
        """Model tokens decoded so far for this group."""
        return sum(n for m in self.members for n in m.tokens_by_version.values())

    def measured(self, staleness_from: str = "oldest") -> int | None:
        """The version its staleness is measured from (``pipeline.staleness_from``; default its oldest token)."""
        return staleness_version((v for m in self.members for v, n in m.tokens_by_version.items() if n > 1e-6),
                                 staleness_from)


@dataclass(eq=False)
class _Ep:
    episode: Episode
    group: _Group
    turn: int = 0
    seg_w: float = 0.0
    seg_version: int = 0
    tokens_by_version: Counter[int] = field(default_factory=Counter)
    engine: _Engine | None = None
    context: int = 0
    """Tokens before this turn's output: earlier turns plus this turn's new prompt tokens."""
    cost: int = 0
    """Outstanding tokens its request in flight counts on its engine (prompt + ``max_tokens``)."""
    kv: int = 0
    """KV-cache tokens its request holds while in a slot (context + output)."""


@dataclass
class SimResult:
    """What one replay produced (durations in virtual seconds)."""

    mode: str
    total_s: float = 0.0
    train_s: float = 0.0
    slot_s: float = 0.0
    steps: int = 0
    trained_groups: int = 0
    trained_tokens: int = 0
    decoded_tokens: float = 0.0
    trained_output_tokens: float = 0.0
    """Generated (model) tokens of trained groups."""
    dropped_output_tokens: float = 0.0
    """Generated tokens of groups the buffer dropped: decode work never trained."""
    capped_output_tokens: float = 0.0
    """Generated tokens of trained groups masked out of the loss for their age (``pipeline.max_token_age``):
    decode work never trained either (not counted in ``trained_output_tokens`` or ``trained_tokens``)."""
    staleness_hist: Counter[int] = field(default_factory=Counter)
    """Trained groups by the staleness of their oldest token."""
    token_ages: Counter[int] = field(default_factory=Counter)
    """Trained generated tokens by their staleness (trainer version minus the token's version)."""
    buffer: dict[str, Any] = field(default_factory=dict)
    step_ends_s: list[float] = field(default_factory=list)
    train_iv: list[tuple[float, float]] = field(default_factory=list)
    sync_iv: list[tuple[float, float]] = field(default_factory=list)
    slots_timeline: list[tuple[float, int]] = field(default_factory=list)
    trace_exhausted: bool = False


class PipelineSim:
    """Replays the first groups of ``trace`` until ``steps`` train steps are done."""

    def __init__(self, trace: Trace, params: SimParams, mode: Literal["sync", "async"], steps: int,
                 pipeline: PipelineConfig | None = None, dispatch: Literal["requests", "tokens"] = "requests") -> None:
        self.p, self.mode, self.n_steps = params, mode, steps
        if params.engines < 1 or params.slots % params.engines:
            raise BenchArgumentError(f"{params.slots} slots do not split evenly over {params.engines} engines")
        self.pool = EndpointPool((str(i) for i in range(params.engines)), by=dispatch)
        self.engines = [_Engine(params.slots // params.engines, e, params.kv_tokens // params.engines)
                        for e in self.pool.endpoints]
        self.max_tokens = trace.max_output_tokens
        self.groups = trace.groups
        self.B = trace.groups_per_step
        self.policy = PolicyVersion(0)
        """The policy version's one owner: bumped after each sync, read by the buffer core."""
        if mode == "async":
            pipe = pipeline or PipelineConfig.for_async()
            self.core: BufferCore[_Group] = BufferCore(pipe, self.B, self.policy)
            self.staleness_from = pipe.staleness_from
            self.age_cap = pipe.token_age_cap()
            self.core.on_drop = self._dropped
        elif len(self.groups) < steps * self.B:
            raise BenchArgumentError(f"trace has {len(self.groups)} groups, sync needs {steps * self.B}")
        self.t = 0.0
        self.paused = self.trainer_busy = self.stop = False
        self.events: list[tuple[float, int, Callable[[Any], None], Any]] = []
        self.used = 0
        self.next_k = 0
        self.done_groups: list[_Group] = []
        self.seq = itertools.count()
        self.res = SimResult(mode, slots_timeline=[(0.0, 0)])

    @property
    def version(self) -> int:
        """The current policy version (its owner's)."""
        return self.policy.value

    # --- engine -------------------------------------------------------------------------------------
    def _at(self, t: float, fn: Callable[[Any], None], arg: Any = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), fn, arg))

    def _advance(self, t: float) -> None:
        dt = t - self.t
        if dt > 0:
            if not self.paused:
                for eng in self.engines:
                    if eng.decoding:
                        rate = self.p.decode_rate(len(eng.decoding))
                        eng.w += rate * dt
                        self.res.decoded_tokens += rate * dt * len(eng.decoding)
            self.res.slot_s += self.used * dt
            self.t = t

    def _set_used(self, eng: _Engine, delta: int) -> None:
        eng.used += delta
        self.used += delta
        self.res.slots_timeline.append((self.t, self.used))

    def _request(self, ep: _Ep) -> None:
        turn = ep.episode.turns[ep.turn]
        if ep.engine is None:  # first turn: the client's dispatch rule; later turns stay (prefix cache)
            ep.engine = self.engines[int(self.pool.pick().url)]
        ep.context = sum(t.prompt_tokens + t.output_tokens for t in ep.episode.turns[:ep.turn]) + turn.prompt_tokens
        ep.cost = ep.context + self.max_tokens  # what the client counts per request in flight
        ep.engine.endpoint.begin(ep.cost)
        ep.engine.waiting.append(ep)
        self._schedule(ep.engine)

    def _schedule(self, eng: _Engine) -> None:
        while eng.waiting and eng.used < eng.slots:
            ep = eng.waiting[0]
            need = ep.context + ep.episode.turns[ep.turn].output_tokens
            if eng.kv_tokens and eng.used and eng.kv_used + need > eng.kv_tokens:
                break  # first in, first out: the head waits for KV-cache space (alone, it always runs)
            eng.waiting.popleft()
            ep.kv = need
            eng.kv_used += need
            self._set_used(eng, 1)
            prefill_s = self.p.request_overhead_s + ep.episode.turns[ep.turn].prompt_tokens / self.p.prefill_tok_s
            self._at(self.t + prefill_s, self._start_decode, ep)

    def _start_decode(self, ep: _Ep) -> None:
        eng = ep.engine
        assert eng is not None
        ep.seg_w, ep.seg_version = eng.w, self.version
        heapq.heappush(eng.decoding, (eng.w + ep.episode.turns[ep.turn].output_tokens, next(self.seq), ep))

    def _decode_done(self, ep: _Ep, finish_w: float) -> None:
        eng = ep.engine
        assert eng is not None
        ep.tokens_by_version[ep.seg_version] += finish_w - ep.seg_w
        self._set_used(eng, -1)
        eng.kv_used -= ep.kv
        eng.endpoint.end(ep.cost)
        turn = ep.episode.turns[ep.turn]
        ep.turn += 1
        if ep.turn < len(ep.episode.turns):
            self._at(self.t + turn.tool_latency_s, self._request, ep)
        else:
            ep.group.remaining -= 1
            if ep.group.remaining == 0:
                self._group_done(ep.group)
        self._schedule(eng)

    @property
    def decoding(self) -> list[tuple[float, int, _Ep]]:
        """The requests decoding now, on every engine."""
        return [d for eng in self.engines for d in eng.decoding]

    def _bump_version(self) -> None:
        """New weights: tokens decoded from now on carry the next version (in-flight turns split)."""
        for eng in self.engines:
            for _, _, ep in eng.decoding:
                if eng.w > ep.seg_w:
                    ep.tokens_by_version[ep.seg_version] += eng.w - ep.seg_w
                ep.seg_w, ep.seg_version = eng.w, self.version + 1
        self.policy.bump()

    def _start_group(self, k: int, admitted_version: int = 0) -> None:
        g = _Group(k, admitted_version=admitted_version)
        g.members = [_Ep(e, g) for e in self.groups[k]]
        g.remaining = len(g.members)
        for ep in g.members:
            self._request(ep)

    # --- trainer ------------------------------------------------------------------------------------
    def _group_done(self, g: _Group) -> None:
        if self.mode == "sync":
            self.done_groups.append(g)
            if len(self.done_groups) == self.B:
                batch, self.done_groups = self.done_groups, []
                self._train(batch)
        else:
            self.core.complete(g, g.measured(self.staleness_from), g.admitted_version)
            self._try_train()

    def _try_admit(self) -> None:
        while self.core.can_admit():
            if self.next_k >= len(self.groups):
                self.res.trace_exhausted = True
                return
            self._start_group(self.next_k, self.core.admit())
            self.next_k += 1

    def _try_train(self) -> None:
        if not self.trainer_busy:
            batch = self.core.try_take(self.version)
            if batch is not None:
                self._train(batch)
        self._try_admit()  # consumed or dropped groups may have freed slots

    def _dropped(self, g: _Group) -> None:
        self.res.dropped_output_tokens += g.generated()

    def _train(self, batch: list[_Group]) -> None:
        self.trainer_busy = True
        tokens = sum(g.tokens for g in batch)
        dur = self.p.train_s_per_token * tokens + self.p.train_step_s
        cap = self.age_cap if self.mode == "async" else 0
        capped = 0.0
        for g in batch:
            oldest = g.measured()
            self.res.staleness_hist[0 if oldest is None else staleness(self.version, oldest)] += 1
            for m in g.members:
                for v, n in m.tokens_by_version.items():
                    self.res.token_ages[staleness(self.version, v)] += n
                    if past_age_cap(self.version, v, cap):  # masked out of the loss: generated, never trained
                        capped += n
        self.res.capped_output_tokens += capped
        self.res.trained_output_tokens += sum(g.generated() for g in batch) - capped
        self.res.trained_groups += len(batch)
        self.res.trained_tokens += tokens - round(capped)
        self.res.train_s += dur
        self.res.train_iv.append((self.t, self.t + dur))
        self._at(self.t + dur, self._train_done)

    def _train_done(self, _: Any = None) -> None:
        self.paused = True
        self.res.sync_iv.append((self.t, self.t + self.p.sync_s))
        self._at(self.t + self.p.sync_s, self._sync_done)

    def _sync_done(self, _: Any = None) -> None:
        self.paused = self.trainer_busy = False
        self._bump_version()
        self.res.steps += 1
        self.res.step_ends_s.append(self.t)
        if self.res.steps == self.n_steps:
            self.stop = True
        elif self.mode == "sync":
            self._start_batch()
        else:
            self._try_train()

    def _start_batch(self, _: Any = None) -> None:
        for k in range(self.res.steps * self.B, (self.res.steps + 1) * self.B):
            self._start_group(k)

    # --- main loop ----------------------------------------------------------------------------------
    def run(self) -> SimResult:
        """Run to completion; returns the result (also kept in ``self.res``)."""
        if self.mode == "sync":
            self._start_batch()
        else:
            self._try_admit()
        while not self.stop:
            t_ev = self.events[0][0] if self.events else math.inf
            t_dec, first = math.inf, None
            if not self.paused:
                for eng in self.engines:
                    if eng.decoding:
                        t = self.t + max(0.0, eng.decoding[0][0] - eng.w) / self.p.decode_rate(len(eng.decoding))
                        if t < t_dec:
                            t_dec, first = t, eng
            if t_ev == t_dec == math.inf:
                raise BenchFailed(f"{self.mode} simulation stalled at t={self.t:.1f}s, step {self.res.steps}")
            if first is not None and t_dec < t_ev:
                self._advance(t_dec)
                finish_w, _, ep = heapq.heappop(first.decoding)
                first.w = max(first.w, finish_w)
                self._decode_done(ep, finish_w)
            else:
                t, _, fn, arg = heapq.heappop(self.events)
                self._advance(t)
                fn(arg)
        self.res.total_s = self.t
        if self.mode == "async":
            self.res.buffer = self.core.stats()
        return self.res
