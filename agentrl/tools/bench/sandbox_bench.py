"""``agentrl bench sandbox``: latency and concurrency of Docker sandboxes on this machine.

Prints human-readable lines, then as the LAST line one JSON object: ``start_ms_p50`` (cold container
start, helper included), ``acquire_ms_p50`` (from a full warm pool), ``exec_ms_p50`` (``true`` through the
fast helper), ``exec_docker_ms_p50`` (``true`` through plain ``docker exec``), the same three per OCI
runtime in ``runtimes`` (``--runtimes runc,runsc``; the top-level ones are the first runtime's),
``image_cold_ms_p50`` and ``image_acquire_ms_p50`` (tasks that each name their own image, in order: cold
starts vs. image pools fed by that order), ``concurrent_ok`` (of ``--concurrency`` sandboxes each running a
command at the same time), ``errors`` and a few more.
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


async def _latency(cfg: Any, args: argparse.Namespace, errors: list[str]) -> dict[str, Any]:
    """Cold start and ``true`` exec latency (helper and plain docker exec) of sandboxes made with ``cfg``."""
    from agentrl.sandbox import DockerSandbox

    starts: list[float] = []
    for _ in range(args.n_start):
        t = time.monotonic()
        sb = await DockerSandbox(cfg).start()
        starts.append(time.monotonic() - t)
        await sb.close()
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
                    errors.append(f"exec true ({cfg.runtime}): {r}")
    return {"start_ms_p50": _p50_ms(starts), "exec_ms_p50": _p50_ms(execs),
            "exec_docker_ms_p50": _p50_ms(docker_execs)}


async def _image_tasks(cfg: Any, args: argparse.Namespace, errors: list[str]
                       ) -> tuple[list[float], list[float], dict[str, int]]:
    """Acquire latency for a sequence of tasks that each name their own image (tags of the sandbox image,
    so no build is needed): cold starts, then `ImagePools` fed by the task order. Each episode holds its
    sandbox for ``--episode-s`` (the time the pools have to warm the next image)."""
    import docker

    from agentrl.sandbox import DockerSandbox
    from agentrl.sandbox.image_pools import ImagePools

    client = docker.DockerClient(base_url=cfg.docker_host, timeout=30) if cfg.docker_host else docker.from_env(timeout=30)
    tags = [f"agentrl-bench-task:{os.getpid()}-{i}" for i in range(args.n_image_tasks)]
    for tag in tags:
        repo, name = tag.rsplit(":", 1)
        client.api.tag(cfg.image, repo, name)
    cold: list[float] = []
    pooled: list[float] = []
    stats: dict[str, int] = {}
    try:
        for tag in tags:
            t = time.monotonic()
            sb = await DockerSandbox(cfg.model_copy(update={"image": tag})).start()
            cold.append(time.monotonic() - t)
            await asyncio.sleep(args.episode_s)
            await sb.close()
        pools = await ImagePools(cfg, per_image=1, max_images=2).start()
        try:
            pools.plan(tags)
            await pools.wait_warm(tags[0], timeout=120)
            for tag in tags:
                t = time.monotonic()
                sb = await pools.acquire(tag)
                pooled.append(time.monotonic() - t)
                r = await sb.exec("true")
                if not r.ok:
                    errors.append(f"image task exec: {r}")
                await asyncio.sleep(args.episode_s)
                await pools.release(sb)
            stats = dict(pools.stats)
        finally:
            await pools.close()
    finally:
        for tag in tags:
            try:
                client.api.remove_image(tag)  # only the tag: the image keeps its own name
            except Exception as e:
                errors.append(f"untag {tag}: {e}")
        client.close()
    return cold, pooled, stats


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from agentrl.sandbox import SandboxConfig, SandboxPool, build_image

    errors: list[str] = []
    owner = f"bench-{os.getpid()}-{int(time.time())}"
    t0 = time.monotonic()
    image = await asyncio.to_thread(build_image)
    _say(f"image {image} ready in {time.monotonic() - t0:.2f}s")
    cfg = SandboxConfig(image=image, owner=owner)

    per_runtime: dict[str, dict[str, Any]] = {}
    for runtime in args.runtimes.split(","):
        rcfg = cfg.model_copy(update={"runtime": runtime})
        try:
            per_runtime[runtime] = await _latency(rcfg, args, errors)
        except Exception as e:  # e.g. the runtime is not registered with the engine
            errors.append(f"runtime {runtime}: {e}")
            per_runtime[runtime] = {"error": str(e)[:300]}
        _say(f"[{runtime}] cold start p50 {per_runtime[runtime].get('start_ms_p50')} ms; exec `true` p50 "
             f"{per_runtime[runtime].get('exec_ms_p50')} ms (helper), "
             f"{per_runtime[runtime].get('exec_docker_ms_p50')} ms (docker exec)")
    first = per_runtime[args.runtimes.split(",")[0]]

    acquires: list[float] = []
    async with SandboxPool(cfg, size=args.pool_size, max_concurrency=args.concurrency) as pool:
        for _ in range(args.n_acquire):
            await pool.wait_ready(120)
            t = time.monotonic()
            sb = await pool.acquire()
            acquires.append(time.monotonic() - t)
            await pool.release(sb)
        _say(f"warm acquire: p50 {_p50_ms(acquires)} ms over {len(acquires)} (pool size {args.pool_size})")

    image_cold, image_pooled, image_stats = await _image_tasks(cfg, args, errors)
    _say(f"image tasks ({args.n_image_tasks} images, {args.episode_s}s episodes): acquire p50 "
         f"{_p50_ms(image_cold)} ms cold, {_p50_ms(image_pooled)} ms with image pools ({image_stats})")

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
        "start_ms_p50": first.get("start_ms_p50"),
        "acquire_ms_p50": _p50_ms(acquires),
        "exec_ms_p50": first.get("exec_ms_p50"),
        "exec_docker_ms_p50": first.get("exec_docker_ms_p50"),
        "runtimes": per_runtime,
        "image_cold_ms_p50": _p50_ms(image_cold),
        "image_acquire_ms_p50": _p50_ms(image_pooled),
        "image_acquired_warm": image_stats.get("acquired_warm", 0),
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
    p.add_argument("--runtimes", default="runc", help="comma-separated OCI runtimes to time (e.g. runc,runsc)")
    p.add_argument("--n-image-tasks", type=int, default=6, help="tasks with their own image, in order")
    p.add_argument("--episode-s", type=float, default=1.0, help="how long each image task holds its sandbox")
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
