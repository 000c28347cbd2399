"""``agentrl bench pipeline``: sync vs async RL on one PolyTrace-shaped trace, simulated.

The same seeded trace (``agentrl.tools.bench.traces``) is replayed through the discrete-event simulator
(``agentrl.tools.bench.sim``) twice: synchronously (generate a batch, wait for its slowest group, train,
sync) and asynchronously (producers gated by ``agentrl.orchestrator.buffer.BufferCore``: staleness ≤ η at
admission, bounded capacity, partial rollouts across weight updates, old tokens masked). With no flags the async
run uses exactly the buffer rules of ``agentrl train --mode async``, and the output names them. Both runs train the same number of steps of
``groups_per_step`` groups; throughput counts trained tokens (dropped stale groups are wasted work).

    agentrl bench pipeline --mix tool --steps 30 --out runs/bench

prints a table and, as its last line, one JSON object. ``--real`` replays the trace on real vLLM and
torchrun instead (``agentrl.tools.bench.pipeline_real``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from agentrl.config.run import ASYNC_MAX_STALENESS, PipelineConfig
from agentrl.tools.bench.sim import PipelineSim, SimParams, SimResult
from agentrl.tools.bench.traces import MIXES, make_trace, mix_spec


def summarize(res: SimResult, slots: int, eta: int | None = None) -> dict[str, Any]:
    """Headline figures of one replay (``eta``: the bound that ``tokens_beyond_eta_frac`` is counted past)."""
    total = max(res.total_s, 1e-9)
    aged = sum(res.token_ages.values())
    token_ages = {k: round(v / aged, 4) for k, v in sorted(res.token_ages.items())} if aged else {}
    step_s = [b - a for a, b in zip([0.0, *res.step_ends_s], res.step_ends_s, strict=False)]
    generated = max(res.dropped_output_tokens + res.capped_output_tokens + res.trained_output_tokens, 1e-9)
    return {
        "total_s": round(res.total_s, 3),
        "steps": res.steps,
        "trained_groups": res.trained_groups,
        "trained_tokens": res.trained_tokens,
        "tokens_per_s": res.trained_tokens / total,
        "groups_per_s": res.trained_groups / total,
        "trainer_idle": 1.0 - res.train_s / total,
        "inference_idle": 1.0 - res.slot_s / (slots * total),
        "decoded_tokens": round(res.decoded_tokens),
        "step_s_min": min(step_s, default=0.0),
        "step_s_max": max(step_s, default=0.0),
        "staleness_hist": dict(sorted(res.staleness_hist.items())),
        "max_staleness_seen": max(res.staleness_hist, default=0),
        "dropped_stale": res.buffer.get("dropped_stale", 0),
        "dropped_capacity": res.buffer.get("dropped_capacity", 0),
        "dropped_token_frac": (res.dropped_output_tokens + res.capped_output_tokens) / generated,
        "age_capped_token_frac": res.capped_output_tokens / generated,
        "trained_token_staleness": token_ages,
        "tokens_beyond_eta_frac": round(sum(v for k, v in token_ages.items() if k > (eta or 0)), 4),
        "trace_exhausted": res.trace_exhausted,
    }


def run_pipeline_bench(
    mix: str = "tool",
    steps: int = 30,
    eta: int | None = None,
    seed: int = 0,
    *,
    groups_per_step: int | None = None,
    group_size: int = 8,
    capacity_groups: int | None = None,
    drop_policy: Literal["accept", "drop_stale", "block"] | None = None,
    staleness_from: Literal["oldest", "newest"] | None = None,
    max_token_age: int | None = None,
    params: SimParams | None = None,
    dispatch: Literal["requests", "tokens"] = "requests",
    tail: Literal["lognormal", "pareto"] | None = None,
    sigma: float | None = None,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    """Replay one trace in sync and async mode; returns both summaries and the headline ratios.

    ``groups_per_step`` defaults to ``slots // group_size`` (a sync batch fills the engine once); the buffer
    rules left None (η, ``capacity_groups``, ``drop_policy``, ``staleness_from``, ``max_token_age``) to what
    training uses (:meth:`PipelineConfig.for_async`).
    ``dispatch`` is the inference client's rule for an episode's engine when ``params.engines`` > 1.
    With ``out_dir``, a timeline/utilisation PNG is written there.
    """
    p = params or SimParams()
    spec = mix_spec(mix, tail=tail, sigma=sigma)
    groups_per_step = groups_per_step or max(1, p.slots // group_size)
    pipe = PipelineConfig.for_async(eta, capacity_groups=capacity_groups, drop_policy=drop_policy,
                                    staleness_from=staleness_from, max_token_age=max_token_age)
    eta = pipe.max_staleness
    assert eta is not None
    # async may need groups beyond `steps` batches: replacements for dropped groups, plus the lookahead
    trace = make_trace(spec, 2 * steps + eta + 2, groups_per_step, group_size, seed)
    res_sync = PipelineSim(trace, p, "sync", steps, dispatch=dispatch).run()
    res_async = PipelineSim(trace, p, "async", steps, pipe, dispatch=dispatch).run()
    s, a = summarize(res_sync, p.slots, 0), summarize(res_async, p.slots, eta)
    out: dict[str, Any] = {
        "mix": mix, "seed": seed, "eta": eta, "steps": steps, "drop_policy": pipe.drop_policy,
        "staleness_from": pipe.staleness_from, "max_token_age": pipe.token_age_cap(),
        "engines": p.engines, "dispatch": dispatch,
        "groups_per_step": groups_per_step, "group_size": group_size,
        "capacity_groups": pipe.capacity(groups_per_step),
        "async_over_sync": a["tokens_per_s"] / max(s["tokens_per_s"], 1e-12),
        "trainer_idle_sync": s["trainer_idle"], "trainer_idle_async": a["trainer_idle"],
        "inference_idle_sync": s["inference_idle"], "inference_idle_async": a["inference_idle"],
        "max_staleness_seen": a["max_staleness_seen"], "staleness_hist": a["staleness_hist"],
        "dropped_groups": a["dropped_stale"] + a["dropped_capacity"],
        "dropped_token_frac": a["dropped_token_frac"], "age_capped_token_frac": a["age_capped_token_frac"],
        "trained_token_staleness": a["trained_token_staleness"],
        "tokens_beyond_eta_frac": a["tokens_beyond_eta_frac"],
        "sync": s, "async": a, "params": asdict(p), "trace": asdict(spec),
    }
    if out_dir is not None:
        out["plot"] = str(plot_timelines(res_sync, res_async, p.slots, out, Path(out_dir)))
    return out


def elastic_split(mix: str, total_gpus: int, eta: int | None, seed: int, *, groups_per_step: int,
                  group_size: int = 8, drop_policy: Literal["accept", "drop_stale", "block"] | None = None,
                  staleness_from: Literal["oldest", "newest"] | None = None, max_token_age: int | None = None,
                  capacity_groups: int | None = None, probe_steps: int = 10,
                  **overrides: Any) -> tuple[int, dict[int, float]]:
    """The inference share of ``total_gpus`` that gives async training the most trained tokens/s.

    Each split from 1 to ``total_gpus - 1`` inference GPUs is replayed for ``probe_steps`` async steps of
    the same trace, batch (``groups_per_step`` fixed, so only the hardware changes) and buffer rules as the
    run it is for; returns the best
    inference GPU count and the probed tokens/s per count.
    """
    spec = mix_spec(mix)
    pipe = PipelineConfig.for_async(eta, capacity_groups=capacity_groups, drop_policy=drop_policy,
                                    staleness_from=staleness_from, max_token_age=max_token_age)
    trace = make_trace(spec, 2 * probe_steps + (pipe.max_staleness or 0) + 2, groups_per_step, group_size, seed)
    rates: dict[int, float] = {}
    for n_inf in range(1, total_gpus):
        p = SimParams.for_gpus(n_inf, total_gpus - n_inf, **overrides)
        res = PipelineSim(trace, p, "async", probe_steps, pipe).run()
        rates[n_inf] = res.trained_tokens / max(res.total_s, 1e-9)
    return max(rates, key=lambda n: rates[n]), rates


def plot_timelines(res_sync: SimResult, res_async: SimResult, slots: int, summary: dict[str, Any],
                   out_dir: Path) -> Path:
    """PNG: inference slot occupancy and trainer activity over time for both modes, plus staleness."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"pipeline_{summary['mix']}_eta{summary['eta']}_seed{summary['seed']}.png"
    fig, axes = plt.subplots(3, 1, figsize=(12, 9), gridspec_kw={"height_ratios": [3, 3, 2]})
    t_max = max(res_sync.total_s, res_async.total_s)
    for ax, res in zip(axes[:2], (res_sync, res_async), strict=True):
        ts = [t for t, _ in res.slots_timeline] + [res.total_s]
        used = [u / slots for _, u in res.slots_timeline] + [res.slots_timeline[-1][1] / slots]
        ax.step(ts, used, where="post", lw=0.6, color="tab:blue", label="inference slots in use")
        ax.broken_barh([(a, b - a) for a, b in res.train_iv], (1.05, 0.12), color="tab:green", label="train")
        ax.broken_barh([(a, b - a) for a, b in res.sync_iv], (1.05, 0.12), color="tab:red", label="weight sync")
        ax.set_xlim(0, t_max)
        ax.set_ylim(0, 1.25)
        ax.set_ylabel("slot occupancy")
        tps = res.trained_tokens / max(res.total_s, 1e-9)
        ax.set_title(f"{res.mode}: {res.steps} steps in {res.total_s:.0f} s, {tps:.0f} trained tok/s")
        ax.legend(loc="lower right", fontsize=8)
    axes[1].set_xlabel("virtual time (s)")
    ages, cap = summary["trained_token_staleness"], summary["max_token_age"]
    axes[2].bar([str(k) for k in ages], list(ages.values()),
                color=["tab:purple" if int(k) <= cap else "tab:gray" for k in ages])
    axes[2].set_xlabel(f"age of generated tokens when trained (versions), η={summary['eta']}; "
                       f"gray: past max_token_age={cap}, masked out of the loss")
    axes[2].set_ylabel("share of tokens")
    fig.suptitle(f"mix={summary['mix']}  policy={summary['drop_policy']}  "
                 f"async/sync={summary['async_over_sync']:.2f}x  dropped tokens={summary['dropped_token_frac']:.1%}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def format_table(r: dict[str, Any]) -> str:
    """Human-readable comparison of the two modes."""
    rows = [("mode", "total_s", "tok/s", "groups/s", "trainer_idle", "infer_idle", "step_s min..max",
             "max_stale", "dropped")]
    for mode in ("sync", "async"):
        m = r[mode]
        rows.append((mode, f"{m['total_s']:.0f}", f"{m['tokens_per_s']:.0f}", f"{m['groups_per_s']:.3f}",
                     f"{m['trainer_idle']:.3f}", f"{m['inference_idle']:.3f}",
                     f"{m['step_s_min']:.0f}..{m['step_s_max']:.0f}", str(m["max_staleness_seen"]),
                     str(m["dropped_stale"] + m["dropped_capacity"])))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.append(f"mix={r['mix']} eta={r['eta']} seed={r['seed']} policy={r['drop_policy']} "
                 f"max_token_age={r['max_token_age']}  async_over_sync={r['async_over_sync']:.2f}x  "
                 f"dropped_token_frac={r['dropped_token_frac']:.3f}  staleness={r['staleness_hist']}")
    lines.append("token ages: " + "  ".join(f"{k}: {v:.3f}" for k, v in r["trained_token_staleness"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """CLI: run one benchmark, print a table, then the summary JSON as the last line."""
    if argv is not None and "--real" in argv:  # measured on real vLLM and torchrun, not simulated
        from agentrl.tools.bench.pipeline_real import main as real_main

        return real_main(argv)
    ap = argparse.ArgumentParser(prog="agentrl bench pipeline", description=__doc__.split("\n")[0])
    ap.add_argument("--mix", choices=sorted(MIXES), default="tool")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--eta", type=int, default=None,
                    help=f"max staleness η (versions; default {ASYNC_MAX_STALENESS}, an async run's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups-per-step", type=int, default=None, help="default: slots / group size")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--capacity", type=int, default=None, help="pipeline.capacity_groups (default: a run's, "
                    "η + 1 batches)")
    ap.add_argument("--policy", choices=["accept", "drop_stale", "block"], default=None,
                    help="pipeline.drop_policy (default: a run's, accept)")
    ap.add_argument("--max-token-age", type=int, default=None,
                    help="pipeline.max_token_age: older tokens are masked out of the loss (default: a run's, η + 2)")
    ap.add_argument("--staleness-from", choices=["oldest", "newest"], default=None,
                    help="pipeline.staleness_from: measure a group's staleness from its oldest or newest token "
                         "(default: a run's, oldest)")
    ap.add_argument("--tail", choices=["lognormal", "pareto"], default=None)
    ap.add_argument("--sigma", type=float, default=None, help="lognormal σ of output lengths")
    ap.add_argument("--gpus", default="8:8",
                    help="inference:trainer H100s (default 8:8), or auto[:N]: the split of N (default 16) with "
                         "the most async trained tokens/s in a 10-step probe of each split")
    ap.add_argument("--engines", type=int, default=1,
                    help="inference engines the slots are split over (default 1: one pooled engine, i.e. perfect "
                         "balance; N: N replicas, an episode's turns on the engine its first turn was sent to)")
    ap.add_argument("--dispatch", choices=["requests", "tokens"], default="requests",
                    help="with --engines > 1, the client's rule for a new episode's engine: least outstanding "
                         "requests (what training uses) or least outstanding tokens (prompt + max_tokens each)")
    ap.add_argument("--kv-tokens-per-gpu", type=int, default=0,
                    help="KV-cache tokens per inference GPU (0, default: unlimited; ~470000 for a 7B model on an "
                         "H100): a request holds its context plus output in it while it runs")
    ap.add_argument("--sync-s", type=float, default=None,
                    help="weight publication time (default: the measured LoRA sync, see SimParams.sync_s)")
    ap.add_argument("--out", type=Path, default=None, help="directory for the timeline PNG")
    ap.add_argument("--real", action="store_true",
                    help="replay the trace on a real vLLM server and torchrun trainer instead (see "
                         "`agentrl bench pipeline --real --help` for its options: --model, --endpoint, --max-len, "
                         "--token-scale, --time-scale, --inference-cores, --trainer-cores)")
    args = ap.parse_args(argv)
    overrides: dict[str, Any] = {"engines": args.engines, "kv_tokens_per_gpu": args.kv_tokens_per_gpu}
    if args.sync_s is not None:
        overrides["sync_s"] = args.sync_s
    probe: dict[int, float] | None = None
    if args.gpus.startswith("auto"):
        total = int(args.gpus.split(":")[1]) if ":" in args.gpus else 16
        if total < 2:
            ap.error(f"--gpus {args.gpus}: at least 2 GPUs are needed to split")
        gps = args.groups_per_step or max(1, 64 * total // 2 // args.group_size)
        n_inf, probe = elastic_split(args.mix, total, args.eta, args.seed, groups_per_step=gps,
                                     group_size=args.group_size, drop_policy=args.policy,
                                     staleness_from=args.staleness_from, max_token_age=args.max_token_age,
                                     capacity_groups=args.capacity, **overrides)
        n_train = total - n_inf
        args.groups_per_step = gps
    else:
        n_inf, n_train = (int(x) for x in args.gpus.split(":"))
    params = SimParams.for_gpus(n_inf, n_train, **overrides)
    r = run_pipeline_bench(args.mix, args.steps, args.eta, args.seed, groups_per_step=args.groups_per_step,
                           group_size=args.group_size, capacity_groups=args.capacity, drop_policy=args.policy,
                           staleness_from=args.staleness_from, max_token_age=args.max_token_age, params=params,
                           dispatch=args.dispatch, tail=args.tail,
                           sigma=args.sigma, out_dir=args.out)
    print(format_table(r))
    headline = {k: v for k, v in r.items() if k not in ("sync", "async", "params", "trace")}
    headline["gpus"] = f"{n_inf}:{n_train}"
    if probe is not None:
        headline["split_probe_tokens_per_s"] = {str(k): round(v) for k, v in probe.items()}
    print(json.dumps(headline))
    return r


if __name__ == "__main__":
    main(sys.argv[1:])
