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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

from agentrl.tools.bench.engine import bench_model, engine_url, scratch_dir
from agentrl.tools.bench.phases import PhaseResult, run_loop_phase, run_raw_phase

NAME = "bench-adapter"
TARGET = 0.9


class _Adapter:
    """The adapter's tensors and files, as the trainer hands them out (the publisher asks for both)."""

    def __init__(self, tensors: dict[str, Any], rank: int) -> None:
        self.tensors, self.rank = tensors, rank

    async def get_adapter_tensors(self) -> dict[str, Any]:
        return self.tensors

    async def save_adapter(self, path: Path) -> dict[str, Any]:
        from agentrl.tools.bench.models import save_lora

        save_lora(path, self.tensors, rank=self.rank, alpha=2 * self.rank)
        return {"path": str(path)}


async def measure_adapter(args: argparse.Namespace) -> dict[str, Any]:
    """Start (or connect to) the engine, record the work, then alternate base and adapter phases."""
    from agentrl.config.inference import engine_lora_rank
    from agentrl.config.run import SamplingConfig
    from agentrl.config.trainer import ALL_LINEAR
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.tools.bench.models import lora_shapes, random_lora
    from agentrl.weight_sync.merged import MergedAdapterSync

    model = await bench_model(args.model)
    merged = args.adapter == "merged"
    config = json.loads((Path(model) / "config.json").read_text())
    adapter = _Adapter(random_lora(lora_shapes(config, args.adapter_rank, ALL_LINEAR), seed=0), args.adapter_rank)
    zero = _Adapter({n: t * 0 for n, t in adapter.tensors.items()}, args.adapter_rank)
    sampling = SamplingConfig(temperature=args.temperature, max_context_tokens=1024)
    base, with_adapter = PhaseResult(), PhaseResult()
    ratios: list[float] = []
    merge_ms: list[float] = []
    server = {"model": model, "dtype": "float32", "max_model_len": 1024, "enable_lora": not merged}
    if not merged:
        server.update(max_lora_rank=engine_lora_rank(args.adapter_rank), max_loras=1)
    with scratch_dir("agentrl-bench-adapter-") as work:
        async with engine_url(args.endpoint, work, **server) as url:
            chat = await asyncio.to_thread(load_chat_format, model, "hermes", args.chat_template)
            chat.parser  # noqa: B018  (build the tool parser, and import vLLM, before anything is timed)
            async with InferenceClient([url], timeout_s=600) as client:
                tasks = list(CalcEnv.tasks("train"))[: args.tasks]
                _, reqs = await run_loop_phase(CalcEnv, tasks, args.group_size, client, chat, sampling,
                                               args.concurrency, 10**6)
                if not merged:
                    await adapter.save_adapter(work / NAME)
                    await client.load_lora_adapter(NAME, str(work / NAME))

                async def switch(to: _Adapter) -> None:
                    if merged:
                        with MergedAdapterSync(to, client) as sync:
                            merge_ms.append(float((await sync.publish(1))["engine_ms"]))

                for rep in range(-1, args.repeats):  # -1: a warm-up pair, not measured
                    await switch(zero)
                    b = await run_raw_phase(reqs, client, sampling, args.concurrency, f"bench-base-{rep}")
                    await switch(adapter)
                    a = await run_raw_phase(reqs, client, sampling, args.concurrency, f"bench-adapter-{rep}",
                                            model=None if merged else NAME)
                    if rep >= 0:
                        base.add(b)
                        with_adapter.add(a)
                        ratios.append((a.tokens / a.wall_s) / max(b.tokens / b.wall_s, 1e-9))
                if merged:  # an engine of --endpoint is left with its base weights
                    await switch(zero)
                else:
                    await client.unload_lora_adapter(NAME)
    ratio = statistics.median(ratios)
    out: dict[str, Any] = {
        "adapter": args.adapter, "adapter_rank": args.adapter_rank, "adapter_targets": list(ALL_LINEAR),
        "base_tokens_per_s": round(base.tokens / max(base.wall_s, 1e-9), 1),
        "adapter_tokens_per_s": round(with_adapter.tokens / max(with_adapter.wall_s, 1e-9), 1),
        "adapter_over_base": round(ratio, 4), "adapter_over_base_pairs": [round(r, 4) for r in ratios],
        "target": TARGET, "target_met": bool(ratio >= TARGET),
        "requests_per_phase": sum(len(r) for r in reqs), "tokens_per_phase": base.tokens // max(args.repeats, 1),
        "repeats": args.repeats, "concurrency": args.concurrency, "model": model,
    }
    if merge_ms:
        out["merge_engine_ms_p50"] = round(statistics.median(merge_ms), 3)
    return out


def print_result(res: dict[str, Any]) -> None:
    """The human-readable line."""
    print(f"{res['adapter']} adapter (rank {res['adapter_rank']}, every linear layer): "
          f"{res['adapter_tokens_per_s']:.0f} tok/s against the base model's {res['base_tokens_per_s']:.0f}: "
          f"adapter/base {res['adapter_over_base']:.3f} (median of {res['repeats']} pairs; target ≥ {TARGET})"
          + (f", merge {res['merge_engine_ms_p50']:.1f} ms in the engine" if "merge_engine_ms_p50" in res else ""))
