"""``agentrl bench loop --adapter lora|merged``: how fast does the engine generate with a trained adapter,
against the base model, side by side?

One vLLM server (started on the embedded tiny model, or ``--model``; ``--endpoint`` for one already running,
started as the mode needs: with LoRA for ``lora``, without for ``merged``). An unmeasured warm-up loop phase
records the requests of ``--tasks`` × ``--group-size`` calc episodes; then ``--repeats`` pairs replay them as
bare generations (the raw phase of ``agentrl bench loop``), alternating the base model and the adapter: a
random rank-``--adapter-rank`` adapter on every linear layer (the LoRA recipe's targets), served

- ``lora``: by vLLM's LoRA serving (the adapter loaded once from files; requests name it);
- ``merged``: merged into the engine's weights (``pipeline.weight_sync = "merged"``): before each adapter phase
  the adapter is published (:class:`agentrl.weight_sync.merged.MergedAdapterSync`), before each base phase a
  zero adapter, which gives the base weights back. The merges are not timed in the phases; their engine time
  is reported (``merge_engine_ms_p50``).

``adapter_over_base`` is the median over the pairs of the adapter phase's tokens/s over the base phase's
(target ≥ 0.9). The last line is one JSON object.

``--adapters 1,4,16`` (``lora`` only) loads that many distinct random adapters (the largest count; the engine
gets as many slots) and, after each base phase, runs one adapter phase per count, its episodes spread over the
first ``N`` adapters, so that one batch holds them all: ``--spread group`` (the default) gives each GRPO group
one adapter (group ``g`` names adapter ``g % N``: a group samples one policy, and its episodes share their
prompt's prefix cache as they do in the base phase), ``--spread episode`` gives episode ``i`` adapter ``i % N``
(a group's prompt is then prefilled once per adapter, since vLLM keys its prefix cache by adapter: that measures
the cache lost as well as the LoRA compute);
``by_adapters[N]`` has that count's rate and ratio against the same pairs' base phases (target ≥ 0.9 for one
adapter, ≥ 0.8 for several), and the prompt tokens its phases prefilled (vLLM's ``prompt_tokens`` less
``prompt_tokens_cached``, median per phase; ``base_prefilled_tokens`` for the base phases): vLLM keys its
prefix cache by adapter, so this tells prompt work the adapter phases redo from the LoRA compute itself. ``cpu_lora_fast`` says whether the engine served the slots with agentrl's CPU
fast path (:mod:`agentrl.engine.cpu_lora`; ``AGENTRL_CPU_LORA_FAST=0`` in the environment of the benchmark
that starts the engine switches it off, for the comparison); ``cpu_lora_native`` whether it served several slots
with agentrl's built kernel (:mod:`agentrl.engine.native_lora`; ``AGENTRL_CPU_LORA_NATIVE=0``: the torch ops).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
from pathlib import Path
from typing import Any

from agentrl.tools.bench.engine import bench_model, engine_url, scratch_dir
from agentrl.tools.bench.phases import PhaseResult, run_loop_phase, run_raw_phase

NAME = "bench-adapter"
TARGET = 0.9
TARGET_MANY = 0.8
"""The target of ``adapter_over_base`` with several distinct adapters in one batch."""


def _random_adapters(model: str, rank: int, n: int) -> tuple[list[Any], Any]:
    """``n`` distinct random rank-``rank`` adapters on every linear layer of ``model`` (alpha ``2 * rank``), and
    a zero one (merged, it gives the base weights back)."""
    from agentrl.config.trainer import ALL_LINEAR
    from agentrl.tools.bench.models import FixedAdapter, lora_shapes, random_lora

    shapes = lora_shapes(json.loads((Path(model) / "config.json").read_text()), rank, ALL_LINEAR)
    adapters = [FixedAdapter(random_lora(shapes, seed=i), rank, 2 * rank) for i in range(n)]
    return adapters, FixedAdapter({k: t * 0 for k, t in adapters[0].tensors.items()}, rank, 2 * rank)


async def measure_adapter(args: argparse.Namespace) -> dict[str, Any]:
    """Start (or connect to) the engine, record the work, then alternate base and adapter phases."""
    from agentrl.config.inference import engine_lora_rank
    from agentrl.config.run import SamplingConfig
    from agentrl.config.trainer import ALL_LINEAR
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.tools.bench.models import FixedAdapter
    from agentrl.weight_sync.merged import MergedAdapterSync

    model = await bench_model(args.model)
    merged = args.adapter == "merged"
    counts: list[int] = list(getattr(args, "adapters", None) or [1])
    spread = getattr(args, "spread", "group")
    adapters, zero = _random_adapters(model, args.adapter_rank, max(counts))
    adapter = adapters[0]
    names = [f"{NAME}-{i}" for i in range(len(adapters))]
    sampling = SamplingConfig(temperature=args.temperature, max_context_tokens=1024)
    base = PhaseResult()
    with_adapters = {n: PhaseResult() for n in counts}
    ratios: dict[int, list[float]] = {n: [] for n in counts}
    merge_ms: list[float] = []
    prefilled: dict[int, list[float]] = {n: [] for n in [0, *counts]}  # 0: the base phases
    fast: float | None = None
    native: float | None = None
    server = {"model": model, "dtype": "float32", "max_model_len": 1024, "enable_lora": not merged}
    if not merged:
        server.update(max_lora_rank=engine_lora_rank(args.adapter_rank), max_loras=len(adapters),
                      lora_target_modules=list(ALL_LINEAR))
    with scratch_dir("agentrl-bench-adapter-") as work:
        async with engine_url(args.endpoint, work, **server) as url:
            chat = await asyncio.to_thread(load_chat_format, model, "hermes", args.chat_template)
            chat.parser  # noqa: B018  (build the tool parser, and import vLLM, before anything is timed)
            async with InferenceClient([url], timeout_s=600) as client:
                tasks = list(CalcEnv.tasks("train"))[: args.tasks]
                _, reqs = await run_loop_phase(CalcEnv, tasks, args.group_size, client, chat, sampling,
                                               args.concurrency, 10**6)
                if not merged:
                    for name, a in zip(names, adapters, strict=True):
                        await a.save_adapter(work / name)
                        await client.load_lora_adapter(name, str(work / name))
                    with contextlib.suppress(Exception):  # an engine without agentrl's extension
                        stats = (await client.collective_rpc("agentrl_lora_stats"))[0][0]
                        fast = float(stats.get("cpu_lora_fast", 0.0))
                        native = float(stats.get("cpu_lora_native", 0.0))

                async def switch(to: FixedAdapter) -> None:
                    if merged:
                        with MergedAdapterSync(to, client) as sync:
                            merge_ms.append(float((await sync.publish(1))["engine_ms"]))

                for rep in range(-1, args.repeats):  # -1: a warm-up round, not measured
                    await switch(zero)
                    before = await prefilled_tokens(url)
                    b = await run_raw_phase(reqs, client, sampling, args.concurrency, f"bench-base-{rep}")
                    if rep >= 0:
                        base.add(b)
                        prefilled[0].append(await prefilled_tokens(url) - before)
                    await switch(adapter)
                    for n in counts:
                        model_names: str | list[str] | None = None if merged else (names[0] if n == 1
                                                                                    else names[:n])
                        before = await prefilled_tokens(url)
                        a = await run_raw_phase(reqs, client, sampling, args.concurrency,
                                                f"bench-adapter-{n}-{rep}", model=model_names,
                                                per=args.group_size if spread == "group" else 1)
                        if rep >= 0:
                            with_adapters[n].add(a)
                            ratios[n].append((a.tokens / a.wall_s) / max(b.tokens / b.wall_s, 1e-9))
                            prefilled[n].append(await prefilled_tokens(url) - before)
                if merged:  # an engine of --endpoint is left with its base weights
                    await switch(zero)
                else:
                    for name in names:
                        await client.unload_lora_adapter(name)
    by: dict[str, Any] = {}
    for n in counts:
        r = statistics.median(ratios[n])
        target = TARGET if n == 1 else TARGET_MANY
        by[str(n)] = {"adapter_tokens_per_s": round(with_adapters[n].tokens / max(with_adapters[n].wall_s, 1e-9), 1),
                      "adapter_over_base": round(r, 4), "adapter_over_base_pairs": [round(x, 4) for x in ratios[n]],
                      "target": target, "target_met": bool(r >= target),
                      "prefilled_tokens": _median(prefilled[n])}
    first = by[str(counts[0])]
    out: dict[str, Any] = {
        "adapter": args.adapter, "adapter_rank": args.adapter_rank, "adapter_targets": list(ALL_LINEAR),
        "base_tokens_per_s": round(base.tokens / max(base.wall_s, 1e-9), 1),
        "adapter_tokens_per_s": first["adapter_tokens_per_s"],
        "adapter_over_base": first["adapter_over_base"], "adapter_over_base_pairs": first["adapter_over_base_pairs"],
        "target": first["target"], "target_met": first["target_met"], "adapters": counts, "spread": spread, "by_adapters": by,
        "cpu_lora_fast": fast, "cpu_lora_native": native, "base_prefilled_tokens": _median(prefilled[0]),
        "requests_per_phase": sum(len(r) for r in reqs), "tokens_per_phase": base.tokens // max(args.repeats, 1),
        "repeats": args.repeats, "concurrency": args.concurrency, "model": model,
    }
    if merge_ms:
        out["merge_engine_ms_p50"] = round(statistics.median(merge_ms), 3)
    return out


def _median(xs: list[float]) -> float | None:
    """The median of ``xs``; None where the engine reported no counter (NaN) or nothing was measured."""
    xs = [x for x in xs if x == x]
    return round(statistics.median(xs), 1) if xs else None


async def prefilled_tokens(url: str) -> float:
    """The prompt tokens the engine at ``url`` has prefilled so far: its ``prompt_tokens`` less those it found in
    its prefix cache (vLLM's ``/metrics``); NaN where it does not say."""
    import httpx

    from agentrl.tools.bench.routing import metric_total

    try:
        async with httpx.AsyncClient(timeout=30.0) as http:
            r = await http.get(f"{url}/metrics")
    except httpx.HTTPError:
        return float("nan")
    prompt = metric_total(r.text, "vllm:prompt_tokens_total") if r.status_code == 200 else None
    cached = metric_total(r.text, "vllm:prompt_tokens_cached_total") if r.status_code == 200 else None
    return float("nan") if prompt is None or cached is None else prompt - cached


def print_result(res: dict[str, Any]) -> None:
    """The human-readable line."""
    fast = {None: "", 1.0: ", CPU fast path on", 0.0: ", vLLM's own CPU LoRA ops"}.get(res.get("cpu_lora_fast"), "")
    if res.get("cpu_lora_fast") == 1.0:
        fast += {1.0: " (several slots: agentrl's kernel)", 0.0: " (several slots: torch ops)"}.get(
            res.get("cpu_lora_native"), "")
    for n, row in res.get("by_adapters", {"1": res}).items():
        print(f"{res['adapter']} adapter x{n} (rank {res['adapter_rank']}, every linear layer{fast}): "
              f"{row['adapter_tokens_per_s']:.0f} tok/s against the base model's {res['base_tokens_per_s']:.0f}: "
              f"adapter/base {row['adapter_over_base']:.3f} (median of {res['repeats']} pairs; target ≥ "
              f"{row['target']})"
              + (f", merge {res['merge_engine_ms_p50']:.1f} ms in the engine" if "merge_engine_ms_p50" in res else "")
              + (f"; prompt tokens prefilled a phase: {row['prefilled_tokens']:.0f} against the base's "
                 f"{res['base_prefilled_tokens']:.0f}" if row.get("prefilled_tokens") is not None
                 and res.get("base_prefilled_tokens") is not None else ""))
