"""``agentrl bench sync --full``: full-weight sync from an FSDP2 trainer into a running vLLM engine.

Starts one vLLM server (fp32, no LoRA) on a random Qwen2 model and one torchrun trainer that fine-tunes every
weight of the same model, publishes version 0 once (warm-up: bucket plan, shared-memory segment), then
``--syncs`` times:

1. samples a few generations from the engine at temperature 1 and trains one step on them with random ±
   advantages, so the trainer's weights move away from the engine's;
2. ``logprob_mae_stale``: the engine (old weights) and the trainer (new weights) score fresh samples: mean
   |engine logprob - trainer logprob| over the sampled tokens, the gap a sync has to close;
3. ``full_sync_ms``: :meth:`FullWeightSync.publish` of the new version until the first token generated under
   it (a one-token greedy request, whose version label is checked);
4. ``logprob_mae_after_sync``: the same comparison on fresh samples once the new version is live.

``logprob_mae_initial`` is that comparison right after the warm-up, both sides on the same checkpoint: the
numerical floor of engine/trainer agreement.

``memcpy_ms`` is a plain host copy of as many bytes as one sync moves, in the same run: the physical limit.
Targets: ``full_sync_over_memcpy`` <= 4 and ``logprob_mae_after_sync`` <= max(1e-4, stale / 100). Prints a
table (without ``--json``), then one JSON object as the last line. Exit code 1 only when a sync fails or
the engine serves the wrong version label; missed targets are reported, not failed.

    agentrl bench sync --full --model-size 0.5b --nproc 2 --syncs 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.core.errors import WeightSyncError
from agentrl.tools.bench.errors import NoMeasurements
from agentrl.tools.bench.models import SIZES

DEFAULT_SYNCS = {"tiny": 10, "0.5b": 5}
"""Syncs per run when ``--syncs`` is not given."""
PROMPTS = 4
"""Generations per batch (train step, and each logprob comparison)."""
PROMPT_TOKENS = 16
"""Random prompt tokens per generation."""
GEN_TOKENS = 16
"""Sampled tokens per generation."""
MEMCPY_REPS = 5
"""Timed repetitions of the reference host copy."""
STAGES = ("pause", "begin", "stream", "gather", "write", "load", "finish", "version_reset", "resume")
"""Stages of :meth:`FullWeightSync.publish` (its ``full_<stage>_ms`` timings) reported as p50s."""


class SyncCheckError(WeightSyncError, RuntimeError):
    """A sync failed on the engine, or the engine serves another version than the one just published."""

    code = "bench.full_sync_check_failed"


# ----------------------------------------------------------------------------------------------- pure helpers
def percentile(xs: Sequence[float], q: float) -> float:
    """The ``q``-quantile of ``xs`` by the nearest rank (NaN when empty)."""
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


def targets_met(full_sync_over_memcpy: float, mae_after: float, mae_stale: float) -> bool:
    """Sync within 4x a host memcpy of the same bytes, and the engine agreeing with the trainer after the
    sync to 1e-4 or to a hundredth of the pre-sync gap, whichever is looser."""
    return bool(full_sync_over_memcpy <= 4.0 and mae_after <= max(1e-4, mae_stale / 100.0))


def summarize(syncs: Sequence[dict[str, float]], memcpy_ms: Sequence[float], weight_bytes: int) -> dict[str, Any]:
    """The JSON figures of a run: ``syncs`` holds one record per sync (the publisher's ``full_*_ms`` stage
    timings plus ``full_sync_ms``, ``logprob_mae_stale`` and ``logprob_mae_after_sync``)."""
    if not syncs:
        raise NoMeasurements("no syncs to summarize")
    col = {k: [float(s[k]) for s in syncs] for k in syncs[0]}
    sync_p50 = percentile(col["full_sync_ms"], 0.5)
    copy_p50 = percentile(memcpy_ms, 0.5)
    after = statistics.fmean(col["logprob_mae_after_sync"])
    stale = statistics.fmean(col["logprob_mae_stale"])
    out: dict[str, Any] = {"full_sync_ms_p50": sync_p50, "full_sync_ms_max": max(col["full_sync_ms"]),
                           "bytes": int(weight_bytes), "memcpy_ms_p50": copy_p50,
                           "memcpy_gib_s": weight_bytes / 2**30 / (copy_p50 / 1e3) if copy_p50 > 0 else float("nan"),
                           "full_sync_over_memcpy": sync_p50 / copy_p50 if copy_p50 > 0 else float("inf")}
    out.update({f"full_{st}_ms_p50": percentile(col[f"full_{st}_ms"], 0.5) for st in STAGES
                if f"full_{st}_ms" in col})
    out.update({"logprob_mae_after_sync": after, "logprob_mae_stale": stale,
                "mae_ratio": after / stale if stale > 0 else float("nan")})
    return out


def samples_of(prompts: Sequence[list[int]], gens: Sequence[Any], version: int,
               advantages: Sequence[float] | None = None) -> list[Any]:
    """Trainer samples of the engine's generations ``gens`` of ``prompts`` (policy ``version``), with the
    engine's logprobs as behaviour logprobs, at temperature 1; advantage 0 unless given."""
    from agentrl.core.types import TrainSample

    advs = list(advantages) if advantages is not None else [0.0] * len(gens)
    out = []
    for prompt, gen, adv in zip(prompts, gens, advs, strict=True):
        n, k = len(prompt), len(gen.token_ids)
        out.append(TrainSample(input_ids=[*prompt, *gen.token_ids], loss_mask=[0] * n + [1] * k,
                               behav_logprobs=[0.0] * n + [float(x) for x in gen.logprobs], advantage=float(adv),
                               versions=[-1] * n + [version] * k, temperature=1.0))
    return out


def logprob_mae(samples: Sequence[Any], trainer_logprobs: Sequence[Sequence[float]]) -> float:
    """Mean |trainer logprob - engine (behaviour) logprob| over the samples' masked tokens."""
    diffs = [abs(lp - b) for s, row in zip(samples, trainer_logprobs, strict=True)
             for lp, b, m in zip(row, s.behav_logprobs, s.loss_mask, strict=True) if m]
    if not diffs:
        raise NoMeasurements("no sampled tokens to compare")
    return sum(diffs) / len(diffs)


# ----------------------------------------------------------------------------------------------- host measures
def memcpy_ms(nbytes: int, reps: int = MEMCPY_REPS) -> list[float]:
    """Times (ms) of ``reps`` copies of ``nbytes`` between two preallocated, pre-touched host buffers, with the
    faster of one intra-op thread and torch's default (a threaded copy can be slower on a busy small host)."""
    import torch

    src = torch.ones(max(1, nbytes), dtype=torch.uint8)
    dst = torch.zeros_like(src)
    default = torch.get_num_threads()
    best: list[float] = []
    try:
        for threads in sorted({1, default}):
            torch.set_num_threads(threads)
            dst.copy_(src)  # warm: every page of both buffers mapped, the thread pool up
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                dst.copy_(src)
                times.append((time.perf_counter() - t0) * 1e3)
            if not best or statistics.median(times) < statistics.median(best):
                best = times
    finally:
        torch.set_num_threads(default)
    return best


def _vm_hwm_gib(pid: int) -> float | None:
    """Peak resident set (VmHWM) of process ``pid`` in GiB, or None when unreadable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 2**30
    except (OSError, ValueError, IndexError):
        return None
    return None


def trainer_peak_rss_gib(launcher_pid: int) -> list[float] | None:
    """Peak RSS (GiB) of each trainer rank, by rank: the launcher's child processes that carry a ``RANK``."""
    try:
        import psutil
    except ImportError:
        return None
    ranks: dict[int, float] = {}
    try:
        for child in psutil.Process(launcher_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error, ValueError):
                rank = child.environ().get("RANK")
                hwm = _vm_hwm_gib(child.pid)
                if rank is not None and hwm is not None:
                    ranks[int(rank)] = max(hwm, ranks.get(int(rank), 0.0))
    except psutil.Error:
        return None
    return [round(ranks[r], 3) for r in sorted(ranks)] or None


# ----------------------------------------------------------------------------------------------- the run
async def _generate(client: Any, prompts: Sequence[list[int]], temperature: float = 1.0) -> list[Any]:
    return list(await asyncio.gather(*(client.generate(p, max_tokens=GEN_TOKENS, temperature=temperature,
                                                       ignore_eos=True) for p in prompts)))


async def _engine_vs_trainer(client: Any, trainer: Any, prompts: list[list[int]], version: int) -> float:
    """Mean |engine - trainer| logprob over fresh temperature-1 samples of ``prompts``."""
    samples = samples_of(prompts, await _generate(client, prompts), version)
    return logprob_mae(samples, await trainer.logprobs(samples))


async def _timed_publish(pub: Any, client: Any, version: int, probe: list[int]) -> dict[str, float]:
    """Publish ``version`` and wait for the first token under it; the publisher's stages plus ``full_sync_ms``."""
    from agentrl.core.versions import engine_label

    t0 = time.perf_counter()
    stages = await pub.publish(version)
    first = await client.generate(probe, max_tokens=1, temperature=0.0)
    took = (time.perf_counter() - t0) * 1e3
    if stages.get("engines_failed"):
        raise SyncCheckError(f"version {version}: {int(stages['engines_failed'])} engine(s) failed the load")
    labels = [label for label, _, _ in first.weight_versions or []]
    if labels[-1:] != [engine_label(version)]:
        raise SyncCheckError(f"version {version} published, but the next token carries the labels {labels}")
    return {**stages, "full_sync_ms": took}


async def _one_sync(pub: Any, client: Any, trainer: Any, version: int, rng: random.Random, vocab: int,
                    probe: list[int]) -> dict[str, float]:
    """Train one step on version ``version - 1``'s samples, then measure the stale gap, the sync (to the first
    token of ``probe`` under the new version) and the gap after it."""

    def prompts() -> list[list[int]]:
        return [[rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]

    batch = prompts()
    advs = [1.0 if i % 2 else -1.0 for i in range(PROMPTS)]
    rng.shuffle(advs)
    await trainer.train(samples_of(batch, await _generate(client, batch), version - 1, advs),
                        policy_version=version - 1)
    stale = await _engine_vs_trainer(client, trainer, prompts(), version - 1)
    rec = await _timed_publish(pub, client, version, probe)
    rec["logprob_mae_stale"] = stale
    rec["logprob_mae_after_sync"] = await _engine_vs_trainer(client, trainer, prompts(), version)
    return rec


async def _measure(args: argparse.Namespace, model_dir: Path, work: Path) -> dict[str, Any]:
    from agentrl.config.trainer import TrainerConfig
    from agentrl.inference.client import InferenceClient
    from agentrl.tools.bench.engine import engine_url
    from agentrl.trainer.client import TrainerProcess
    from agentrl.weight_sync.full import FullWeightSync

    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    trainer = TrainerProcess(TrainerConfig(model_path=str(model_dir), lora=False, lr=args.lr, device="cpu",
                                           micro_batch_tokens=PROMPTS * (PROMPT_TOKENS + GEN_TOKENS)),
                             work / "trainer", nproc=args.nproc)
    starting = asyncio.ensure_future(asyncio.to_thread(trainer.start))  # loads while the engine starts
    try:
        async with engine_url(None, work, model=str(model_dir), dtype="float32", max_model_len=512,
                              enable_lora=False, startup_timeout_s=900) as url:
            await starting
            async with InferenceClient([url], model="base", timeout_s=900) as client:
                with FullWeightSync(trainer, client) as pub:
                    rng = random.Random(args.seed)
                    probe = [rng.randrange(3, vocab) for _ in range(4)]
                    await _timed_publish(pub, client, 0, probe)  # warm-up: dtype, bucket plan, segment
                    prompts = [[rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)] for _ in range(PROMPTS)]
                    initial = await _engine_vs_trainer(client, trainer, prompts, 0)  # same weights: the floor
                    syncs = []
                    for v in range(1, args.syncs + 1):
                        syncs.append(await _one_sync(pub, client, trainer, v, rng, vocab, probe))
                        if not args.json:
                            print(f"sync {v}/{args.syncs}: {syncs[-1]['full_sync_ms']:.1f} ms", file=sys.stderr)
                    nbytes = pub.bytes_per_sync
                    buckets = len(pub.buckets)
            copies = memcpy_ms(nbytes)
            rss = trainer_peak_rss_gib(trainer.proc.pid) if trainer.proc is not None else None
    finally:
        with contextlib.suppress(Exception):  # its failure, if any, was raised above
            await starting
        await asyncio.to_thread(trainer.close)
    out = summarize(syncs, copies, nbytes)
    out.update({"logprob_mae_initial": initial, "buckets": buckets})
    if rss:
        out["trainer_peak_rss_gib_per_rank"] = rss
    return out


def _model_name(size: str) -> str:
    c = SIZES[size]
    return (f"random Qwen2 {size} (hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
            f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads x {c['head_dim']}), fp32, vLLM CPU")


def _table(res: dict[str, Any]) -> str:
    rows = [(k, v) for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v:14.6g}" for k, v in rows]
    if "trainer_peak_rss_gib_per_rank" in res:
        lines.append(f"{'trainer_peak_rss_gib_per_rank':<{width}}  {res['trainer_peak_rss_gib_per_rank']}")
    lines.append(f"{'targets_met':<{width}}  {res['targets_met']}")
    return "\n".join([f"Full-weight sync bench: {res['model']}", *lines])


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="agentrl bench sync --full", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--model-size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--model", type=Path, default=None,
                    help="a model directory to sync instead of a random Qwen2 (e.g. models/smollm2-135m)")
    ap.add_argument("--nproc", type=int, default=2, help="trainer ranks (FSDP2 shards)")
    ap.add_argument("--syncs", type=int, default=None,
                    help=f"timed syncs (default: {', '.join(f'{k} {v}' for k, v in DEFAULT_SYNCS.items())})")
    ap.add_argument("--lr", type=float, default=1e-4, help="trainer learning rate (one step must move the policy)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and advantages")
    ap.add_argument("--work-dir", type=Path, default=None, help="model, logs, trainer files (default: a temp dir)")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code (1 when a sync fails or serves the wrong version label)."""
    from agentrl.tools.bench.engine import scratch_dir
    from agentrl.tools.bench.models import build_random_qwen2
    from agentrl.weight_sync.inplace import SyncError

    ap = _parser()
    args = ap.parse_args(argv)
    if args.nproc < 1:
        ap.error("--nproc must be >= 1")
    args.syncs = DEFAULT_SYNCS.get(args.model_size, 5) if args.syncs is None else args.syncs
    if args.syncs < 1:
        ap.error("--syncs must be >= 1")
    if args.model is not None and not (args.model / "config.json").is_file():
        ap.error(f"--model {args.model}: not a model directory (no config.json)")
    name = f"{args.model}, fp32, vLLM CPU" if args.model is not None else _model_name(args.model_size)
    head = {"model": name, "model_size": None if args.model is not None else args.model_size,
            "nproc": args.nproc, "syncs": args.syncs}
    try:
        with (scratch_dir("agentrl-bench-full-sync-") if args.work_dir is None
              else contextlib.nullcontext(args.work_dir)) as work:
            work = Path(work)
            model_dir = (args.model.resolve() if args.model is not None
                         else build_random_qwen2(work / f"model-{args.model_size}", args.model_size))
            res = {**head, **asyncio.run(_measure(args, model_dir, work))}
    except (SyncError, SyncCheckError) as exc:
        print(json.dumps({**head, "ok": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 1
    res["targets_met"] = targets_met(res["full_sync_over_memcpy"], res["logprob_mae_after_sync"],
                                     res["logprob_mae_stale"])
    if not args.json:
        print(_table(res))
    print(json.dumps(res, default=float))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
