"""``agentrl bench loop``: does the agent loop keep up with the engine?

The same work is driven twice against the same vLLM server (started on the embedded tiny model, or
``--endpoint``):

- **loop**: ``--tasks`` calc tasks × ``--group-size`` episodes through the agent loop
  (:class:`agentrl.rollout.groups.RolloutWorkers`, the path training uses: chat template, tool-call parsing, tools,
  observation deltas), at most ``--concurrency`` episodes in flight (the defaults are the calc preset's
  step: 16 × 8 episodes, 128 in flight);
- **raw**: the requests those episodes made, replayed as bare generation requests: per episode, turn after
  turn, the same prompt token ids and the same number of output tokens (``ignore_eos``), at the same
  concurrency, with nothing between the turns.

Each phase uses its own prefix-cache salt, so neither reuses the other's KV blocks (within a phase, a turn
reuses its episode's earlier turns as it does in training). ``--repeats`` alternates the two phases
(loop, raw, loop, raw, ...), each pair on new tasks, after one unmeasured warm-up pair. Each phase's rate
is its model tokens over its wall time; ``loop_over_raw`` is the median over the pairs of the loop's rate
over the raw rate (on a shared machine a burst of other work lands on one phase of one pair; the median
ignores it), ``loop_over_raw_total`` the ratio of the rates summed over every pair. ``*_client_cpu_s`` is the CPU time of this process during the phase
(the client's own cost: on a shared machine it is taken from the engine). ``--profile`` adds the top
functions of the loop phases by cumulative time (cProfile).

The last line is one JSON object: ``loop_tokens_per_s``, ``raw_tokens_per_s``, ``loop_over_raw``
(target ≥ 0.95) and the details. ``--adapter lora|merged`` measures generation with a served adapter against
the base model instead (:mod:`agentrl.tools.bench.adapter_speed`).

    agentrl bench loop --tasks 16 --group-size 8 --concurrency 128 --json
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import pstats
import statistics
import sys
from pathlib import Path
from typing import Any

from agentrl.tools.bench.engine import add_engine_args
from agentrl.tools.bench.phases import PhaseResult, run_loop_phase, run_raw_phase


def _top(profiler: cProfile.Profile, n: int = 25) -> list[dict[str, Any]]:
    """The ``n`` functions with the most cumulative time (own time too)."""
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = []
    for (file, line, fn), (_cc, calls, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({fn})", "calls": calls, "own_s": round(tt, 4),
                     "cumulative_s": round(ct, 4)})
    rows.sort(key=lambda r: -r["cumulative_s"])
    return rows[:n]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start (or connect to) the engine, warm it up, and alternate the loop and raw phases."""
    from agentrl.config.run import SamplingConfig
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.tools.bench.engine import bench_model, engine_url

    model = await bench_model(args.model)
    all_tasks = list(CalcEnv.tasks("train"))
    sampling = SamplingConfig(temperature=args.temperature, max_context_tokens=1024)
    loop, raw = PhaseResult(), PhaseResult()
    ratios: list[float] = []
    profiler = cProfile.Profile() if args.profile else None
    async with engine_url(args.endpoint, model=model, dtype="float32", max_model_len=1024) as url:
        chat = await asyncio.to_thread(load_chat_format, model, "hermes", args.chat_template)
        chat.parser  # noqa: B018  (build the tool parser, and import vLLM, before anything is timed)
        async with InferenceClient([url], timeout_s=600) as client:
            for rep in range(-1, args.repeats):  # -1: the warm-up pair, not measured
                tasks = all_tasks[(rep + 1) * args.tasks:(rep + 2) * args.tasks]
                lres, reqs = await run_loop_phase(CalcEnv, tasks, args.group_size, client, chat, sampling,
                                                  args.concurrency, 10**6 + 1 + rep, profiler if rep >= 0 else None)
                rres = await run_raw_phase(reqs, client, sampling, args.concurrency, f"bench-raw-{rep}")
                if rep >= 0:
                    loop.add(lres)
                    raw.add(rres)
                    ratios.append((lres.tokens / lres.wall_s) / max(rres.tokens / rres.wall_s, 1e-9))
    loop_tps = loop.tokens / max(loop.wall_s, 1e-9)
    raw_tps = raw.tokens / max(raw.wall_s, 1e-9)
    out: dict[str, Any] = {
        "loop_tokens_per_s": round(loop_tps, 1), "raw_tokens_per_s": round(raw_tps, 1),
        "loop_over_raw": round(statistics.median(ratios), 4),
        "loop_over_raw_total": round(loop_tps / max(raw_tps, 1e-9), 4),
        "loop_over_raw_pairs": [round(r, 4) for r in ratios],
        "target": 0.95, "target_met": bool(statistics.median(ratios) >= 0.95),
        "episodes": loop.episodes, "tasks_per_repeat": args.tasks, "group_size": args.group_size,
        "concurrency": args.concurrency, "repeats": args.repeats,
        "requests": loop.requests, "tokens": loop.tokens,
        "mean_output_tokens": round(loop.tokens / max(loop.requests, 1), 2),
        "loop_wall_s": round(loop.wall_s, 3), "raw_wall_s": round(raw.wall_s, 3),
        "loop_client_cpu_s": round(loop.cpu_s, 3), "raw_client_cpu_s": round(raw.cpu_s, 3),
        "loop_client_cpu_ms_per_request": round(1000 * loop.cpu_s / max(loop.requests, 1), 3),
        "raw_client_cpu_ms_per_request": round(1000 * raw.cpu_s / max(raw.requests, 1), 3),
        "failed_episodes": loop.failed, "stop_reasons": loop.stop_reasons,
        "temperature": args.temperature, "model": model,
    }
    if profiler is not None:
        out["profile_top"] = _top(profiler, args.profile)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench loop", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=16, help="calc tasks per phase (new ones each repeat)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per task (a GRPO group)")
    parser.add_argument("--concurrency", type=int, default=128, help="episodes in flight at once (both phases)")
    parser.add_argument("--repeats", type=int, default=5, help="loop/raw pairs measured, alternating")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (both phases)")
    add_engine_args(parser)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="profile the loop phases and report the N functions with the most cumulative time")
    parser.add_argument("--adapter", choices=("lora", "merged"), default=None,
                        help="compare the base model with a served adapter instead (vLLM's LoRA serving, or "
                             "merged into the weights): agentrl.tools.bench.adapter_speed")
    parser.add_argument("--adapter-rank", type=int, default=16, help="--adapter: the adapter's rank")
    parser.add_argument("--adapters", default="1", metavar="N[,N...]",
                        help="--adapter lora: counts of distinct adapters to serve at once, requests spread over "
                             "them in one batch, each count measured against the same base phases (e.g. 1,4,16)")
    parser.add_argument("--spread", choices=("group", "episode"), default="group",
                        help="--adapters: a GRPO group's episodes all name one adapter (group: a group samples one "
                             "policy, and its episodes share their prompt's prefix cache as in the base phase) or "
                             "episode i names adapter i %% N (episode: a group's prompt is prefilled once per adapter, "
                             "since vLLM keys its prefix cache by adapter)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if min(args.tasks, args.group_size, args.concurrency, args.repeats) < 1:
        parser.error("--tasks, --group-size, --concurrency and --repeats must be at least 1")
    if args.tasks * (args.repeats + 1) > 2000:
        parser.error("--tasks × (--repeats + 1) must be at most 2000 (the calc train split; one pair warms up)")
    if args.temperature <= 0:
        parser.error("--temperature must be > 0 (the raw phase replays lengths, not greedy tokens)")
    try:
        args.adapters = [int(n) for n in str(args.adapters).split(",") if n.strip()]
    except ValueError:
        parser.error("--adapters takes counts separated by commas, e.g. 1,4,16")
    if not args.adapters or min(args.adapters) < 1:
        parser.error("--adapters takes counts of at least 1")
    if args.adapters != [1] and args.adapter != "lora":
        parser.error("--adapters needs --adapter lora (a merged engine serves one policy)")
    if args.adapter:
        from agentrl.tools.bench.adapter_speed import measure_adapter, print_result

        res = asyncio.run(measure_adapter(args))
        if not args.json:
            print_result(res)
        print(json.dumps(res))
        return 0
    res = asyncio.run(measure(args))
    if not args.json:
        print(f"loop {res['loop_tokens_per_s']:.0f} tok/s ({res['loop_wall_s']:.2f} s, client CPU "
              f"{res['loop_client_cpu_ms_per_request']:.2f} ms/request), raw {res['raw_tokens_per_s']:.0f} tok/s "
              f"({res['raw_wall_s']:.2f} s, client CPU {res['raw_client_cpu_ms_per_request']:.2f} ms/request): "
              f"loop/raw {res['loop_over_raw']:.3f} (median of pairs; target ≥ 0.95) over {res['requests']} requests of "
              f"{res['mean_output_tokens']:.1f} tokens on average")
        for row in res.get("profile_top", []):
            print(f"  {row['cumulative_s']:8.3f} s cum {row['own_s']:8.3f} s own {row['calls']:8d}  {row['function']}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
