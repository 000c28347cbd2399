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

    agentrl bench logprobs --temperature 0.7 --json
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


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.tools.bench.engine import bench_model, scratch_dir

    model = await bench_model(args.model)
    with scratch_dir("agentrl-bench-logprobs-") as work:
        out = await _measure_in(args, model, work)
    t_res = out.pop("tT", out["t1"])
    out.update(t_res)
    out["mae_ratio_vs_t1"] = out["logprob_mae"] / max(out["t1"]["logprob_mae"], 1e-12)
    out["targets_met"] = bool(abs(out["is_weight_mean"] - 1.0) <= 0.03 and out["mae_ratio_vs_t1"] <= 1.5)
    return out


async def _measure_in(args: argparse.Namespace, model: str, work: Path) -> dict[str, Any]:
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

                async def episodes(temperature: float, version: int) -> list[Any]:
                    sampling = SamplingConfig(temperature=temperature, max_context_tokens=args.max_context_tokens)
                    workers = RolloutWorkers(CalcEnv, client, chat, sampling,
                                             max_concurrency=args.episodes, model=ADAPTER,
                                             policy_version=lambda: version)
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
                out: dict[str, Any] = {"temperature": args.temperature, "episodes": len(tasks), "model": model}
                for temperature in dict.fromkeys((1.0, args.temperature)):  # once when --temperature is 1
                    trajs = await episodes(temperature, 1)
                    tempered = _samples(trajs)
                    res = compare(tempered, await trainer.logprobs(tempered))
                    if temperature != 1.0:
                        plain = _samples(trajs, temperature=1.0)
                        res["untempered"] = compare(tempered, await trainer.logprobs(plain))
                    res["failed_episodes"] = float(sum(t.failed for t in trajs))
                    out["t1" if temperature == 1.0 else "tT"] = res
        finally:
            await asyncio.to_thread(trainer.close)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench logprobs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=0.7, help="sampling temperature to check (> 0)")
    parser.add_argument("--episodes", type=int, default=64, help="calc episodes per temperature")
    parser.add_argument("--max-context-tokens", type=int, default=1024,
                        help="an episode's prompt plus completion stops at this many tokens (at most 1024)")
    add_engine_args(parser, needs="LoRA enabled, --logprobs-mode processed_logprobs")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    args = parser.parse_args(argv)
    if not 16 <= args.max_context_tokens <= 1024:
        parser.error("--max-context-tokens must be in 16..1024 (the engine's context)")
    if not args.temperature > 0:
        parser.error("--temperature must be > 0 (greedy decoding has no sampling distribution to compare)")
    res = asyncio.run(_measure(args))
    if not args.json:
        t1 = res["t1"]
        print(f"T = 1.0: logprob MAE {t1['logprob_mae']:.2e}, IS weight mean {t1['is_weight_mean']:.4f} "
              f"({t1['tokens']:.0f} tokens)")
        if "untempered" in res:
            u = res["untempered"]
            print(f"T = {res['temperature']}: logprob MAE {res['logprob_mae']:.2e}, IS weight mean "
                  f"{res['is_weight_mean']:.4f} ({res['tokens']:.0f} tokens); a trainer ignoring T: MAE "
                  f"{u['logprob_mae']:.3f}, IS weight mean {u['is_weight_mean']:.3f}")
        print(f"MAE ratio vs T = 1: {res['mae_ratio_vs_t1']:.2f}; targets met: {res['targets_met']}")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
