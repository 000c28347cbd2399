"""``agentrl bench sync``: in-place LoRA sync over shared memory and over the network vs. the file-based
reload, on one vLLM server.

Starts ONE vLLM server on a random Qwen2 model (``--model-size``) or a model directory (``--model``), loads a
rank-``--rank`` adapter on every linear layer (``--targets attention``: q/k/v/o) once from a file (with
``--slots N``, ``N - 1`` other adapters loaded and run beside it, so that the updates land in one slot of
``N`` held), checks
that an in-place update gives the same greedy logprobs as a file load of the same tensors, then times
``--updates`` in-place updates (engine-side copy, HTTP round trip, first token under the new version),
as many in-place updates over the network path (the tensors in the request body, as for an engine on
another host: ``network_*``), and as many file-based in-place reloads. ``memcpy_ms_p50`` is one in-process
copy of the adapter's bytes between two buffers, measured in the same run (``engine_over_memcpy``), with warm
caches; ``cold_memcpy_ms_p50`` the same copy after the caches were emptied, the floor of the engine's copy,
which runs between forward passes (``engine_copy_over_cold_memcpy``: the copy alone, ``engine_copy_ms``, over
it; ``engine_copies`` says how many copies the engine made). The shared-memory path runs twice, over HTTP and over the engine core's local
control socket (``control_*``: :mod:`agentrl.weight_sync.control`), each also timed as training runs it under a
generation in flight (``in_flight_end_to_end_ms``: the hot sequence, then the first streamed token under the new
version). Beside them, the engine's own floors of those figures, measured in the same loops: ``request_ms`` (the
same one-token request with nothing published before it; ``sync_adds_ms`` is end to end minus it) and
``token_gap_ms`` (two tokens of a running stream with no update between them: a decode step and the stream's
delivery). Prints a table, then one JSON object as the last line.

``--full`` runs the full-weight sync benchmark instead (a trainer's whole model into the engine:
:mod:`agentrl.tools.bench.full_sync`, which takes its own options).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.tools.bench.errors import BenchFailed
from agentrl.tools.bench.models import (
    SIZES,
    FixedAdapter,
    build_random_qwen2,
    lora_shapes,
    random_lora,
    save_lora,
)

NAME = "policy"


def _p(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else float("nan")


async def _greedy(client: Any, prompt: list[int], n: int) -> Any:
    return await client.generate(prompt, max_tokens=n, temperature=0.0, model=NAME)


async def _check(client: Any, sync: Any, trainer: FixedAdapter, shapes: dict, work: Path, rank: int,
                 prompt: list[int]) -> dict[str, Any]:
    """In-place update == file load of the same tensors (greedy tokens and logprobs), and both caches agree."""
    before = await _greedy(client, prompt, 8)  # also fills the prefix cache under the old weights
    trainer.tensors = random_lora(shapes, seed=1)
    await sync.publish(1)
    inplace = await _greedy(client, prompt, 8)
    sums = (await client.collective_rpc("agentrl_lora_checksum", kwargs={"adapter": NAME}, timeout=30))[0][0]
    await client.load_lora_adapter(NAME, str(save_lora(work / "check", trainer.tensors, rank, 2 * rank)))
    from_file = await _greedy(client, prompt, 8)
    diff = max((abs(a - b) for a, b in zip(inplace.logprobs, from_file.logprobs, strict=True)), default=0.0)
    versions = [v for v, _, _ in inplace.weight_versions or []]
    res = {"tokens_equal": inplace.token_ids == from_file.token_ids, "max_abs_logprob_diff": diff,
           "changed": before.token_ids != inplace.token_ids or before.logprobs != inplace.logprobs,
           "cache_matches_live": abs(sums["cached"] - sums["live"]) <= 1e-6 * max(1.0, sums["cached"]),
           "version_label": versions[-1] if versions else None}
    res["ok"] = bool(res["tokens_equal"] and diff <= 1e-4 and res["changed"] and res["cache_matches_live"])
    return res


COLD_EVICT_BYTES = 64 << 20
"""What :func:`memcpy_ms` writes before each timed copy when ``cold``: more than this host's caches hold."""


def memcpy_ms(nbytes: int, reps: int = 50, cold: bool = False) -> float:
    """Median time of one in-process copy of ``nbytes`` bytes between two preallocated buffers (the floor an
    in-engine copy of an adapter of that size is measured against). ``cold``: the caches emptied before each
    copy (``COLD_EVICT_BYTES`` written), as for an engine's copy, which runs between two forward passes that
    left other data in the caches, from a segment another process wrote."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    evict = torch.zeros(COLD_EVICT_BYTES if cold else 0, dtype=torch.uint8)
    times = []
    for _ in range(reps + 3):
        evict.add_(1)
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append((time.perf_counter() - t0) * 1e3)
    return _p(times[3:], 0.5)


async def _in_flight(client: Any, sync: Any, trainer: FixedAdapter, updates: list[dict[str, torch.Tensor]],
                     prompt: list[int], first: int, per_stream: int = 4,
                     gap_s: float = 0.02) -> tuple[list[float], list[float]]:
    """The hot sequence as training runs it (:func:`agentrl.orchestrator.loop.live_update`: a ``keep`` pause
    around the publish unless the publisher is atomic), under greedy generations in flight: per update, ms from
    its start to the arrival of the first streamed token that carries its version (``per_stream`` updates,
    ``gap_s`` apart, into each generation); and the ms between two tokens of the same streams that no update
    came between (the engine's own pace: a decode step and the stream's delivery, the floor of the first)."""
    from agentrl.core.versions import engine_label
    from agentrl.orchestrator.loop import live_update

    out: list[float] = []
    gaps: list[float] = []
    version = first
    todo = list(updates)
    while todo:
        arrivals: list[float] = []
        going = asyncio.Event()

        def on_tokens(ids: list[int], arrivals: list[float] = arrivals, going: asyncio.Event = going) -> None:
            arrivals.extend([time.perf_counter()] * len(ids))
            if len(arrivals) >= 8:
                going.set()

        task = asyncio.create_task(client.generate(prompt, max_tokens=400, temperature=0.0, model=NAME,
                                                   ignore_eos=True, on_tokens=on_tokens))
        await going.wait()
        starts: dict[str, float] = {}
        for _ in range(min(per_stream, len(todo))):
            trainer.tensors = todo.pop(0)
            version += 1
            starts[engine_label(version)] = time.perf_counter()
            await live_update(client, sync, version, paused=True, mode="keep")
            await asyncio.sleep(gap_s)
        gen = await task
        firsts = set()
        for label, start, _ in gen.weight_versions or []:
            if label in starts and start < len(arrivals):
                out.append((arrivals[start] - starts.pop(label)) * 1e3)
                firsts.add(start)
        # tokens that arrived one by one, each after a token of the same version (the stream's steady pace)
        gaps += [(arrivals[i] - arrivals[i - 1]) * 1e3 for i in range(9, len(arrivals))
                 if i not in firsts and arrivals[i] > arrivals[i - 1]]
    return out, gaps


async def _time_path(client: Any, sync: Any, trainer: FixedAdapter, shapes: dict, work: Path, rank: int,
                     prompt: list[int], updates: int, first: int) -> tuple[dict, dict[str, list[float]], list[float],
                                                                           tuple[list[float], list[float]]]:
    """One sync path: its correctness check, then ``updates`` publishes each followed by a one-token request
    (its stages, and publish -> that token), each beside the same request with no publish before it (the
    engine's own latency, ``request_ms``: the floor of publish -> token), then as many under a generation in
    flight (:func:`_in_flight`)."""
    check = await _check(client, sync, trainer, shapes, work, rank, prompt)
    await sync.publish(first)  # warm: plan rebuilt for the adapter object the file load created
    stages: dict[str, list[float]] = {"request_ms": []}
    e2e: list[float] = []
    for i in range(updates):
        trainer.tensors = random_lora(shapes, seed=100 + i)
        t0 = time.perf_counter()
        m = await sync.publish(first + 1 + i)
        await client.generate(prompt[:8], max_tokens=1, temperature=0.0, model=NAME)
        e2e.append((time.perf_counter() - t0) * 1e3)
        for k, v in m.items():
            stages.setdefault(k, []).append(v)
        t0 = time.perf_counter()  # the same request with nothing published before it (cached prompt as above)
        await client.generate(prompt[:8], max_tokens=1, temperature=0.0, model=NAME)
        stages["request_ms"].append((time.perf_counter() - t0) * 1e3)
    lone = [random_lora(shapes, seed=first + 1000 + i) for i in range(updates)]
    return check, stages, e2e, await _in_flight(client, sync, trainer, lone, prompt, first + 1000)


async def _hold_slots(client: Any, shapes: dict, work: Path, rank: int, others: int, prompt: list[int]) -> None:
    """Load ``others`` more adapters and run one token on each, so that they hold slots of the engine beside the
    benchmarked one (whose updates then copy into one slot of a buffer of many)."""
    for k in range(others):
        name = f"{NAME}-held{k}"
        await client.load_lora_adapter(name, str(save_lora(work / f"held{k}", random_lora(shapes, seed=9000 + k),
                                                           rank, 2 * rank)))
        await client.generate(prompt, max_tokens=1, temperature=0.0, model=name)


async def _run(url: str, shape: str | dict, rank: int, updates: int, work: Path, targets: tuple[str, ...],
               slots: int = 1, unembed: bool = False) -> dict[str, Any]:
    from agentrl.inference.client import InferenceClient
    from agentrl.weight_sync.control import controlled
    from agentrl.weight_sync.network import NetworkAdapterSync
    from agentrl.weight_sync.shm import SharedMemoryAdapterSync

    shapes = lora_shapes(shape, rank, targets, output_layer=unembed)
    gen = torch.Generator().manual_seed(123)
    prompt = torch.randint(3, 300, (48,), generator=gen).tolist()
    short = prompt[:8]
    async with InferenceClient([url], model=NAME, timeout_s=300) as client:
        trainer = FixedAdapter(random_lora(shapes, seed=0))
        await client.load_lora_adapter(NAME, str(save_lora(work / "v0", trainer.tensors, rank, 2 * rank)))
        await _hold_slots(client, shapes, work, rank, slots - 1, short)
        # B goes pre-scaled, as a run sends it (the adapters here are saved with alpha = 2 r: scaling 2)
        with SharedMemoryAdapterSync(trainer, client, NAME, b_scale=2.0) as sync:
            check, stages, e2e, (inflight_http, gaps_http) = await _time_path(
                client, sync, trainer, shapes, work, rank, prompt, updates, 10)
        nbytes = int(stages["adapter_bytes"][0])
        async with controlled(client) as fast:
            if not fast.atomic:
                raise BenchFailed("the engine opened no control socket: " + ", ".join(fast.endpoints))
            with SharedMemoryAdapterSync(trainer, fast, NAME, b_scale=2.0) as csync:
                check_control, ctl, ctl_e2e, (inflight_control, gaps_control) = await _time_path(
                    client, csync, trainer, shapes, work, rank, prompt, updates, 3000)
        net = NetworkAdapterSync(trainer, client, NAME, work / "network", b_scale=2.0)
        net_stages: dict[str, list[float]] = {}
        net_e2e: list[float] = []
        for i in range(updates + 1):
            trainer.tensors = random_lora(shapes, seed=500 + i)
            t0 = time.perf_counter()
            m = await net.publish(100 + i)
            await client.generate(short, max_tokens=1, temperature=0.0, model=NAME)
            if i == 0:
                continue  # warm: the worker's receive buffer and copy plan are built once per layout
            net_e2e.append((time.perf_counter() - t0) * 1e3)
            for k, v in m.items():
                net_stages.setdefault(k, []).append(v)
        http_reset, save_ms, load_ms, file_e2e, file_engine = [], [], [], [], []
        for _ in range(min(updates, 20)):
            t0 = time.perf_counter()
            await client.reset_prefix_cache()
            http_reset.append((time.perf_counter() - t0) * 1e3)
        for i in range(updates):
            t0 = time.perf_counter()
            path = save_lora(work / f"f{i:04d}", random_lora(shapes, seed=1000 + i), rank, 2 * rank)
            t1 = time.perf_counter()
            await client.load_lora_adapter(NAME, str(path))  # a new path: new prefix-cache key, no reset needed
            t2 = time.perf_counter()
            await client.generate(short, max_tokens=1, temperature=0.0, model=NAME)
            stats = (await client.collective_rpc("agentrl_lora_stats", timeout=30))[0][0]
            file_engine.append(float(stats.get("last_file_load_ms", "nan")))
            save_ms.append((t1 - t0) * 1e3)
            load_ms.append((t2 - t1) * 1e3)
            file_e2e.append((time.perf_counter() - t1) * 1e3)
    out: dict[str, Any] = {f"{k}_p50": _p(v, 0.5) for k, v in stages.items() if k.endswith("_ms")}
    out.update({f"{k}_p50": _p(v, 0.5) for k, v in net_stages.items() if k.endswith("_ms")})
    out.update({
        "network_end_to_end_ms_p50": _p(net_e2e, 0.5), "network_payload_bytes": int(net_stages["network_payload_bytes"][0]),
        "engine_ms_p90": _p(stages["engine_ms"], 0.9), "end_to_end_ms_p50": _p(e2e, 0.5),
        "end_to_end_ms_p90": _p(e2e, 0.9), "file_load_ms_p50": _p(load_ms, 0.5),
        "file_load_ms_p90": _p(load_ms, 0.9), "file_save_ms_p50": _p(save_ms, 0.5),
        "file_end_to_end_ms_p50": _p(file_e2e, 0.5), "file_engine_ms_p50": _p(file_engine, 0.5), "prefix_reset_http_ms_p50": _p(http_reset, 0.5),
        "adapter_bytes": nbytes, "updates": updates, "slots_held": slots, "correctness": check,
        "engine_copies": int(max(stages.get("engine_copies", [0]))),  # 1: the slots laid out as the segment
        "in_flight_end_to_end_ms_p50": _p(inflight_http, 0.5), "in_flight_end_to_end_ms_p90": _p(inflight_http, 0.9),
    })
    out.update({f"control_{k}_p50": _p(v, 0.5) for k, v in ctl.items() if k.endswith("_ms")})
    out.update({
        "control_end_to_end_ms_p50": _p(ctl_e2e, 0.5), "control_end_to_end_ms_p90": _p(ctl_e2e, 0.9),
        "control_in_flight_end_to_end_ms_p50": _p(inflight_control, 0.5),
        "control_in_flight_end_to_end_ms_p90": _p(inflight_control, 0.9),
        "in_flight_samples": min(len(inflight_http), len(inflight_control)), "correctness_control": check_control,
        # the engine's own floors: a one-token request with nothing published, a token of a running stream
        "token_gap_ms_p50": _p(gaps_http + gaps_control, 0.5),
    })
    out["sync_adds_ms_p50"] = out["end_to_end_ms_p50"] - out["request_ms_p50"]
    out["control_sync_adds_ms_p50"] = out["control_end_to_end_ms_p50"] - out["control_request_ms_p50"]
    out["control_in_flight_over_token_gap"] = out["control_in_flight_end_to_end_ms_p50"] / out["token_gap_ms_p50"]
    out["control_publish_speedup"] = out["total_ms_p50"] / out["control_total_ms_p50"]
    out["control_in_flight_speedup"] = (out["in_flight_end_to_end_ms_p50"]
                                        / out["control_in_flight_end_to_end_ms_p50"])
    out["memcpy_ms_p50"] = memcpy_ms(nbytes)
    out["engine_over_memcpy"] = out["engine_ms_p50"] / out["memcpy_ms_p50"]
    out["cold_memcpy_ms_p50"] = memcpy_ms(nbytes, reps=20, cold=True)
    out["engine_copy_over_cold_memcpy"] = out["engine_copy_ms_p50"] / out["cold_memcpy_ms_p50"]
    out["speedup_vs_file"] = out["file_load_ms_p50"] / out["engine_ms_p50"]
    out["speedup_engine_vs_file_engine"] = out["file_engine_ms_p50"] / out["engine_ms_p50"]
    out["speedup_rpc_vs_file"] = out["file_load_ms_p50"] / out["rpc_ms_p50"]
    out["speedup_end_to_end_vs_file"] = out["file_end_to_end_ms_p50"] / out["end_to_end_ms_p50"]
    out["network_end_to_end_vs_file"] = out["file_end_to_end_ms_p50"] / out["network_end_to_end_ms_p50"]
    return out


def _table(res: dict[str, Any]) -> str:
    rows = [(k, v) for k, v in res.items() if isinstance(v, float)]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v:10.3f}" for k, v in rows]
    lines.append(f"{'correctness':<{width}}  {res['correctness']}")
    lines.append(f"{'correctness_control':<{width}}  {res['correctness_control']}")
    return "\n".join([f"LoRA sync bench: {res['model']}", *lines])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit code (1 when the correctness check fails). ``--full`` hands the
    other arguments to the full-weight sync benchmark."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--full", action="store_true")
    known, rest = pre.parse_known_args(argv)
    if known.full:
        from agentrl.tools.bench import full_sync

        return full_sync.main(rest)
    ap = argparse.ArgumentParser(prog="agentrl bench sync", description=__doc__)
    ap.add_argument("--full", action="store_true",
                    help="benchmark full-weight sync instead (see agentrl bench sync --full --help)")
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--model-size", choices=sorted(SIZES), default="tiny", help="a random Qwen2 of this shape")
    ap.add_argument("--model", type=Path, default=None, help="a model directory to serve instead (e.g. models/smollm2-135m)")
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--slots", type=int, default=1,
                    help="adapters held in the engine's slots at once: the benchmarked one and slots - 1 others, each "
                         "loaded and run once first (the engine gets max_loras = max(2, slots))")
    ap.add_argument("--targets", choices=("all", "attention"), default="all",
                    help="the adapter's modules: every linear layer (the default LoRA) or q/k/v/o")
    ap.add_argument("--unembed", action="store_true",
                    help="the adapter has a LoRA on the output layer too (trainer.lora_train_unembed)")
    ap.add_argument("--work-dir", type=Path, default=None, help="model/adapters/logs (default: a temp dir)")
    full = ap.add_argument_group("with --full only", "options of the full-weight benchmark (agentrl.tools.bench.full_sync)")
    for flag, what in (("--nproc", "trainer ranks"), ("--syncs", "syncs to time"), ("--lr", "trainer learning rate"),
                       ("--seed", "seed of the prompts and advantages")):
        full.add_argument(flag, default=None, help=f"{what} (see agentrl bench sync --full --help)")
    args = ap.parse_args(argv)
    given = [f"--{k}" for k in ("nproc", "syncs", "lr", "seed") if getattr(args, k) is not None]
    if given:
        ap.error(f"{', '.join(given)} belong to the full-weight benchmark: add --full")

    from agentrl.config.inference import engine_lora_rank
    from agentrl.config.trainer import ALL_LINEAR, OUTPUT_LAYER
    from agentrl.inference import VLLMServer, VLLMServerConfig
    from agentrl.tools.bench.models import ATTENTION

    targets = tuple(ALL_LINEAR) if args.targets == "all" else ATTENTION
    modules = [*targets, *([OUTPUT_LAYER] if args.unembed else [])]  # what the engine wraps
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-sync-") as tmp:
        work = Path(args.work_dir or tmp)
        model_dir = args.model or build_random_qwen2(work / f"model-{args.model_size}", args.model_size)
        shape: str | dict = json.loads((model_dir / "config.json").read_text())  # its vocabulary, for lm_head
        cfg = VLLMServerConfig(model=str(model_dir), dtype="float32", max_model_len=512,
                               max_lora_rank=engine_lora_rank(args.rank),
                               max_loras=max(2, args.slots),
                               lora_target_modules=modules,
                               startup_timeout_s=900)
        with VLLMServer(cfg, work / "logs") as server:
            res = asyncio.run(_run(server.url, shape, args.rank, args.updates, work / "adapters", targets,
                                   args.slots, args.unembed))
    if args.model:
        name = f"{args.model}"
    else:
        c = SIZES[args.model_size]
        name = (f"random Qwen2 {args.model_size} (hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
                f"{c['num_attention_heads']}/{c['num_key_value_heads']} heads x {c['head_dim']})")
    held = f"; {args.slots} adapters held in slots" if args.slots > 1 else ""
    res = {"model": f"{name}, fp32, vLLM CPU; LoRA r={args.rank} on {'/'.join(modules)}{held}", "rank": args.rank,
           **res}
    if not args.json:
        print(_table(res))
    print(json.dumps(res, default=float))
    return 0 if res["correctness"]["ok"] and res["correctness_control"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
