"""``agentrl bench routing``: MoE routing capture in the engine and its replay in the trainer.

Starts one vLLM server of a mixture-of-experts model (``--model``; by default ``models/tiny-moe``, or a small
random Qwen3-MoE model built on the embedded model's tokenizer), without LoRA, turns on routing capture and
samples ``--episodes`` calc episodes at ``--temperature``, each carrying the experts the engine chose. The
trainer side runs in this process: the same model in the same dtype, wrapped in
:class:`~agentrl.moe.replay.RoutingReplay`, scores every episode's tokens with replay on (the engine's
experts forced) and off (the trainer routes by itself). Over loss-masked tokens it reports:

- ``logprob_mae_replay`` / ``logprob_mae_no_replay``: mean |trainer logprob − engine logprob|;
- ``is_weight_std_replay`` / ``is_weight_std_no_replay``: std of exp(trainer − engine), the spread of the
  behaviour importance weight (0 when the two sides agree);
- ``routing_mismatch_frac``: of the (position, MoE layer) decisions, the fraction where the trainer's own
  top-k differs from the engine's (replay off);
- ``routing_captured_frac``: the fraction of scored tokens whose preceding position has recorded routing;
- ``routing_bytes_per_token``: routing bytes carried per position.

Then a second round of episodes gets a weight update while it runs: once the engine has generated half as
many tokens as in round 1, or half of round 1's generations are done (answers that come back after that are
held until the update is live, so every episode still running goes on with the new weights), the attention
projections scaled by ``--attention-scale`` are published through the full-weight path (pause ``keep``, a
bucketed load through the worker extension, the new version's label, the prefix cache dropped with running
requests preempted, resume). The same figures for the tokens sampled after it (version 1), scored by the
updated model, are under ``after_update``, with ``mixed_version_episodes`` (routing computed partly by each
version), ``split_turns`` (generations the update landed in the middle of), ``stale_routing_frac`` (of the
routing kept from version 0 in those episodes, the decisions the updated model makes otherwise: the engine
recomputes those positions under the new weights, the trainer replays the kept ones) and
``logprob_mae_old_weights`` (the version-1 tokens scored by the old model: the update was live).

The last line is one JSON object. Targets (``targets_met``): every scored token's routing captured, and
replay no worse than no replay in logprob MAE and in importance-weight spread.

    agentrl bench routing --episodes 16 --json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import math
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.tools.bench.errors import BenchFailed

log = logging.getLogger(__name__)

DEFAULT_MOE_DIR = Path("models/tiny-moe")
"""The model measured by default (when it exists; else a random one is built)."""
MAX_LEN = 1024
"""The engine's context window and the episodes' token budget."""
ATTENTION = re.compile(r"\.self_attn\.[qkvo]_proj\.weight$")
"""The tensors the mid-episode update changes and publishes (expert tensors are left alone)."""
REL_TOL = 1e-9
"""Relative tolerance of the "replay no worse" targets (float32 ties)."""
FIGURES = ("logprob_mae_replay", "logprob_mae_no_replay", "is_weight_std_replay", "is_weight_std_no_replay",
           "routing_mismatch_frac", "routing_captured_frac")


class NotMoEModel(ConfigError, RuntimeError):
    """The model the routing benchmark was given is dense: it has no expert routing to capture or replay."""

    code = "config.bench_not_moe"


# ------------------------------------------------------------------------------------------ pure figures
def position_versions(routing: Any) -> list[int]:
    """The policy version whose forward pass computed each routed position of ``routing`` (its version
    spans unrolled; -1 before the first span)."""
    n = routing.n
    out = [-1] * n
    spans = list(routing.versions)
    for i, (start, version) in enumerate(spans):
        end = spans[i + 1][0] if i + 1 < len(spans) else n
        out[max(0, start):min(n, end)] = [version] * max(0, min(n, end) - max(0, start))
    return out


def scored_positions(sample: Any, version: int | None = None) -> list[int]:
    """Positions of ``sample``'s loss-masked tokens (only those sampled by policy ``version``, if given)."""
    return [t for t, m in enumerate(sample.loss_mask) if m and (version is None or sample.versions[t] == version)]


def is_weight_std(diffs: Sequence[float]) -> float:
    """Population standard deviation of exp(``diffs``): the spread of the importance weights."""
    w = [math.exp(min(d, 50.0)) for d in diffs]
    mean = math.fsum(w) / len(w)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in w) / len(w))


def token_figures(samples: Sequence[Any], replay_lps: Sequence[Sequence[float]],
                  no_replay_lps: Sequence[Sequence[float]], version: int | None = None) -> dict[str, Any]:
    """Engine vs trainer agreement over the samples' loss-masked tokens (of policy ``version`` only, if
    given), for the trainer's logprobs with replay on (``replay_lps``) and off (``no_replay_lps``), each
    one row per sample aligned with its ``input_ids``; plus the fraction of those tokens whose preceding
    position the sample's routing covers. Figures are None when there is no such token."""
    on: list[float] = []
    off: list[float] = []
    captured = 0
    for s, row_on, row_off in zip(samples, replay_lps, no_replay_lps, strict=True):
        covered = s.routing.n if s.routing is not None else 0
        for t in scored_positions(s, version):
            on.append(row_on[t] - s.behav_logprobs[t])
            off.append(row_off[t] - s.behav_logprobs[t])
            captured += t - 1 < covered
    n = len(on)
    if not n:
        return {"tokens": 0, **{k: None for k in FIGURES if k != "routing_mismatch_frac"}}
    return {"tokens": n,
            "logprob_mae_replay": math.fsum(abs(d) for d in on) / n,
            "logprob_mae_no_replay": math.fsum(abs(d) for d in off) / n,
            "is_weight_std_replay": is_weight_std(on),
            "is_weight_std_no_replay": is_weight_std(off),
            "routing_captured_frac": captured / n}


def episode_figures(trajs: Sequence[Any]) -> dict[str, Any]:
    """``episodes``, ``failed_episodes`` and ``mean_turns`` of a round of episodes."""
    return {"episodes": len(trajs), "failed_episodes": sum(t.failed for t in trajs),
            "mean_turns": math.fsum(t.num_turns for t in trajs) / len(trajs) if trajs else 0.0}


def mixed_version(traj: Any) -> bool:
    """Whether the episode's routing was computed partly by version 0 and partly by version 1."""
    return traj.routing is not None and {0, 1} <= {v for _, v in traj.routing.versions}


def split_turns(traj: Any) -> int:
    """Turns of the episode (runs of consecutive model tokens) whose tokens have both versions 0 and 1: the
    update landed while that generation was in flight."""
    split, seen = 0, set()
    for m, v in zip([*traj.loss_mask, 0], [*traj.versions, -1], strict=True):
        if m:
            seen.add(v)
            continue
        split += {0, 1} <= seen
        seen = set()
    return split


def targets_met(fig: dict[str, Any], rel_tol: float = REL_TOL) -> bool:
    """Every scored token's routing captured, and replay no worse than no replay in logprob MAE and in
    importance-weight spread (within ``rel_tol``, for float32 ties)."""
    if not fig.get("tokens") or any(fig.get(k) is None for k in FIGURES if k != "routing_mismatch_frac"):
        return False

    def no_worse(a: float, b: float) -> bool:
        return a <= b + rel_tol * max(abs(a), abs(b))

    return bool(fig["routing_captured_frac"] == 1.0
                and no_worse(fig["logprob_mae_replay"], fig["logprob_mae_no_replay"])
                and no_worse(fig["is_weight_std_replay"], fig["is_weight_std_no_replay"]))


# ------------------------------------------------------------------------------------------ the model
def random_moe_model(dest: Path, tokenizer_dir: str | Path, seed: int = 0) -> Path:
    """A small random Qwen3-MoE model (8 experts, top-2, 4 layers, hidden 128) on the tokenizer, chat
    template and generation config of ``tokenizer_dir``, saved to ``dest``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = Qwen3MoeConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, moe_intermediate_size=128,
                         num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2, head_dim=64,
                         num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=2048,
                         tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(dest))
    tok.save_pretrained(str(dest))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (Path(tokenizer_dir) / name).is_file():
            shutil.copy(Path(tokenizer_dir) / name, dest / name)
    return dest


async def moe_model(model: str | None, work: Path) -> str:
    """``model``, else ``models/tiny-moe`` when it exists, else a random MoE model built in ``work``."""
    if model:
        return str(model)
    if (DEFAULT_MOE_DIR / "config.json").is_file():
        return str(DEFAULT_MOE_DIR)
    from agentrl.tools.bench.engine import bench_model

    base = await bench_model(None)
    log.info("no %s: measuring a random Qwen3-MoE model on the tokenizer of %s", DEFAULT_MOE_DIR, base)
    return str(await asyncio.to_thread(random_moe_model, work / "random-moe", base))


class Scorer:
    """The trainer's side in this process: a Hugging Face model with :class:`RoutingReplay` on its routers,
    scoring one sample at a time with replay on and off (the off pass counts routing mismatches)."""

    def __init__(self, model: Any, info: Any) -> None:
        from agentrl.moe.replay import RoutingReplay

        self.model = model
        self.replay = RoutingReplay(model, info)
        self.decisions = 0
        self.mismatches = 0

    @property
    def mismatch_frac(self) -> float | None:
        """Of the counted decisions, the fraction where the model's own top-k differed from the engine's."""
        return self.mismatches / self.decisions if self.decisions else None

    def _logprobs(self, batch: dict[str, Any], routing: Any) -> list[float]:
        from agentrl.trainer.loss import token_logprobs

        self.replay.set(routing)
        try:
            logits = self.model(input_ids=batch["input_ids_B_T"], attention_mask=batch["attention_mask_B_T"]).logits
        finally:
            self.replay.clear()
        return token_logprobs(logits, batch["input_ids_B_T"], batch["temperatures_B"])[0].tolist()

    def score(self, sample: Any, *, replay: bool = True, no_replay: bool = True,
              count_version: int | None = None) -> tuple[list[float] | None, list[float] | None]:
        """The sample's token logprobs with replay on and off (None where not asked). The off pass counts
        mismatches over the positions with recorded routing (of policy ``count_version`` only, if given)."""
        import torch

        from agentrl.trainer.batch import collate

        batch = collate([sample], pad_id=0)
        routing = batch.get("routing_B_T_L_K")
        on = off = None
        with torch.inference_mode():
            if no_replay:
                counted = routing
                if routing is not None and count_version is not None:
                    keep = torch.tensor(position_versions(sample.routing), dtype=torch.long) == count_version
                    counted = routing.clone()
                    counted[0, : len(keep)][~keep] = -1
                self.replay.enabled = False
                self.replay.reset_stats()
                off = self._logprobs(batch, counted)
                st = self.replay.stats()
                self.decisions += int(st["routing_decisions"])
                self.mismatches += round(st["routing_mismatch_frac"] * st["routing_decisions"])
            if replay:
                self.replay.enabled = True
                on = self._logprobs(batch, routing)
        return on, off


def load_models(model: str, dtype: str, attention_scale: float) -> tuple[Any, Any]:
    """The model of ``model`` in ``dtype`` and a copy whose attention projections are scaled (eval mode)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype)).eval()
    updated = copy.deepcopy(base)  # before any hook: a copied hook would point at the original's replay
    with torch.no_grad():
        for name, p in updated.named_parameters():
            if ATTENTION.search(name):
                p.mul_(attention_scale)
    return base, updated


# ------------------------------------------------------------------------------------------ the engine side
def _check(results: list[list[Any]], what: str) -> None:
    """Raise :class:`BenchFailed` (a ``RuntimeError``) unless every worker of every endpoint answered ``{"ok": True}``."""
    bad = [w for per in results for w in (per or [{"error": "no worker answered"}])
           if not (isinstance(w, dict) and w.get("ok"))]
    if bad:
        raise BenchFailed(f"{what} failed: {bad[:2]}")


def _bucket(layout: list[Any], params: dict[str, Any]) -> str:
    """Base64 of one bucket of ``params``, packed as ``layout`` says (the engine's dtype)."""
    import torch

    from agentrl.weight_sync.buckets import layout_bytes

    buf = torch.zeros(layout_bytes(layout), dtype=torch.uint8)
    for name, dtype, _shape, offset in layout:
        raw = params[name].detach().to(getattr(torch, dtype)).contiguous().reshape(-1).view(torch.uint8)
        buf[offset: offset + raw.numel()] = raw
    return base64.b64encode(buf.numpy().tobytes()).decode("ascii")


async def publish(client: Any, params: dict[str, Any], dtype: str, version: int,
                  on_loaded: Callable[[], None] = lambda: None) -> float:
    """Load ``params`` (Hugging Face names) into the engines through the worker extension's full-weight
    path and make them live as ``version``: pause ``keep``, begin, one load per bucket, finish, the version
    label, the prefix cache dropped (running requests preempted), resume. ``on_loaded`` runs once the
    weights are in, before generation resumes. Returns the seconds it took."""
    from agentrl.core.versions import engine_label
    from agentrl.weight_sync.buckets import plan_buckets

    t0 = time.perf_counter()
    buckets = plan_buckets([(n, list(p.shape)) for n, p in params.items()], dtype, 32 << 20)
    await client.pause("keep")
    try:
        _check(await client.collective_rpc("agentrl_begin_weights"), "agentrl_begin_weights")
        for layout in buckets:
            payload = await asyncio.to_thread(_bucket, layout, params)
            _check(await client.collective_rpc("agentrl_load_weights_bytes",
                                               [payload, json.dumps({"tensors": layout})]),
                   "agentrl_load_weights_bytes")
        _check(await client.collective_rpc("agentrl_finish_weights"), "agentrl_finish_weights")
        await client.set_weight_version(engine_label(version))
        await client.reset_prefix_cache(running=True)
        on_loaded()
    finally:
        await client.resume()
    return time.perf_counter() - t0


class GatedClient:
    """An inference client that counts the generations it has answered, sets ``reached`` at the ``at``-th,
    and from then on holds every answer until ``live`` is set (the update is in): no episode takes another
    turn, or ends, on the old weights once the update is due."""

    def __init__(self, client: Any, at: int) -> None:
        self.client = client
        self.at = at
        self.done = 0
        self.reached = asyncio.Event()
        self.live = asyncio.Event()

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Any:
        gen = await self.client.generate(prompt_ids, **kw)
        self.done += 1
        if self.done >= self.at:
            self.reached.set()
        if self.reached.is_set():
            await self.live.wait()
        return gen


def metric_total(text: str, name: str) -> float | None:
    """The sum of the samples of metric ``name`` in a Prometheus text exposition (None: no sample)."""
    total = None
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            total = (total or 0.0) + float(line.rsplit(" ", 1)[1])
    return total


async def generated_tokens(http: Any, url: str) -> float | None:
    """The tokens the engine at ``url`` has generated so far (vLLM's ``/metrics``); None where it does not say."""
    import httpx

    try:
        r = await http.get(f"{url}/metrics")
    except httpx.HTTPError:
        return None
    return metric_total(r.text, "vllm:generation_tokens_total") if r.status_code == 200 else None


async def _engine_dtype(client: Any) -> str:
    results = await client.collective_rpc("agentrl_weight_dtype")
    _check(results, "agentrl_weight_dtype")
    return str(results[0][0]["dtype"])


# ------------------------------------------------------------------------------------------ the measurement
async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.inference.server import ServerStartError
    from agentrl.tools.bench.engine import scratch_dir

    t0 = time.perf_counter()
    with scratch_dir("agentrl-bench-routing-") as work:
        model = await moe_model(args.model, work)
        note = None
        try:
            out = await _measure_in(args, model, work, args.dtype)
        except ServerStartError as exc:
            if args.endpoint or args.dtype == "float32":
                raise
            note = f"vLLM did not start in {args.dtype} ({str(exc).splitlines()[0]}); measured in float32"
            log.warning("%s", note)
            out = await _measure_in(args, model, work / "float32", "float32")
    out["dtype_requested"] = args.dtype
    if note:
        out["dtype_note"] = note
    out["model"] = model if args.model or model == str(DEFAULT_MOE_DIR) else "random Qwen3-MoE (8 experts, top-2)"
    out["targets_met"] = targets_met(out)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


async def _measure_in(args: argparse.Namespace, model: str, work: Path, dtype: str) -> dict[str, Any]:
    from agentrl.config.run import SamplingConfig
    from agentrl.core.versions import engine_label
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.orchestrator.moe import model_moe, routing_template
    from agentrl.tools.bench.engine import engine_url

    info = model_moe(model)
    if info is None:
        raise NotMoEModel(f"{model} is not a mixture-of-experts model")
    tasks = list(CalcEnv.tasks("train"))
    first, second = tasks[: args.episodes], (tasks[args.episodes: 2 * args.episodes] or tasks[: args.episodes])
    sampling = SamplingConfig(temperature=args.temperature, max_context_tokens=MAX_LEN)
    async with engine_url(args.endpoint, work, model=model, dtype=dtype, max_model_len=MAX_LEN,
                          enable_lora=False) as url, InferenceClient([url], timeout_s=900) as client:
        template = await routing_template(client, info, replay=True)
        assert template is not None
        served = await _engine_dtype(client)
        await client.set_weight_version(engine_label(0))
        chat = await asyncio.to_thread(load_chat_format, model, "hermes", args.chat_template)
        base, updated = await asyncio.to_thread(load_models, model, served, args.attention_scale)
        rounds = _Rounds(args, info, client, url, chat, sampling, template, served, base, updated)
        out, trajs = await rounds.first(first)
        out["after_update"] = await rounds.second(second, trajs)
        if args.endpoint:  # give a shared engine its weights back
            original = {n: p for n, p in base.named_parameters() if ATTENTION.search(n)}
            await publish(client, original, served, 0)
    return out


@dataclass
class _Rounds:
    """The two rounds of calc episodes on a started engine (``client``, at ``url``) and their scoring by the
    trainer's side: round 1 on the ``base`` weights, round 2 with the ``updated`` ones published mid-episode."""

    args: argparse.Namespace
    info: Any
    client: Any
    url: str
    chat: Any
    sampling: Any
    template: Any
    served: str
    """The engine's weight dtype."""
    base: Any
    updated: Any
    version: int = 0
    """The policy version the episodes' turns are sampled under (1 once the update is live)."""

    async def episodes(self, gen: Any, batch: list[Any]) -> list[Any]:
        """One episode per task of ``batch``, all at once, sampling from ``gen``."""
        from agentrl.envs.calc import CalcEnv
        from agentrl.rollout.groups import RolloutWorkers

        workers = RolloutWorkers(CalcEnv, gen, self.chat, self.sampling, max_concurrency=len(batch),
                                 policy_version=lambda: self.version, routing=self.template)
        return [t for g in await workers.run_groups(batch, 1) for t in g]

    async def first(self, batch: list[Any]) -> tuple[dict[str, Any], list[Any]]:
        """Round 1: one version throughout; its figures and its episodes."""
        from agentrl.orchestrator.samples import sample_of

        t1 = time.perf_counter()
        trajs = await self.episodes(self.client, batch)
        rollout_s = time.perf_counter() - t1
        samples = [sample_of(t, 0.0) for t in trajs if not t.failed and t.completion_ids]
        scorer = Scorer(self.base, self.info)
        rows = await asyncio.to_thread(lambda: [scorer.score(s) for s in samples])
        out: dict[str, Any] = {"dtype": self.served, "temperature": self.args.temperature,
                               **episode_figures(trajs),
                               **token_figures(samples, [r[0] for r in rows], [r[1] for r in rows]),
                               "routing_mismatch_frac": scorer.mismatch_frac,
                               "routing_bytes_per_token": self.template.row_bytes,
                               "rollout_s": round(rollout_s, 1)}
        return out, trajs

    async def second(self, batch: list[Any], trajs: list[Any]) -> dict[str, Any]:
        """Round 2: a full-weight update while the episodes run, once the engine has generated half of round 1's
        model tokens (its token counter) or half of round 1's generations (``trajs``) are done, whichever comes
        first; the figures of the tokens sampled after it."""
        import httpx

        attention = {n: p for n, p in self.updated.named_parameters() if ATTENTION.search(n)}
        gated = GatedClient(self.client, max(1, sum(t.num_turns for t in trajs) // 2))
        target = max(1, sum(t.num_model_tokens for t in trajs) // 2)
        sync: dict[str, Any] = {}
        async with httpx.AsyncClient(timeout=10.0) as http:
            task = asyncio.create_task(self._update(http, await generated_tokens(http, self.url), gated, target,
                                                    attention, sync))
            try:
                trajs2 = await self.episodes(gated, batch)
                gated.reached.set()  # every episode ended before the update: none is after it
                await task
            finally:
                task.cancel()
        return await self._after_update(trajs2, attention, sync)

    async def _tokens_reached(self, http: Any, start: float | None, target: int, sync: dict[str, Any]) -> None:
        """Return once the engine has generated ``target`` tokens since ``start`` (recorded in ``sync``); never
        when the engine has no token counter."""
        now = start
        while now is not None and now - start < target:  # type: ignore[operator]
            await asyncio.sleep(0.02)
            now = await generated_tokens(http, self.url)
            if now is not None:
                sync["after_tokens"] = int(now - start)  # type: ignore[operator]
        if now is None:  # no counter: the generations decide
            await asyncio.Event().wait()

    async def _update(self, http: Any, start: float | None, gated: GatedClient, target: int,
                      attention: dict[str, Any], sync: dict[str, Any]) -> None:
        """Publish ``attention`` as version 1 once ``gated`` reaches its count or ``target`` tokens are
        generated; when and how long it took go in ``sync``."""
        waiters = [asyncio.ensure_future(gated.reached.wait()),
                   asyncio.ensure_future(self._tokens_reached(http, start, target, sync))]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        gated.reached.set()
        sync["after_generations"] = gated.done
        try:
            sync["sync_s"] = await publish(self.client, attention, self.served, 1, self._go_live)
        finally:
            gated.live.set()

    def _go_live(self) -> None:
        """The update's weights are in: turns sampled from now on are version 1."""
        self.version = 1

    async def _after_update(self, trajs2: list[Any], attention: dict[str, Any],
                            sync: dict[str, Any]) -> dict[str, Any]:
        """The figures of round 2's version-1 tokens, scored by the updated model (and by the old one)."""
        from agentrl.orchestrator.samples import sample_of

        samples2 = [sample_of(t, 0.0) for t in trajs2 if not t.failed and t.completion_ids]
        samples2 = [s for s in samples2 if 1 in s.versions]
        after, before = Scorer(self.updated, self.info), Scorer(self.base, self.info)
        stale = Scorer(self.updated, self.info)

        def score_after() -> tuple[list[Any], list[Any]]:
            new = [after.score(s, count_version=1) for s in samples2]
            old = [before.score(s, no_replay=False)[0] for s in samples2]
            for s in samples2:  # how much of the routing kept from version 0 version 1 would route otherwise
                stale.score(s, replay=False, count_version=0)
            return new, old

        new, old = await asyncio.to_thread(score_after)
        fig = token_figures(samples2, [r[0] for r in new], [r[1] for r in new], version=1)
        old_fig = token_figures(samples2, old, old, version=1)
        res = {
            **episode_figures(trajs2), **fig, "routing_mismatch_frac": after.mismatch_frac,
            "stale_routing_frac": stale.mismatch_frac, "logprob_mae_old_weights": old_fig["logprob_mae_replay"],
            "mixed_version_episodes": sum(mixed_version(t) for t in trajs2),
            "split_turns": sum(split_turns(t) for t in trajs2),
            "attention_scale": self.args.attention_scale, "published_tensors": len(attention), **sync}
        res["targets_met"] = targets_met(res)
        return res


def _fmt(x: Any, spec: str = ".3e") -> str:
    return "n/a" if x is None else format(x, spec)


def _table(res: dict[str, Any]) -> str:
    a = res["after_update"]
    lines = [f"model {res['model']}, {res['dtype']}, T = {res['temperature']}, "
             f"routing {res['routing_bytes_per_token']} bytes/token",
             f"{'':26}{'round 1 (v0)':>16}{'after update (v1)':>20}"]
    for key, label, spec in (("episodes", "episodes", "d"), ("failed_episodes", "failed episodes", "d"),
                             ("mean_turns", "mean turns", ".2f"), ("tokens", "scored tokens", "d"),
                             ("logprob_mae_replay", "logprob MAE, replay", ".3e"),
                             ("logprob_mae_no_replay", "logprob MAE, no replay", ".3e"),
                             ("is_weight_std_replay", "IS weight std, replay", ".3e"),
                             ("is_weight_std_no_replay", "IS weight std, no replay", ".3e"),
                             ("routing_mismatch_frac", "routing mismatch", ".4f"),
                             ("routing_captured_frac", "routing captured", ".4f")):
        lines.append(f"{label:26}{_fmt(res.get(key), spec):>16}{_fmt(a.get(key), spec):>20}")
    lines.append(f"update after {a.get('after_tokens', 'n/a')} tokens, {a.get('after_generations', 'n/a')} generations "
                 f"(took {_fmt(a.get('sync_s'), '.2f')} s); "
                 f"{a['mixed_version_episodes']} mixed-version episodes, {a['split_turns']} turns split by it; v1 tokens vs the old weights: MAE "
                 f"{_fmt(a['logprob_mae_old_weights'])}; v0 routing the v1 model routes otherwise: "
                 f"{_fmt(a['stale_routing_frac'], '.4f')}")
    lines.append(f"targets met: {res['targets_met']} (after the update: {a['targets_met']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench routing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="engine and trainer dtype (bfloat16 falls back to float32 where vLLM refuses it)")
    parser.add_argument("--episodes", type=int, default=32, help="calc episodes per round")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (> 0)")
    parser.add_argument("--attention-scale", type=float, default=1.02,
                        help="factor on every attention projection for the mid-episode weight update")
    parser.add_argument("--model", default=None, help=f"MoE model directory (default: {DEFAULT_MOE_DIR} if it "
                        "exists, else a small random Qwen3-MoE model built on the embedded model's tokenizer)")
    parser.add_argument("--endpoint", default=None, help="a running vLLM server of --model (without LoRA, with the "
                        f"agentrl worker extension, max-model-len >= {MAX_LEN}) to use instead of starting one; it "
                        "gets its attention weights back at the end")
    parser.add_argument("--chat-template", default=None,
                        help="render turns with this chat template instead of the model's own: a built-in name "
                             "(hermes) or a Jinja file")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if args.model is None and args.endpoint:
        args.model = str(DEFAULT_MOE_DIR)
    if not args.temperature > 0:
        parser.error("--temperature must be > 0 (greedy decoding has no sampling distribution to compare)")
    if args.episodes < 1:
        parser.error("--episodes must be at least 1")
    res = asyncio.run(_measure(args))
    if not args.json:
        print(_table(res))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
