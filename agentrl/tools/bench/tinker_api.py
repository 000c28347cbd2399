"""``agentrl bench tinker --clients 1,4,8``: many Tinker training clients on one ``serve-tinker``, side by side.

One server (started here on the embedded tiny model, or ``--model``; ``--url`` for one already running) and,
for each count N of ``--clients``, N clients of the official tinker SDK in N threads, each running
``--steps`` RL-shaped steps: ``forward_backward`` of a batch (``--batch`` datums of ``--seq-len`` tokens,
``importance_sampling``), ``optim_step``, ``save_weights_and_get_sampling_client`` (the client's live adapter
updated in place) and ``sample`` (``--samples`` sequences of ``--max-tokens``). A warm-up client step starts
the sampling engine first, unmeasured.

Per count: ``steps_per_s`` (client steps over the phase's wall time), ``trained_tokens_per_s``,
``sampled_tokens_per_s`` (in all, and per client: ``per_client_...``), and ``steps_per_s_over_one`` (against the one-client phase of the same run: what
sharing one trainer and one engine among N clients gives). Then, with the server stopped, the same workload
on agentrl's own trainer and engine calls in this process (:mod:`agentrl.tools.bench.tinker_direct`; skip
with ``--no-direct``): ``api_overhead`` per count is how much longer the API took for the same steps
(``direct steps/s / API steps/s - 1``), and ``publish_engine_ms_p50`` the engine's time of an in-place
adapter publish. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from agentrl.tools.bench.engine import scratch_dir

NAME = "bench-tinker"
KEY = "tml-agentrl-bench-key"


@contextlib.contextmanager
def _server(model: str, work: Path, args: argparse.Namespace) -> Iterator[str]:
    """``agentrl serve-tinker`` on ``model`` in its own process group, until the block ends."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    log = (work / "server.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "serve-tinker", "--model", model, "--model-name",
                             "bench", "--port", str(port), "--dir", str(work / "state"),
                             "--max-adapters", str(args.max_adapters), "--max-rank", str(args.max_rank)],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{NAME}: serve-tinker did not start; see {work / 'server.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()


def _batch(args: argparse.Namespace, vocab: int) -> list[Any]:
    import numpy as np
    from tinker import types

    rng = np.random.default_rng(args.seed)
    out = []
    for _ in range(args.batch):
        toks = rng.integers(3, vocab, size=args.seq_len + 1)
        n = args.seq_len
        out.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1].tolist()), loss_fn_inputs={
            "target_tokens": toks[1:].astype(np.int64), "logprobs": np.full(n, -5.0, dtype=np.float32),
            "advantages": rng.standard_normal(n).astype(np.float32)}))
    return out


def phase(args: argparse.Namespace, clients: int, wall: float, sampled: int) -> dict[str, float]:
    """One phase's figures: steps/s, trained (``forward_backward`` + ``optim_step``) and sampled tokens/s, in
    all and per client."""
    steps = clients * args.steps
    trained = steps * args.batch * args.seq_len
    return {"wall_s": round(wall, 3), "steps_per_s": round(steps / wall, 4),
            "trained_tokens_per_s": round(trained / wall, 1), "sampled_tokens_per_s": round(sampled / wall, 1),
            "per_client_trained_tokens_per_s": round(trained / wall / clients, 1),
            "per_client_sampled_tokens_per_s": round(sampled / wall / clients, 1)}


def _client_steps(service: Any, base: str, data: list[Any], args: argparse.Namespace, steps: int) -> int:
    """One client's ``steps`` steps; returns the tokens it sampled."""
    from tinker import types

    tc = service.create_lora_training_client(base_model=base, rank=args.rank, seed=args.seed).result()
    prompt = types.ModelInput.from_ints(data[0].model_input.to_ints()[:8])
    sampled = 0
    for _ in range(steps):
        fb = tc.forward_backward(data, "importance_sampling")
        opt = tc.optim_step(types.AdamParams(learning_rate=1e-4))
        fb.result()
        opt.result()
        sampler = tc.save_weights_and_get_sampling_client().result()
        res = sampler.sample(prompt, num_samples=args.samples, sampling_params=types.SamplingParams(
            max_tokens=args.max_tokens, temperature=1.0, stop=[])).result()
        sampled += sum(len(s.tokens) for s in res.sequences)
    return sampled


def measure(args: argparse.Namespace, url: str) -> dict[str, Any]:
    import tinker

    service = tinker.ServiceClient(base_url=url, api_key=args.api_key)
    caps = httpx.get(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": args.api_key}, timeout=30).json()
    base = caps["supported_models"][0]["model_name"]
    vocab = int(args.vocab)
    data = _batch(args, vocab)
    _client_steps(service, base, data, args, 1)  # warm-up: starts the sampling engine
    phases: dict[str, dict[str, float]] = {}
    for n in args.clients:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            sampled = sum(pool.map(lambda _: _client_steps(service, base, data, args, args.steps), range(n)))
        wall = time.perf_counter() - t0
        phases[str(n)] = phase(args, n, wall, sampled)
    one = phases.get("1", {}).get("steps_per_s")
    for p in phases.values():
        p["steps_per_s_over_one"] = round(p["steps_per_s"] / one, 3) if one else float("nan")
    service.close("success").result()
    return {"bench": "tinker", "clients": phases, "steps": args.steps, "batch": args.batch,
            "seq_len": args.seq_len, "samples": args.samples, "max_tokens": args.max_tokens, "rank": args.rank}


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(prog="agentrl bench tinker", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default="1,4,8", help="client counts, one phase each")
    parser.add_argument("--steps", type=int, default=3, help="steps of each client in a phase")
    parser.add_argument("--batch", type=int, default=8, help="datums of a forward_backward")
    parser.add_argument("--seq-len", type=int, default=64, help="tokens of a datum")
    parser.add_argument("--samples", type=int, default=4, help="sequences of a sample")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens of a sampled sequence")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank of every client")
    parser.add_argument("--max-adapters", type=int, default=4, help="engine LoRA slots (serve-tinker --max-adapters)")
    parser.add_argument("--max-rank", type=int, default=32, help="the engine's largest rank (serve-tinker --max-rank)")
    parser.add_argument("--no-direct", action="store_true",
                        help="skip the same workload on agentrl's own trainer and engine calls (the API's baseline)")
    parser.add_argument("--model", default=None, help="model directory (default: the embedded tiny model)")
    parser.add_argument("--url", default=None, help="a serve-tinker already running (default: start one)")
    parser.add_argument("--api-key", default=KEY, help="the key sent to --url")
    parser.add_argument("--vocab", type=int, default=900, help="token ids are drawn below this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="(accepted: the last line is always JSON)")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in str(args.clients).split(",") if c.strip()]
    if args.url:
        res = measure(args, args.url)
    else:
        import asyncio

        from agentrl.tools.bench.engine import bench_model

        model = asyncio.run(bench_model(args.model))
        with scratch_dir(f"agentrl-{NAME}-") as work:
            with _server(model, work, args) as url:
                res = measure(args, url)
            if not args.no_direct:  # after the server is gone: the two never share the machine
                from agentrl.tools.bench.tinker_direct import measure_direct, wire_batch

                direct = asyncio.run(measure_direct(args, model, work / "direct",
                                                    wire_batch(_batch(args, int(args.vocab)))))
                res["direct"] = direct
                for n, p in res["clients"].items():
                    d = direct["clients"][n]
                    p["api_overhead"] = round(d["steps_per_s"] / p["steps_per_s"] - 1, 4)
    for n, p in res["clients"].items():
        extra = f", the API adds {p['api_overhead']:+.1%} over agentrl's own calls" if "api_overhead" in p else ""
        print(f"{n} client(s): {p['steps_per_s']} steps/s ({p['steps_per_s_over_one']} x one client), "
              f"{p['trained_tokens_per_s']} trained tokens/s, {p['sampled_tokens_per_s']} sampled tokens/s{extra}")
    if res.get("direct"):
        print(f"agentrl's own calls: {res['direct']['clients']}; in-place publish engine_ms p50 "
              f"{res['direct']['publish_engine_ms_p50']} over {res['direct']['publishes']} publishes")
    print(json.dumps(res))
    return 0
