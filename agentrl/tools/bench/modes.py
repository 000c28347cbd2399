"""``agentrl bench modes``: the same training run in sync and in async mode, side by side.

Both runs use the environment's preset (the embedded tiny model on ``calc`` by default) with the same
seed, steps and batch; only ``mode`` differs. Each starts its own inference server and trainer. The
held-out success is evaluated before and after training (``--eval-every 0``: no evaluation competes with
the async producer mid-run); the rollout reward of both runs is plotted against training wall time
(evaluations excluded) in one PNG. The last output line is one JSON object.

    agentrl bench modes --env calc --steps 30 --eta 1 --out runs/modes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from agentrl.orchestrator.metrics import plot_curves, read_jsonl


def _summary(run_dir: Path) -> dict[str, Any]:
    recs = read_jsonl(run_dir / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    wall = sum(r["step_s"] for r in train)  # the training loop, without start-up and evaluations
    busy = sum(r["train_s"] for r in train)
    return {
        "steps": len(train), "wall_train_s": wall, "model_tokens_per_s": sum(r["model_tokens"] for r in train) / max(wall, 1e-9),
        "success_first": evals[0]["success"] if evals else None,
        "success_last": evals[-1]["success"] if evals else None,
        "trainer_idle": 1.0 - busy / wall if wall else None,
        "inference_idle": (sum(r["inference_idle_frac"] * r["step_s"] for r in train) / wall) if wall else None,
        "max_staleness": max((r["staleness_max"] for r in train), default=0),
        "interrupted_groups": train[-1]["interrupted_groups_total"] if train else 0,
        "mixed_version_episodes": sum(r["mixed_version_episodes"] for r in train),
    }


def _curve(run_dir: Path, window: int = 5) -> list[tuple[float, float]]:
    """(training wall seconds, rollout reward averaged over the last ``window`` steps) per step."""
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    out, wall = [], 0.0
    for i, r in enumerate(train):
        wall += r["step_s"]
        last = train[max(0, i - window + 1):i + 1]
        out.append((wall, sum(x["reward_mean"] for x in last) / len(last)))
    return out


async def run_modes(env: str, steps: int, eta: int, out: Path, eval_every: int, eval_size: int,
                    extra: dict[str, Any]) -> dict[str, Any]:
    from agentrl.config.run import load_config
    from agentrl.orchestrator.run import TrainingRun

    for mode in ("sync", "async"):
        overrides = {"env": env, "name": mode, "output_dir": str(out), "steps": steps, "mode": mode,
                     "eval_every": eval_every, "eval_size": eval_size, "checkpoint_every": 0,
                     "time_limit_min": None, "pipeline": {"max_staleness": eta if mode == "async" else 0},
                     **extra}
        await TrainingRun(load_config(None, overrides)).run()
    return compare(env, steps, eta, out)


def compare(env: str, steps: int, eta: int, out: Path) -> dict[str, Any]:
    """Summaries of ``out/sync`` and ``out/async`` and their plot (``--report-only`` redoes just this)."""
    res: dict[str, Any] = {"env": env, "steps": steps, "eta": eta}
    for mode in ("sync", "async"):
        res[mode] = _summary(out / mode)
    s, a = res["sync"], res["async"]
    res["async_over_sync_speed"] = s["wall_train_s"] / max(a["wall_train_s"], 1e-9)
    res["success_diff"] = (a["success_last"] or 0.0) - (s["success_last"] or 0.0)
    res["plot"] = str(plot_curves(
        {f"sync: {s['wall_train_s']:.0f} s, held-out {s['success_first']} → {s['success_last']}": _curve(out / "sync"),
         f"async η={eta}: {a['wall_train_s']:.0f} s, held-out {a['success_first']} → {a['success_last']}":
         _curve(out / "async")},
        out / "sync_vs_async.png", title=f"{env}: rollout reward vs training wall time ({steps} steps each)",
        xlabel="training wall time (s, evaluations excluded)", ylabel="rollout reward (5-step mean)"))
    return res


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="agentrl bench modes", description=__doc__.split("\n")[0])
    ap.add_argument("--env", default="calc")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eta", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=0)
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", type=Path, default=None,
                    help="parent of the sync/ and async/ run directories (default: a new runs/modes-<time>)")
    ap.add_argument("--inference-cores", default=None, help="CPU: pin the vLLM server to these cores (e.g. 0)")
    ap.add_argument("--trainer-cores", default=None, help="CPU: pin the trainer to these cores (e.g. 1)")
    ap.add_argument("--report-only", action="store_true", help="summarise and plot existing runs in --out")
    args = ap.parse_args(argv)
    if args.out is None:
        if args.report_only:
            ap.error("--report-only needs the --out of the runs to report on")
        args.out = Path("runs") / time.strftime("modes-%Y%m%d-%H%M%S")
    extra: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.inference_cores:
        extra["inference"] = {"cpu_cores": args.inference_cores}
    if args.trainer_cores:
        extra["trainer"] = {"cpu_cores": args.trainer_cores}
    if args.report_only:
        r = compare(args.env, args.steps, args.eta, args.out)
    else:
        r = asyncio.run(run_modes(args.env, args.steps, args.eta, args.out, args.eval_every, args.eval_size, extra))
    for mode in ("sync", "async"):
        m = r[mode]
        print(f"{mode:6s} {m['steps']} steps in {m['wall_train_s']:.0f}s, {m['model_tokens_per_s']:.0f} tok/s, success {m['success_first']} -> "
              f"{m['success_last']}, trainer idle {m['trainer_idle']:.2f}, max staleness {m['max_staleness']}")
    print(json.dumps(r))
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
