"""``agentrl bench headroom``: how much can RL gain from this starting policy, and where is the signal?

GRPO on an outcome reward learns from groups whose episodes disagree; a policy that already samples its best
answers, or that never finds one, gives it little to work with. This measures, on one engine serving
``--model`` (no training):

- **held-out success** on the first ``--eval-tasks`` test tasks, sampled at temperature 1 (what ``agentrl
  train`` evaluates) and decoded greedily; their difference, ``sharpening_headroom``, is what RL gains by
  moving probability onto answers the model can already give. On the embedded calc model most of an
  80-step run's gain is that: the runs end near the start's greedy success (docs/training.md);
- **GRPO groups** of ``--group-size`` episodes on ``--tasks`` train tasks at temperature 1, as a training
  step samples them: the mean success, the share of groups whose rewards are all equal (no advantage, so
  no gradient: ``all_fail_groups`` + ``all_pass_groups``), ``pass_at_group`` (a group holds at least one
  success) and the histogram of successes per group;
- **entropy**: the mean negative log-probability of the sampled model tokens, an unbiased estimate of the
  policy's per-token entropy along its own samples (nats per token). A sharp start (low entropy, greedy
  success close to sampled success) has little left to sharpen.

The last line is one JSON object with every figure.

    agentrl bench headroom --model models/tiny --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from typing import Any

from agentrl.tools.bench.engine import add_engine_args
from agentrl.tools.bench.errors import NoMeasurements


def group_figures(successes: list[list[bool]]) -> dict[str, Any]:
    """Figures of GRPO groups given each group's per-episode success."""
    if not successes:
        raise NoMeasurements("no groups")
    size = len(successes[0])
    counts = [sum(g) for g in successes]
    n = len(counts)
    return {
        "groups": n,
        "group_size": size,
        "group_success": sum(counts) / (n * size),
        "all_fail_groups": sum(c == 0 for c in counts) / n,
        "all_pass_groups": sum(c == len(g) for c, g in zip(counts, successes, strict=True)) / n,
        "zero_advantage_groups": sum(c in (0, len(g)) for c, g in zip(counts, successes, strict=True)) / n,
        "pass_at_group": sum(c > 0 for c in counts) / n,
        "successes_per_group_hist": [sum(c == k for c in counts) for k in range(size + 1)],
    }


def entropy_estimate(trajectories: list[Any]) -> float:
    """Mean negative log-probability of the sampled model tokens (nats per token)."""
    lps = [lp for t in trajectories for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if m]
    return -math.fsum(lps) / len(lps) if lps else float("nan")


def _success(t: Any) -> bool:
    return not t.failed and t.reward >= 1.0


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine, run the held-out evaluations and the training-shaped groups; the figures."""
    from agentrl.config.run import load_config
    from agentrl.environment.base import run_scope
    from agentrl.environment.registry import canonical_spec, load_env
    from agentrl.environment.tasks import load_tasks
    from agentrl.launch.stack import inference_stack
    from agentrl.rollout.groups import RolloutWorkers
    from agentrl.tools.bench.engine import scratch_dir

    overrides: dict[str, Any] = {"env": canonical_spec(args.env), "model": args.model,
                                 "chat_template": args.chat_template,
                                 "endpoints": [args.endpoint] if args.endpoint else None,
                                 "trainer": {"lora": False}}  # an engine without LoRA: the base policy
    cfg = load_config(None, overrides).resolved()
    env_cls = load_env(cfg.env)
    held_out = load_tasks(env_cls, "test", cfg.eval_tasks, source_split=cfg.eval_tasks_split)[: args.eval_tasks]
    train = load_tasks(env_cls, "train", cfg.tasks, source_split=cfg.tasks_split)[: args.tasks]
    out: dict[str, Any] = {"model": cfg.model, "env": cfg.env}
    with scratch_dir("agentrl-bench-headroom-") as work:
        async with run_scope(env_cls, "bench-headroom"), inference_stack(cfg, work) as stack:
            def workers(temperature: float) -> RolloutWorkers:
                sampling = cfg.sampling.model_copy(update={"temperature": temperature})
                return RolloutWorkers(env_cls, stack.client, stack.chat, sampling,
                                      max_concurrency=args.concurrency)

            await workers(1.0).run_groups(held_out[: min(32, len(held_out))], 1)  # engine warm-up, unmeasured
            for name, temperature in (("t1", 1.0), ("greedy", 0.0)):
                groups = await workers(temperature).run_groups(held_out, 1)
                out[f"heldout_success_{name}"] = sum(_success(g[0]) for g in groups) / len(groups)
                out[f"heldout_failed_{name}"] = sum(g[0].failed for g in groups)
            out["sharpening_headroom"] = out["heldout_success_greedy"] - out["heldout_success_t1"]
            groups = await workers(1.0).run_groups(train, args.group_size)
    out.update(group_figures([[_success(t) for t in g] for g in groups]))
    flat = [t for g in groups for t in g if not t.failed]
    out["entropy_nats_per_token"] = entropy_estimate(flat)
    out["model_tokens_per_episode"] = sum(t.num_model_tokens for t in flat) / max(1, len(flat))
    out["heldout_tasks"] = len(held_out)
    return out


def render(r: dict[str, Any]) -> str:
    """A human-readable summary of :func:`measure`'s figures."""
    return "\n".join([
        f"model {r['model']} on {r['env']}",
        f"held-out success ({r['heldout_tasks']} tasks): temperature 1 {r['heldout_success_t1']:.3f}, "
        f"greedy {r['heldout_success_greedy']:.3f} (sharpening headroom {r['sharpening_headroom']:+.3f})",
        f"GRPO groups ({r['groups']} x {r['group_size']} at temperature 1): success {r['group_success']:.3f}, "
        f"zero-advantage {r['zero_advantage_groups']:.2f} (all fail {r['all_fail_groups']:.2f}, all pass "
        f"{r['all_pass_groups']:.2f}), pass@{r['group_size']} {r['pass_at_group']:.2f}, "
        f"successes per group {r['successes_per_group_hist']}",
        f"entropy {r['entropy_nats_per_token']:.4f} nats per sampled token, "
        f"{r['model_tokens_per_episode']:.1f} model tokens per episode",
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="agentrl bench headroom", description=__doc__.split("\n\n")[0])
    add_engine_args(parser)
    parser.add_argument("--env", default="calc", help="environment (default calc)")
    parser.add_argument("--eval-tasks", type=int, default=200, help="held-out tasks (default 200)")
    parser.add_argument("--tasks", type=int, default=128, help="train tasks, one group each (default 128)")
    parser.add_argument("--group-size", type=int, default=8, help="episodes per group (default 8)")
    parser.add_argument("--concurrency", type=int, default=128, help="episodes in flight (default 128)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object last")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args))
    print(render(result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
