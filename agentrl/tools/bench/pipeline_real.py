"""``agentrl bench pipeline --real``: sync vs async on real parts, driven by a PolyTrace-shaped trace.

The simulated mode models generation and training time; this mode measures them. One vLLM server
(the embedded tiny model) and one real torchrun trainer (LoRA) are started once; the same seeded
trace is then replayed by the real :class:`~agentrl.orchestrator.loop.Orchestrator` twice, in ``sync``
mode (η = 0) and in ``async`` mode (η given), with in-place shared-memory adapter sync and partial
rollouts. Each trace episode is replayed turn by turn: the engine decodes exactly the trace's output
length (scaled to fit the model's context), the tool latency is slept, and observation tokens are
appended. Rewards are seeded coin flips (so every group trains); throughput counts trained tokens.

Both modes share one machine here: on a CPU box the engine and the trainer compete for the same cores,
which caps what overlap can win (reported as measured). On a GPU machine they run on separate devices.

    agentrl bench pipeline --real --mix tool --steps 8
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import time
from pathlib import Path
from typing import Any

from agentrl.config.run import PipelineConfig
from agentrl.core.types import StopReason, Trajectory
from agentrl.core.versions import PolicyVersion, token_versions
from agentrl.orchestrator.loop import Orchestrator
from agentrl.tools.bench.engine import add_engine_args, engine_url
from agentrl.tools.bench.traces import MIXES, Episode, make_trace, mix_spec

ADAPTER = "bench-policy"


class TraceReplayer:
    """A group runner that replays trace episodes against the engine (see module docstring)."""

    def __init__(self, client: Any, groups: list[list[Episode]], *, max_len: int, token_scale: float,
                 time_scale: float, vocab: int, version: Any) -> None:
        self.client = client
        self.groups = groups
        self.max_len = max_len
        self.token_scale = token_scale
        self.time_scale = time_scale
        self.vocab = vocab
        self.version = version

    def _n(self, tokens: float) -> int:
        return max(1, round(tokens * self.token_scale))

    async def run_group(self, task: dict[str, Any], group_size: int) -> list[Trajectory]:
        k = int(task["id"])
        episodes = self.groups[k % len(self.groups)][:group_size]
        return list(await asyncio.gather(*(self._episode(k, i, ep) for i, ep in enumerate(episodes))))

    async def _episode(self, k: int, i: int, ep: Episode) -> Trajectory:
        rng = random.Random(k * 1009 + i)
        ids = lambda n: [rng.randrange(5, self.vocab) for _ in range(n)]  # noqa: E731
        traj = Trajectory(task_id=str(k), env="trace", group_id=str(k), prompt_ids=ids(self._n(ep.turns[0].prompt_tokens)))
        for j, turn in enumerate(ep.turns):
            room = self.max_len - len(traj.prompt_ids) - len(traj.completion_ids)
            n_out = min(self._n(turn.output_tokens), room)
            if n_out <= 0:
                break
            sent = self.version()
            gen = await self.client.generate(traj.prompt_ids + traj.completion_ids, max_tokens=n_out,
                                             temperature=1.0, model=ADAPTER, ignore_eos=True,
                                             cache_salt=f"policy-v{sent}")
            traj.completion_ids += gen.token_ids
            traj.loss_mask += [1] * len(gen.token_ids)
            traj.logprobs += list(gen.logprobs)
            traj.versions += token_versions(gen, sent)
            traj.num_turns = j + 1
            if j + 1 < len(ep.turns):
                await asyncio.sleep(turn.tool_latency_s * self.time_scale)
                obs = ids(min(self._n(ep.turns[j + 1].prompt_tokens),
                              self.max_len - len(traj.prompt_ids) - len(traj.completion_ids)))
                traj.completion_ids += obs
                traj.loss_mask += [0] * len(obs)
                traj.logprobs += [0.0] * len(obs)
                traj.versions += [-1] * len(obs)
        traj.reward = float(rng.random() < 0.5)
        traj.stop_reason = StopReason.COMPLETED
        return traj


async def _run_mode(pipe: PipelineConfig, *, client: Any, trainer: Any, publisher: Any,
                    groups: list[list[Episode]], args: argparse.Namespace, version0: int) -> dict[str, Any]:
    version = PolicyVersion(version0)  # the one source: the runner reads what the orchestrator bumps
    runner = TraceReplayer(client, groups, max_len=args.max_len, token_scale=args.token_scale,
                           time_scale=args.time_scale, vocab=args.vocab, version=version)
    counter = itertools.count()
    orch = Orchestrator(runner=runner, trainer=trainer, publisher=publisher, engine=client,
                        sample_task=lambda: {"id": next(counter)}, pipeline=pipe,
                        groups_per_step=args.groups_per_step, group_size=args.group_size, version=version)
    recs = []
    t0 = time.perf_counter()
    async with orch:
        for _ in range(args.steps):
            recs.append(await orch.step())
    wall = time.perf_counter() - t0
    trained_tokens = sum(r["total_tokens"] for r in recs)
    capped = sum(r["age_capped_tokens"] for r in recs)  # generated, masked out of the loss for their age
    trained_model_tokens = sum(r["model_tokens"] for r in recs) - capped
    dropped_model_tokens = (recs[-1]["dropped_tokens_total"] if recs else 0) + capped
    train_s = sum(r["train_s"] for r in recs)
    hist: dict[str, int] = recs[-1]["staleness_hist"] if recs else {}
    return {
        "wall_s": wall, "tokens_per_s": trained_tokens / wall, "trained_tokens": trained_tokens,
        "trainer_idle": 1.0 - train_s / wall,
        "inference_idle": sum(r["inference_idle_frac"] * r["step_s"] for r in recs) / wall,
        "max_staleness_seen": max((int(k) for k in hist), default=0), "staleness_hist": hist,
        "interrupted_groups": recs[-1]["interrupted_groups_total"] if recs else 0,
        "mixed_version_episodes": sum(r["mixed_version_episodes"] for r in recs),
        "update_ms_p50": sorted(1e3 * r["update_s"] for r in recs)[len(recs) // 2] if recs else 0.0,
        "version_end": orch.version,
        "dropped_groups": recs[-1]["dropped_groups_total"] if recs else 0,
        "dropped_token_frac": dropped_model_tokens / max(trained_model_tokens + dropped_model_tokens, 1),
    }


async def run_real(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine and the trainer once, replay the trace in both modes, compare."""
    from agentrl.tools.bench.engine import bench_model, scratch_dir

    model = await bench_model(args.model)
    with scratch_dir("agentrl-bench-real-") as work:
        return await _run_real_in(args, model, work)


async def _run_real_in(args: argparse.Namespace, model: str, work: Path) -> dict[str, Any]:
    from agentrl.config.trainer import TrainerConfig
    from agentrl.inference import InferenceClient
    from agentrl.trainer.client import TrainerProcess
    from agentrl.weight_sync.file import FileAdapterSync
    from agentrl.weight_sync.shm import SharedMemoryAdapterSync

    spec = mix_spec(args.mix)
    pipe = PipelineConfig.for_async(args.eta, drop_policy=args.policy, staleness_from=args.staleness_from,
                                    max_token_age=args.max_token_age)
    sync_pipe = PipelineConfig(max_staleness=0)
    eta = pipe.max_staleness or 0
    trace = make_trace(spec, 2 * args.steps + eta + 4, args.groups_per_step, args.group_size, args.seed)
    trainer = TrainerProcess(TrainerConfig(model_path=model, lr=1e-4, cpu_cores=args.trainer_cores), work)
    out: dict[str, Any] = {"mix": args.mix, "eta": eta, "steps": args.steps, "seed": args.seed,
                           "drop_policy": pipe.drop_policy, "staleness_from": pipe.staleness_from,
                           "max_token_age": pipe.token_age_cap(),
                           "inference_cores": args.inference_cores, "trainer_cores": args.trainer_cores,
                           "groups_per_step": args.groups_per_step, "group_size": args.group_size,
                           "token_scale": args.token_scale, "time_scale": args.time_scale, "real": True}
    async with engine_url(args.endpoint, work, model=model, dtype="float32", max_model_len=args.max_len + 64,
                          max_lora_rank=16, max_loras=2, cpu_cores=args.inference_cores) as url:
        await asyncio.to_thread(trainer.start)
        try:
            async with InferenceClient([url], timeout_s=600) as client:
                file_sync = FileAdapterSync(trainer, client, work / "adapters", ADAPTER)
                await file_sync.publish(0)
                with SharedMemoryAdapterSync(trainer, client, ADAPTER, fallback=file_sync, reset="") as shm:
                    # warm-up: compile paths, fill caches, so neither mode pays first-call costs
                    await _run_mode(sync_pipe, client=client, trainer=trainer, publisher=shm,
                                    groups=trace.groups[-4:],
                                    args=argparse.Namespace(**{**vars(args), "steps": 1}), version0=0)
                    res_sync = await _run_mode(sync_pipe, client=client, trainer=trainer, publisher=shm,
                                               groups=trace.groups, args=args, version0=1)
                    res_async = await _run_mode(pipe, client=client, trainer=trainer, publisher=shm,
                                                groups=trace.groups, args=args, version0=res_sync["version_end"])
        finally:
            await asyncio.to_thread(trainer.close)
    out.update({
        "async_over_sync": res_async["tokens_per_s"] / max(res_sync["tokens_per_s"], 1e-12),
        "trainer_idle_sync": res_sync["trainer_idle"], "trainer_idle_async": res_async["trainer_idle"],
        "inference_idle_sync": res_sync["inference_idle"], "inference_idle_async": res_async["inference_idle"],
        "max_staleness_seen": res_async["max_staleness_seen"], "staleness_hist": res_async["staleness_hist"],
        "interrupted_groups": res_async["interrupted_groups"],
        "mixed_version_episodes": res_async["mixed_version_episodes"],
        "wall_s_sync": res_sync["wall_s"], "wall_s_async": res_async["wall_s"],
        "update_ms_p50_async": res_async["update_ms_p50"],
        "dropped_groups": res_async["dropped_groups"], "dropped_token_frac": res_async["dropped_token_frac"],
    })
    return out


def add_args(ap: argparse.ArgumentParser) -> None:
    """Options of the real mode (``--real``)."""
    add_engine_args(ap, needs="LoRA enabled, max model length at least --max-len + 64; on this machine, for the "
                    "shared-memory adapter sync")
    ap.add_argument("--max-len", type=int, default=960, help="longest episode in tokens (fits the engine)")
    ap.add_argument("--token-scale", type=float, default=0.1, help="trace token counts are multiplied by this")
    ap.add_argument("--time-scale", type=float, default=0.5, help="trace tool latencies are multiplied by this")
    ap.add_argument("--vocab", type=int, default=900, help="random token ids are drawn below this")
    ap.add_argument("--inference-cores", default=None,
                    help="CPU: pin the vLLM server to these cores (e.g. 0), the CPU analogue of inference GPUs")
    ap.add_argument("--trainer-cores", default=None, help="CPU: pin the trainer to these cores (e.g. 1)")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="agentrl bench pipeline --real", description=__doc__.split("\n")[0])
    ap.add_argument("--real", action="store_true")
    ap.add_argument("--mix", choices=sorted(MIXES), default="tool")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--eta", type=int, default=None, help="max staleness η of the async run (default: a run's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--groups-per-step", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--policy", choices=["accept", "drop_stale", "block"], default=None,
                    help="pipeline.drop_policy of the async run (default: a run's, accept)")
    ap.add_argument("--max-token-age", type=int, default=None,
                    help="pipeline.max_token_age of the async run (default: a run's, η + 2)")
    ap.add_argument("--staleness-from", choices=["oldest", "newest"], default=None,
                    help="pipeline.staleness_from of the async run (default: a run's, oldest)")
    add_args(ap)
    args = ap.parse_args(argv)
    r = asyncio.run(run_real(args))
    print(f"real mode, {args.mix} mix: sync {r['wall_s_sync']:.1f}s, async {r['wall_s_async']:.1f}s, "
          f"async/sync {r['async_over_sync']:.2f}x, trainer idle {r['trainer_idle_sync']:.2f} -> "
          f"{r['trainer_idle_async']:.2f}, max staleness {r['max_staleness_seen']}")
    print(json.dumps(r))
    return r
