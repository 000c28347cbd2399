"""Trainer throughput on long-tail batches, padded against packed: ``agentrl bench trainer``.

One batch of trajectories whose lengths follow a task mix of :mod:`agentrl.tools.bench.traces` (PolyTrace's
shapes), scaled from the mix's 32k context to the model's, is trained by two real ``torchrun`` trainers of
``--nproc`` ranks, alive side by side and stepped in turn:

- **padded**: today's dealing (``samples[rank::world]``) and longest-first micro-batches, each padded to
  its longest sample (``trainer.packing = false``, ``trainer.balance_ranks = false``);
- **packed**: ranks balanced by compute cost and each rank's share packed into rows of the same
  ``micro_batch_tokens`` budget (the defaults).

``tokens_per_s_*`` are trained tokens (every position of every trajectory) over the median step time.
Both trainers start from the same weights, so their first step's loss must agree (``loss_rel_diff``).
The rank balance is measured by timing each rank's share of the batch alone, on a one-rank packed
trainer (inside a FSDP step a rank's waiting is hidden in the collectives): ``rank_imbalance`` is the
slowest share's time over the mean after balancing, ``rank_imbalance_unbalanced`` with today's dealing;
``rank_cost_imbalance(_unbalanced)`` give the same by the balancer's cost model (no timing noise).
The model is a random Qwen2 whose window holds the mix (``--context``). The budget is by default what a
run's defaults give that window (:func:`default_budget`: ``trainer.micro_batch_tokens`` over
``sampling.max_context_tokens``, twice the window), so several trajectories share a row. Prints one JSON object as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from agentrl.tools.bench.models import SIZES, build_random_qwen2
from agentrl.tools.bench.traces import MIXES, make_trace

MIX_CONTEXT = 32768
"""The context of the mixes' published shapes; lengths are scaled from it to ``--context``."""


def lengths_for(mix: str, n: int, context: int, seed: int = 0) -> list[int]:
    """``n`` trajectory lengths of ``mix`` (groups of 8, step 0), scaled to a ``context``-token window."""
    group = 8
    trace = make_trace(mix, steps=1, groups_per_step=-(-n // group), group_size=group, seed=seed)
    cap = min(MIXES[mix].max_context_tokens, MIX_CONTEXT)
    raw = [min(e.total_tokens, cap) for g in trace.groups for e in g][:n]
    return [max(8, min(context, round(t * context / MIX_CONTEXT))) for t in raw]


def make_samples(lengths: list[int], vocab: int, seed: int = 0) -> list[Any]:
    """Random trajectories of these lengths: the first quarter prompt, the rest trained, each group of 8 with
    advantages of both signs."""
    from agentrl.core.types import TrainSample

    rng = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        prompt = max(1, n // 4)
        mask = [0] * prompt + [1] * (n - prompt)
        out.append(TrainSample(input_ids=[rng.randrange(3, vocab) for _ in range(n)], loss_mask=mask,
                               behav_logprobs=[rng.uniform(-7.0, -5.0) if m else 0.0 for m in mask],
                               advantage=(1.0 if i % 2 else -1.0) * (0.5 + (i % 8) / 8), versions=[0] * n))
    return out


def default_budget(context: int) -> int:
    """The token budget a run's defaults give a ``context``-token window: the window scaled by the defaults'
    ``trainer.micro_batch_tokens / sampling.max_context_tokens`` (4096 / 2048)."""
    from agentrl.config.run import SamplingConfig
    from agentrl.config.trainer import TrainerConfig

    per_window = TrainerConfig.model_fields["micro_batch_tokens"].default
    window = SamplingConfig.model_fields["max_context_tokens"].default
    return context * per_window // window


def padding_frac(lengths: list[int], world: int, budget: int) -> float:
    """The share of padding in the padded trainer's micro-batches (strided ranks, longest-first groups)."""
    from agentrl.trainer.batch import micro_batches
    from agentrl.trainer.packing import strided

    real = padded = 0
    for share in strided(len(lengths), world):
        mine = [lengths[i] for i in share]
        for g in micro_batches(mine, budget):
            padded += max(mine[i] for i in g) * len(g)
            real += sum(mine[i] for i in g)
    return 1.0 - real / max(padded, 1)


def shares(lengths: list[int], ranks: int, model_dir: Path) -> tuple[dict[str, list[list[int]]], dict[str, float]]:
    """Each rank's sample indices, balanced by cost and strided, and each dealing's imbalance by the cost
    model (the most loaded rank's cost over the mean)."""
    from transformers import AutoConfig

    from agentrl.trainer.packing import attention_len, balance, sequence_cost, strided

    alen = attention_len(AutoConfig.from_pretrained(str(model_dir)))
    costs = [sequence_cost(n, alen) for n in lengths]
    parts = {"balanced": balance(costs, ranks), "strided": strided(len(lengths), ranks)}
    modelled = {name: _imbalance([sum(costs[i] for i in share) for share in ranks_])
                for name, ranks_ in parts.items()}
    return parts, modelled


async def _time_steps(trainers: dict[str, Any], batch: list[Any],
                      rounds: int) -> tuple[dict[str, list[float]], dict[str, dict[str, float]]]:
    """Alternate one step of each trainer, ``rounds`` times after a warm-up step each; the step times, and
    the warm-up step's loss and gradient norm (the same weights and batch: packing must not change them)."""
    times: dict[str, list[float]] = {k: [] for k in trainers}
    first = {}
    for k, tp in trainers.items():
        m = await tp.train(batch, policy_version=0)
        first[k] = {"loss": float(m["loss"]), "grad_norm": float(m["grad_norm"])}
    for r in range(rounds):
        for k, tp in trainers.items():
            m = await tp.train(batch, policy_version=r + 1)
            times[k].append(float(m["time_s"]))
    return times, first


async def _time_shares(tp: Any, batch: list[Any], parts: dict[str, list[list[int]]], reps: int) -> dict[str, list[float]]:
    """The median time of training each rank's share alone, for each dealing: after two warm-up steps on the
    largest share (so no share pays for the allocator's first growth), ``reps`` rounds that each time every
    share once, in turn (so a slow spell of the machine falls on all of them)."""
    largest = max((share for ranks in parts.values() for share in ranks),
                  key=lambda share: sum(len(batch[i].input_ids) for i in share))
    for _ in range(2):
        await tp.train([batch[i] for i in largest], policy_version=0)
    times: dict[tuple[str, int], list[float]] = {(name, r): [] for name, ranks in parts.items() for r in range(len(ranks))}
    for _ in range(reps):
        for (name, r), ts in times.items():
            ts.append(float((await tp.train([batch[i] for i in parts[name][r]], policy_version=0))["time_s"]))
    return {name: [statistics.median(times[(name, r)]) for r in range(len(ranks))] for name, ranks in parts.items()}


def _imbalance(times: list[float]) -> float:
    return max(times) / (sum(times) / len(times)) if times else 1.0


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Build the model and batch, run both trainers and the share timings; the JSON-ready result."""
    from agentrl.config.trainer import TrainerConfig
    from agentrl.trainer.client import TrainerProcess

    model_dir = build_random_qwen2(args.model_dir or work / f"model-{args.size}-{args.context}", args.size,
                                   context=args.context)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    lengths = lengths_for(args.mix, args.samples, args.context, seed=args.seed)
    batch = make_samples(lengths, vocab, seed=args.seed)
    budget = args.budget or default_budget(args.context)
    base = {"model_path": str(model_dir), "lr": 1e-6, "micro_batch_tokens": budget, "device": args.device,
            "dtype": args.dtype, "heartbeat_s": 30.0, "gradient_checkpointing": args.gradient_checkpointing}
    threads = max(1, (os.cpu_count() or 1) // args.nproc)
    env = {"OMP_NUM_THREADS": str(threads)}
    configs = {"padded": TrainerConfig(**base, packing=False, balance_ranks=False),
               "packed": TrainerConfig(**base, packing=True, balance_ranks=True)}
    ranks = args.ranks or max(args.nproc, 2)
    parts, modelled = shares(lengths, ranks, model_dir)

    async def run() -> tuple[dict[str, list[float]], dict[str, dict[str, float]], dict[str, list[float]], str]:
        tps = {k: TrainerProcess(c, work / k, nproc=args.nproc, env=env) for k, c in configs.items()}
        try:
            for tp in tps.values():
                tp.start()
            step_times, first = await _time_steps(tps, batch, args.rounds)
            device = str(tps["packed"].info.get("device"))
        finally:
            for tp in tps.values():
                tp.close()
        one = TrainerProcess(configs["packed"], work / "share", nproc=1,
                             env={"OMP_NUM_THREADS": str(os.cpu_count() or 1)})
        try:
            one.start()
            share_times = await _time_shares(one, batch, parts, args.share_reps)
        finally:
            one.close()
        return step_times, first, share_times, device

    step_times, first, share_times, device = asyncio.run(run())
    tokens = sum(lengths)
    med = {k: statistics.median(v) for k, v in step_times.items()}
    sorted_lengths = sorted(lengths)
    return {
        "mix": args.mix, "nproc": args.nproc, "device": device, "size": args.size, "dtype": args.dtype,
        "context": args.context, "micro_batch_tokens": budget, "samples": len(lengths), "tokens": tokens,
        "length_median": sorted_lengths[len(lengths) // 2], "length_max": sorted_lengths[-1],
        "step_s_padded": round(med["padded"], 3), "step_s_packed": round(med["packed"], 3),
        "step_s_all": {k: [round(t, 3) for t in v] for k, v in step_times.items()},
        "tokens_per_s_padded": round(tokens / med["padded"], 1),
        "tokens_per_s_packed": round(tokens / med["packed"], 1),
        "packed_over_padded": round(med["padded"] / med["packed"], 3),
        "padding_frac": round(padding_frac(lengths, args.nproc, budget), 4),
        "first_step": first,
        "loss_rel_diff": round(abs(first["packed"]["loss"] - first["padded"]["loss"])
                               / max(abs(first["padded"]["loss"]), 1e-12), 6),
        "ranks_timed": ranks,
        "rank_share_s": {k: [round(t, 3) for t in v] for k, v in share_times.items()},
        "rank_imbalance": round(_imbalance(share_times["balanced"]), 3),
        "rank_imbalance_unbalanced": round(_imbalance(share_times["strided"]), 3),
        "rank_cost_imbalance": round(modelled["balanced"], 4),
        "rank_cost_imbalance_unbalanced": round(modelled["strided"], 4),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(prog="agentrl bench trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mix", choices=sorted(MIXES), default="tool", help="length distribution (bench/traces)")
    parser.add_argument("--nproc", type=int, default=2, help="trainer ranks of the two timed trainers")
    parser.add_argument("--ranks", type=int, default=0,
                        help="ranks the batch is dealt to for the balance figures (default: nproc, at least 2)")
    parser.add_argument("--size", choices=sorted(SIZES), default="small", help="random Qwen2 shape")
    parser.add_argument("--context", type=int, default=4096, help="the model's window; lengths are scaled to it")
    parser.add_argument("--budget", type=int, default=0, help="micro_batch_tokens (default: the defaults' budget per window, 2 x --context)")
    parser.add_argument("--samples", type=int, default=64, help="trajectories in the batch")
    parser.add_argument("--rounds", type=int, default=3, help="timed steps of each trainer, in turn")
    parser.add_argument("--share-reps", type=int, default=3, help="timings of each rank's share (median)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where to build the random model, or reuse one built there with the same shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="(accepted: the last line is always JSON)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-trainer-") as tmp:
        res = measure(args, Path(tmp))
    print(f"{res['mix']}: {res['samples']} trajectories, {res['tokens']} tokens (median {res['length_median']}, "
          f"max {res['length_max']}), {res['nproc']} ranks on {res['device']}: padded {res['tokens_per_s_padded']} "
          f"tok/s, packed {res['tokens_per_s_packed']} tok/s ({res['packed_over_padded']}x; padding "
          f"{res['padding_frac']:.0%}); rank imbalance {res['rank_imbalance']} balanced, "
          f"{res['rank_imbalance_unbalanced']} strided", file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
