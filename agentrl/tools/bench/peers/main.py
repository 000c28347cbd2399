"""``agentrl bench peers``: agentrl and TRL's GRPO on the same environment, model and budget, in one table.

    agentrl bench peers --framework trl --steps 20 --seeds 3 --json

Each seed trains the model (default: the embedded tiny model) on ``calc`` with agentrl and with TRL
(:mod:`agentrl.tools.bench.peers.run`), from the same agentrl run config (the calc preset with the flags
below; the peer's settings are mapped from it, :mod:`agentrl.tools.bench.peers.settings`), and agentrl's
evaluator scores the base and both final models on the same held-out tasks. TRL is installed into a
directory of its own (:mod:`agentrl.tools.bench.peers.install`); where it cannot be, the benchmark stops with
one sentence.

The last line is one JSON object: ``time_ratio`` (agentrl's training-loop seconds per 1,000 episodes over
TRL's), each framework's figures (seconds per 1,000 episodes, generation and trainer tokens/s, held-out
success before and after, the gain and its standard error), the per-seed figures, the settings both ran
and the differences that could not be removed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    from agentrl.config.run import load_config
    from agentrl.environment.registry import load_env
    from agentrl.tools.bench.engine import bench_model
    from agentrl.tools.bench.peers.install import ensure_trl
    from agentrl.tools.bench.peers.report import summarize, table
    from agentrl.tools.bench.peers.run import run_seed
    from agentrl.tools.bench.peers.settings import (
        TRL_VERSION,
        agentrl_overrides,
        trl_config,
        trl_differences,
        trl_peft,
    )

    trl_path = ensure_trl(TRL_VERSION)
    model = asyncio.run(bench_model(args.model))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    seeds, cfg = [], None
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        cfg = load_config(None, agentrl_overrides(
            model=str(model), steps=args.steps, tasks_per_step=args.tasks_per_step, group_size=args.group_size,
            seed=seed, output_dir=str(args.work), name=f"peers-{stamp}-seed{seed}", mode=args.mode,
            weights=args.weights)).resolved()
        print(f"seed {seed}: agentrl ({args.mode}) and TRL, {args.steps} steps of {args.tasks_per_step} x "
              f"{args.group_size}, {args.weights} weights",
              file=sys.stderr, flush=True)
        seeds.append(run_seed(cfg, trl_path, generation=args.trl_generation, eval_n=args.eval_n,
                              peer_first=seed % 2 == 1, timeout_s=args.timeout_min * 60))
        # each seed's figures as soon as it ends: a later seed that fails loses nothing of this one
        (cfg.run_dir.parent / f"{cfg.name}-work" / "seed.json").write_text(json.dumps(seeds[-1]))
    assert cfg is not None
    env_cls = load_env(cfg.env)
    summary = summarize(seeds)
    generation = seeds[0]["trl"]["generation"]
    mapped = trl_config(cfg, env_cls, out_dir="<run>", generation=args.trl_generation)
    mapped.pop("seed")
    same_prompts = all(s["trl"]["same_prompt_ids"] for s in seeds)
    return {
        "time_ratio": round(summary["time_ratio"], 4),
        "agentrl_gain": round(summary["agentrl"]["gain"], 4), "agentrl_gain_se": round(summary["agentrl"]["gain_se"], 4),
        "trl_gain": round(summary["trl"]["gain"], 4), "trl_gain_se": round(summary["trl"]["gain_se"], 4),
        "target_time_ratio": 0.5, "target_met": bool(summary["time_ratio"] <= 0.5 and summary["gain_difference"]
                                                      >= -2 * summary["gain_difference_se"]),
        **summary, "table": table(summary, generation, cfg.mode),
        "peer": {"framework": "trl", "version": seeds[0]["trl"].get("trl_version", TRL_VERSION),
                 "generation": generation},
        "agentrl_mode": cfg.mode, "agentrl_max_staleness": cfg.pipeline.max_staleness,  # sync resolves to 0
        "model": str(model), "env": cfg.env, "steps": args.steps, "tasks_per_step": args.tasks_per_step,
        "group_size": args.group_size, "seeds": [s["seed"] for s in seeds], "eval_n": args.eval_n,
        "weights": args.weights, "lr": cfg.trainer.lr, "trl_settings": mapped, "trl_peft": trl_peft(cfg),
        "differences": trl_differences(cfg, env_cls, args.trl_generation) + (
            [] if same_prompts else
            ["The prompts differ: TRL's rendering of the first tasks' prompts is not agentrl's token for token."]),
        "same_prompt_ids": same_prompts,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("trl",), default="trl", help="the peer to run beside agentrl")
    parser.add_argument("--model", default=None, help="model directory (default: the embedded tiny model)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per run")
    parser.add_argument("--tasks-per-step", type=int, default=16, help="tasks per step (GRPO groups)")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    parser.add_argument("--seeds", type=int, default=1, help="seeds to run (each: both frameworks, then the evaluations)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (then +1 for each further seed)")
    parser.add_argument("--trl-generation", choices=("generate", "vllm"), default="generate",
                        help="TRL's generation: transformers generate, or its colocated vLLM engine")
    parser.add_argument("--mode", choices=("sync", "async"), default="sync",
                        help="agentrl's mode: sync (the training default) or async (generation overlaps training)")
    parser.add_argument("--weights", choices=("full", "lora"), default="full",
                        help="what both train: every weight, or the same LoRA adapter (every linear layer, peft)")
    parser.add_argument("--eval-n", type=int, default=200, help="held-out tasks per evaluation")
    parser.add_argument("--work", type=Path, default=Path("runs/bench-peers"), help="where the runs are written")
    parser.add_argument("--timeout-min", type=float, default=60.0, help="limit on each framework's training run")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if min(args.steps, args.tasks_per_step, args.group_size, args.seeds, args.eval_n) < 1:
        parser.error("--steps, --tasks-per-step, --group-size, --seeds and --eval-n must be at least 1")
    if args.group_size < 2:
        parser.error("--group-size must be at least 2 (GRPO's advantages are relative to the group)")
    from agentrl.tools.bench.errors import BenchArgumentError, BenchFailed, BenchUnavailable

    try:
        res = measure(args)
    except (BenchUnavailable, BenchArgumentError) as e:
        print(f"agentrl bench peers: {e}", file=sys.stderr)
        return 2
    except BenchFailed as e:  # a framework's run failed: its log's tail and path, no traceback
        print(f"agentrl bench peers: {e}", file=sys.stderr)
        return 1
    if not args.json:
        print(res["table"])
        print(f"time_ratio (agentrl / TRL, seconds per 1,000 episodes): {res['time_ratio']:.3f}; held-out gain "
              f"agentrl {res['agentrl_gain']:+.3f} ± {res['agentrl_gain_se']:.3f}, TRL {res['trl_gain']:+.3f} ± "
              f"{res['trl_gain_se']:.3f}")
        for line in res["differences"]:
            print(f"- {line}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
