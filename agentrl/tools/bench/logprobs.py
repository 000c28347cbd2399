"""``agentrl bench logprobs``: do the engine and the trainer agree on the distribution that was sampled?

Starts one vLLM server (the embedded tiny model or ``--model``, ``--logprobs-mode processed_logprobs``; or uses
``--endpoint``) and one torchrun trainer, makes the adapter (rank 16 on every linear layer) non-trivial with one
training step, copies it into the engine's live LoRA slot in place (η = 0: the engine serves exactly the
trainer's weights), then samples ``--episodes`` calc episodes at temperature 1 and at
``--temperature`` T and has the trainer score the same tokens. Per temperature it reports, over sampled
tokens:

- ``logprob_mae``: mean |engine logprob − trainer logprob| (both at the sampling temperature);
- ``is_weight_mean``: mean of exp(trainer − engine), the behaviour importance weight at η = 0 (1 when the
  two sides agree);
- ``untempered``: the same two figures for a trainer that ignores the temperature (scores at T = 1), i.e.
  what the loss would see without the temperature carried in the trajectory.

The last line is one JSON object: the T figures at top level (``temperature``, ``logprob_mae``,
``is_weight_mean``), the T = 1 figures under ``t1``, and ``mae_ratio_vs_t1``. Targets: at T = 0.7
``is_weight_mean`` within 1 ± 0.03 and ``logprob_mae`` at most 1.5x the T = 1 figure.

**Truncated sampling** (``--top-p``, ``--top-k``, ``--min-p``): the episodes sample with that truncation, the
engine records each token's kept set (:mod:`agentrl.engine.masks`) and the trainer renormalises over it. Each
temperature's figures then also carry ``unmasked``: the same tokens scored by a trainer that ignores the masks,
the control that shows what the masks fix; and the run reports ``mask_bytes_per_token`` (stored mask bytes over
the episodes' tokens, counts included) and the capture's cost to generation (``capture``: fixed-length bursts
with the capture on and paused, alternated, tokens/s each). Targets: ``logprob_mae`` at most 1e-4 and
``is_weight_mean`` within 1 ± 0.02 at every temperature. ``--matrix`` runs each truncation alone and all three
together (``cases``, one entry each; the top level is the combined case).

    agentrl bench logprobs --temperature 0.7 --json
    agentrl bench logprobs --top-p 0.9 --top-k 20 --min-p 0.05 --matrix
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

from agentrl.tools.bench.engine import add_engine_args
from agentrl.tools.bench.errors import BenchFailed

ADAPTER = "bench-logprobs"


def _samples(trajs: list[Any], temperature: float | None = None) -> list[Any]:
    """Trainer samples of the episodes' tokens (advantage 0: only scored), optionally re-tempered."""
    from agentrl.orchestrator.samples import sample_of

    return [sample_of(t, 0.0, temperature) for t in trajs if not t.failed and t.completion_ids]


def compare(samples: list[Any], trainer_logprobs: list[list[float]]) -> dict[str, float]:
    """Agreement of the engine's behaviour logprobs and the trainer's over the samples' masked tokens."""
    diffs = [lp - b for s, row in zip(samples, trainer_logprobs, strict=True)
             for lp, b, m in zip(row, s.behav_logprobs, s.loss_mask, strict=True) if m]
    if not diffs:
        raise BenchFailed("no sampled tokens to compare (every episode failed?)")
    n = len(diffs)
    return {"logprob_mae": sum(abs(d) for d in diffs) / n,
            "is_weight_mean": sum(math.exp(min(d, 50.0)) for d in diffs) / n,
            "max_abs_diff": max(abs(d) for d in diffs), "tokens": float(n)}


def truncations(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The sampling cases to run, by name: one (``none`` or ``given``) without ``--matrix``; each given
    truncation alone and all together with it."""
    given = {k: v for k, v in (("top_p", args.top_p), ("top_k", args.top_k), ("min_p", args.min_p)) if v}
    if not args.matrix or len(given) < 2:
        return {"given" if given else "none": given}
    return {**{k: {k: v} for k, v in given.items()}, "all": given}


def _unmasked(samples: list[Any]) -> list[Any]:
    import dataclasses

    return [dataclasses.replace(s, sampling_mask=None) for s in samples]


def _mask_bytes_per_token(trajs: list[Any]) -> float:
    tokens = sum(len(t.completion_ids) for t in trajs)
    stored = sum(4 * t.sampling_mask.n + len(t.sampling_mask.data) for t in trajs if t.sampling_mask is not None)
    return stored / max(1, tokens)


def _summarise(case: dict[str, Any]) -> dict[str, Any]:
    """A case's T figures at its top level, ``mae_ratio_vs_t1`` and whether its targets are met."""
    out = dict(case)
    out.update(out.pop("tT", out["t1"]))
    out["mae_ratio_vs_t1"] = out["logprob_mae"] / max(out["t1"]["logprob_mae"], 1e-12)
    if out.get("truncation"):
        out["targets_met"] = all(r["logprob_mae"] <= 1e-4 and abs(r["is_weight_mean"] - 1.0) <= 0.02
                                 for r in (out, out["t1"]))
    else:
        out["targets_met"] = bool(abs(out["is_weight_mean"] - 1.0) <= 0.03 and out["mae_ratio_vs_t1"] <= 1.5)
    return out


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.tools.bench.engine import bench_model, scratch_dir

    model = await bench_model(args.model)
    with scratch_dir("agentrl-bench-logprobs-") as work:
        runs = await _measure_in(args, model, work, truncations(args))
    cases = {name: _summarise(res) for name, res in runs.pop("cases").items()}
    out = {**runs, **cases[list(cases)[-1]]}
    if len(cases) > 1:
        out["cases"] = cases
        out["targets_met"] = all(c["targets_met"] for c in cases.values())
    return out


async def capture_cost(client: Any, model: str, sampling: dict[str, Any], rounds: int = 3, n: int = 32,
                       tokens: int = 64) -> dict[str, float]:
    """Generation tokens/s with the mask capture on and paused, in alternating fixed-length bursts of ``n``
    requests of ``tokens`` tokens (the same prompts), and their ratio."""
    import time

    prompts = [[(i * 17 + j * 7) % 200 + 5 for i in range(40)] for j in range(n)]
    rates: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for on in (True, False):
            await client.enable_mask_capture(active=on)
            t0 = time.perf_counter()
            await asyncio.gather(*(client.generate(p, max_tokens=tokens, ignore_eos=True, model=model,
                                                   sampling_mask=on, **sampling) for p in prompts))
            rates[on].append(n * tokens / (time.perf_counter() - t0))
    await client.enable_mask_capture(active=True)
    on, off = (sorted(rates[k])[len(rates[k]) // 2] for k in (True, False))
    return {"tokens_per_s_capture": on, "tokens_per_s_no_capture": off, "capture_over_none": on / off}


async def _measure_in(args: argparse.Namespace, model: str, work: Path,
                      cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from agentrl.config.run import SamplingConfig
    from agentrl.config.trainer import TrainerConfig
    from agentrl.envs.calc import CalcEnv
    from agentrl.inference import InferenceClient
    from agentrl.launch.stack import load_chat_format
    from agentrl.orchestrator.samples import to_samples
    from agentrl.rollout.groups import RolloutWorkers
    from agentrl.tools.bench.engine import engine_url
    from agentrl.trainer.client import TrainerProcess
    from agentrl.weight_sync.file import FileAdapterSync
    from agentrl.weight_sync.shm import SharedMemoryAdapterSync

    tasks = list(CalcEnv.tasks("train"))[: args.episodes]
    trainer = TrainerProcess(TrainerConfig(model_path=model, lr=2e-3, lora_rank=16, lora_alpha=32.0), work)
    async with engine_url(args.endpoint, work, model=model, dtype="float32", max_model_len=1024,
                          max_lora_rank=16) as engine:
        try:
            await asyncio.to_thread(trainer.start)
            chat = await asyncio.to_thread(load_chat_format, model, "hermes", args.chat_template)
            async with InferenceClient([engine], timeout_s=600) as client:
                sync = FileAdapterSync(trainer, client, work / "adapters", ADAPTER)
                await sync.publish(0)

                if any(cases.values()):
                    recs = await client.enable_mask_capture()
                    if not all(r.get("ok") for r in recs.values()):
                        raise BenchFailed(f"the engine cannot record sampling masks: {recs}")

                async def episodes(temperature: float, version: int, **truncation: Any) -> list[Any]:
                    sampling = SamplingConfig(temperature=temperature, max_context_tokens=args.max_context_tokens,
                                              **truncation)
                    workers = RolloutWorkers(CalcEnv, client, chat, sampling,
                                             max_concurrency=args.episodes, model=ADAPTER,
                                             policy_version=lambda: version, sampling_masks=bool(truncation))
                    groups = await workers.run_groups(tasks, 1)
                    return [t for g in groups for t in g]

                # one real training step, so the engine serves a non-trivial adapter (version 1), copied into
                # the engine's live LoRA slot in place (the path a run takes), not loaded from a file
                warm = await episodes(1.0, 0)
                for i, t in enumerate(warm):
                    t.group_id, t.reward = "warm", float(i % 2)
                samples, _ = to_samples([warm])
                await trainer.train(samples, policy_version=0)
                with SharedMemoryAdapterSync(trainer, client, ADAPTER) as inplace:
                    await inplace.publish(1)
                out: dict[str, Any] = {"temperature": args.temperature, "episodes": len(tasks), "model": model,
                                       "cases": {}}
                for name, truncation in cases.items():
                    case: dict[str, Any] = {"truncation": truncation}
                    trajs_all: list[Any] = []
                    for temperature in dict.fromkeys((1.0, args.temperature)):  # once when --temperature is 1
                        trajs = await episodes(temperature, 1, **truncation)
                        trajs_all += trajs
                        tempered = _samples(trajs)
                        res = compare(tempered, await trainer.logprobs(tempered))
                        if temperature != 1.0:
                            plain = _samples(trajs, temperature=1.0)
                            res["untempered"] = compare(tempered, await trainer.logprobs(plain))
                        if truncation:  # the control: the same tokens scored over the whole vocabulary
                            res["unmasked"] = compare(tempered, await trainer.logprobs(_unmasked(tempered)))
                        res["failed_episodes"] = float(sum(t.failed for t in trajs))
                        case["t1" if temperature == 1.0 else "tT"] = res
                    if truncation:
                        case["mask_bytes_per_token"] = _mask_bytes_per_token(trajs_all)
                        case["capture"] = await capture_cost(client, ADAPTER, truncation, n=args.burst)
                    out["cases"][name] = case
        finally:
            await asyncio.to_thread(trainer.close)
    return out


def _print_case(name: str, res: dict[str, Any], temperature: float) -> None:
    if name:
        print(f"{name}: {res['truncation']}")
    for label, r in (("T = 1.0", res["t1"]), (f"T = {temperature}", res)):
        line = f"{label}: logprob MAE {r['logprob_mae']:.2e}, IS weight mean {r['is_weight_mean']:.4f} " \
               f"({r['tokens']:.0f} tokens)"
        if "unmasked" in r:
            u = r["unmasked"]
            line += f"; masks ignored: MAE {u['logprob_mae']:.3f}, IS weight mean {u['is_weight_mean']:.3f}"
        if "untempered" in r:
            u = r["untempered"]
            line += f"; T ignored: MAE {u['logprob_mae']:.3f}, IS weight mean {u['is_weight_mean']:.3f}"
        print(line)
    if "capture" in res:
        c = res["capture"]
        print(f"masks: {res['mask_bytes_per_token']:.1f} bytes/token; generation {c['tokens_per_s_capture']:.0f} "
              f"tokens/s with capture vs {c['tokens_per_s_no_capture']:.0f} without ({c['capture_over_none']:.2f}x)")
    print(f"MAE ratio vs T = 1: {res['mae_ratio_vs_t1']:.2f}; targets met: {res['targets_met']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench logprobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature to check (> 0)")
    parser.add_argument("--episodes", type=int, default=64, help="calc episodes per temperature")
    parser.add_argument("--max-context-tokens", type=int, default=1024,
                        help="an episode's prompt plus completion stops at this many tokens (at most 1024)")
    parser.add_argument("--top-p", type=float, default=None, help="sample with this nucleus mass (< 1)")
    parser.add_argument("--top-k", type=int, default=None, help="sample among this many most likely tokens")
    parser.add_argument("--min-p", type=float, default=None, help="drop tokens under this share of the most likely")
    parser.add_argument("--matrix", action="store_true",
                        help="run each given truncation alone and all of them together")
    parser.add_argument("--burst", type=int, default=32,
                        help="requests per burst (64 tokens each) when measuring the mask capture's cost")
    add_engine_args(parser, needs="LoRA enabled, --logprobs-mode processed_logprobs")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if not 16 <= args.max_context_tokens <= 1024:
        parser.error("--max-context-tokens must be in 16..1024 (the engine's context)")
    if not args.temperature > 0:
        parser.error("--temperature must be > 0 (greedy decoding has no sampling distribution to compare)")
    if args.top_p is not None and not 0 < args.top_p < 1:
        parser.error("--top-p must be in (0, 1)")
    if args.top_k is not None and args.top_k < 1:
        parser.error("--top-k must be >= 1")
    if args.min_p is not None and not 0 < args.min_p < 1:
        parser.error("--min-p must be in (0, 1)")
    if args.burst < 1:
        parser.error("--burst must be >= 1")
    res = asyncio.run(_measure(args))
    if not args.json:
        for name, case in (res.get("cases") or {"": res}).items():
            _print_case(name, case, res["temperature"])
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
