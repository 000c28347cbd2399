"""Engines in and out of rotation around a load (full weights, a merged adapter): which endpoints are in
rotation, taking out those left with a partial load, and bringing the others live under the new version.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from agentrl.core.errors import EngineError
from agentrl.core.versions import engine_label
from agentrl.weight_sync.base import LoadingEngines
from agentrl.weight_sync.inplace import worker_failures


def live_urls(engine: Any) -> list[str]:
    """The endpoints of ``engine`` (a client or a subset) that are in rotation now."""
    pool = getattr(getattr(engine, "client", engine), "pool", None)
    down = {e.url for e in pool.endpoints if e.down} if pool is not None else set()
    return [u for u in engine.endpoints if u not in down]


async def abandon(engine: LoadingEngines, reasons: dict[str, str]) -> None:
    """Engines left with a partial load: their frozen requests aborted (best effort: an engine that does not
    answer is out already), then out of rotation until a complete load."""
    if not reasons:
        return
    with contextlib.suppress(Exception):
        await engine.subset(list(reasons)).pause("abort")
    for url, why in reasons.items():
        engine.take_out(url, f"incomplete full-weight load: {why}")


async def go_live(engine: LoadingEngines, urls: list[str], version: int, *,
                  set_version: bool = True) -> dict[str, float]:
    """After a complete load on ``urls``: the new version's label, the prefix cache dropped (running requests
    preempted: they recompute their KV under the new weights) and generation resumed. The two stages' ms."""
    t0 = time.perf_counter()
    done = engine.subset(urls)
    if set_version:
        await done.set_weight_version(engine_label(version))
    await done.reset_prefix_cache(running=True)
    t1 = time.perf_counter()
    await done.resume()
    return {"full_version_reset_ms": (t1 - t0) * 1e3, "full_resume_ms": (time.perf_counter() - t1) * 1e3}


async def each_endpoint(engine: LoadingEngines, method: str, kwargs: dict[str, str], urls: list[str],
                        failed: dict[str, str], timeout_s: float) -> list[dict[str, Any]]:
    """Run ``method`` on the endpoints of ``urls`` that have not failed; record the ones that fail now (by url,
    with why). Returns the records of the workers that applied it."""
    todo = [u for u in urls if u not in failed]
    if not todo:
        return []
    try:
        results = await engine.subset(todo).collective_rpc(method, kwargs=kwargs, timeout=timeout_s)
    except EngineError as exc:  # every targeted engine failed the call
        failed.update({u: f"{method}: {exc}" for u in todo})
        return []
    done: list[dict[str, Any]] = []
    for url, workers in zip(todo, results, strict=True):
        bad = worker_failures(workers) or ([] if workers else ["no worker answered"])
        if bad or any(isinstance(w, dict) and w.get("down") for w in workers):
            failed[url] = f"{method}: " + ("; ".join(bad) or "out of rotation")
        else:
            done += [w for w in workers if isinstance(w, dict)]
    return done
