"""``agentrl bench sandbox``: latency and concurrency of Docker sandboxes on this machine.

Prints human-readable lines, then as the LAST line one JSON object: ``start_ms_p50`` (cold container
start, helper included), ``acquire_ms_p50`` (from a full warm pool), ``exec_ms_p50`` (``true`` through the
fast helper), ``exec_docker_ms_p50`` (``true`` through plain ``docker exec``), ``concurrent_ok`` (of
``--concurrency`` sandboxes each running a command at the same time), ``errors`` and a few more.
Every container it makes is removed (the pool destroys sandboxes; ``gc(owner)`` is the backstop).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any


def _p50_ms(xs: list[float]) -> float | None:
    return round(statistics.median(xs) * 1000, 2) if xs else None


def _say(msg: str) -> None:
    print(msg, flush=True)


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.sandbox import DockerSandbox, SandboxConfig, SandboxPool, build_image

    errors: list[str] = []
    owner = f"bench-{os.getpid()}-{int(time.time())}"
    t0 = time.monotonic()
    image = await asyncio.to_thread(build_image)
    _say(f"image {image} ready in {time.monotonic() - t0:.2f}s")
    cfg = SandboxConfig(image=image, owner=owner)

    starts: list[float] = []
    for _ in range(args.n_start):
        t = time.monotonic()
        sb = await DockerSandbox(cfg).start()
        starts.append(time.monotonic() - t)
        await sb.close()
    _say(f"cold start: p50 {_p50_ms(starts)} ms over {len(starts)}")

    execs: list[float] = []
    docker_execs: list[float] = []
    for fast, sink in ((True, execs), (False, docker_execs)):
        async with DockerSandbox(cfg.model_copy(update={"fast_exec": fast})) as sb:
            await sb.exec("true")
            for _ in range(args.n_exec if fast else max(5, args.n_exec // 3)):
                t = time.monotonic()
                r = await sb.exec("true")
                sink.append(time.monotonic() - t)
                if not r.ok:
                    errors.append(f"exec true: {r}")
    _say(f"exec `true`: p50 {_p50_ms(execs)} ms (helper), {_p50_ms(docker_execs)} ms (docker exec)")

    acquires: list[float] = []
    async with SandboxPool(cfg, size=args.pool_size, max_concurrency=args.concurrency) as pool:
        for _ in range(args.n_acquire):
            await pool.wait_ready(120)
            t = time.monotonic()
            sb = await pool.acquire()
            acquires.append(time.monotonic() - t)
            await pool.release(sb)
        _say(f"warm acquire: p50 {_p50_ms(acquires)} ms over {len(acquires)} (pool size {args.pool_size})")

    ok = 0
    conc_exec: list[float] = []
    async with SandboxPool(cfg, size=0, max_concurrency=args.concurrency) as pool:
        t = time.monotonic()

        async def one(i: int) -> bool:
            async with pool.sandbox() as sb:
                r = await sb.exec(f"python3 -c 'print(sum(range({i + 1}0000)))' && sleep 0.5", timeout=60)
                conc_exec.append(r.duration)
                if r.ok and r.output.strip() == str(sum(range((i + 1) * 10000))):
                    return True
                errors.append(f"concurrent #{i}: {r}")
                return False

        results = await asyncio.gather(*(one(i) for i in range(args.concurrency)), return_exceptions=True)
        ok = sum(1 for r in results if r is True)
        errors.extend(f"concurrent: {r!r}" for r in results if isinstance(r, BaseException))
        conc_s = time.monotonic() - t
    _say(f"concurrent: {ok}/{args.concurrency} ok in {conc_s:.2f}s (start + exec + remove)")

    from agentrl.sandbox import gc

    leftovers = await asyncio.to_thread(gc, owner)
    if leftovers:
        errors.append(f"{len(leftovers)} leftover containers removed by gc")
    for e in errors[:10]:
        _say(f"error: {e}")
    return {
        "start_ms_p50": _p50_ms(starts),
        "acquire_ms_p50": _p50_ms(acquires),
        "exec_ms_p50": _p50_ms(execs),
        "exec_docker_ms_p50": _p50_ms(docker_execs),
        "concurrent_ok": ok,
        "concurrency": args.concurrency,
        "concurrent_wall_s": round(conc_s, 2),
        "concurrent_exec_ms_p50": _p50_ms(conc_exec),
        "errors": len(errors),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 0 when every sandbox worked, 1 otherwise, 2 without an engine."""
    p = argparse.ArgumentParser(prog="agentrl bench sandbox", description=__doc__.splitlines()[0])
    p.add_argument("--n-start", type=int, default=5, help="cold starts to time")
    p.add_argument("--n-exec", type=int, default=30, help="trivial execs to time")
    p.add_argument("--n-acquire", type=int, default=10, help="warm acquisitions to time")
    p.add_argument("--pool-size", type=int, default=4, help="warm pool size")
    p.add_argument("--concurrency", type=int, default=32, help="sandboxes running at once")
    args = p.parse_args(argv)
    from agentrl.sandbox import SandboxUnavailable

    try:
        result = asyncio.run(_bench(args))
    except SandboxUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        print(json.dumps({"errors": 1, "error": str(e)}))
        return 2
    print(json.dumps(result))
    return 0 if result["errors"] == 0 and result["concurrent_ok"] == args.concurrency else 1


if __name__ == "__main__":
    raise SystemExit(main())
