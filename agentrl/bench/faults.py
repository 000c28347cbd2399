"""``agentrl bench faults``: a real training run that loses an engine mid-step and gets it back.

Starts two vLLM servers on the embedded tiny model (or uses a running one as A: ``--engine-a``) and trains on ``calc`` against both (``--endpoint`` x2,
small steps, sync mode). Once step ``--kill-after-step`` is recorded, engine B is killed with SIGKILL
while the next step generates; ``--restart-after-s`` later it is started again on the same port. The run
must go on with engine A alone, take B back between two steps only after republishing the current
adapter and version to it, and finish every step: it is asked for ``--steps-after-rejoin`` more steps once
B is back (at most ``--max-steps`` in all). Afterwards the bench asks B directly which policy version it
serves, and compares B's greedy answer with A's. The last line is one JSON object:

- ``steps_requested`` (the steps the run was finally asked for), ``steps_completed``;
- ``groups_lost_unrecorded``: groups admitted but neither trained on, dropped, released nor buffered when
  the run ended (from the run's final ``groups`` record): must be 0;
- ``episodes_failed_by_fault``: episodes recorded as ``inference_error`` (requests in flight on B are
  retried on A from their token prefix, so this is usually 0);
- ``engine_rejoined``: B came back into rotation during the run;
- ``version_after_rejoin_ok``: B serves the run's final policy version;
- ``weights_after_rejoin_match``: B's greedy tokens for a fixed prompt are A's, logprobs within 1e-4 (B got
  the trained adapter itself, not only its version label).

    agentrl bench faults --json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agentrl.orchestrator.metrics import groups_lost_unrecorded, records_of


async def kill_engine(server: Any) -> None:
    """SIGKILL to ``server``'s process group (its engine core and workers too), as a crash would."""
    os.killpg(server.pgid, signal.SIGKILL)
    await asyncio.to_thread(server.proc.wait, 30)


def engine_again(server: Any) -> Any:
    """A new (not started) vLLM server of ``server``'s config on its port, logging beside it."""
    from agentrl.inference import VLLMServer

    return VLLMServer(server.cfg.model_copy(update={"port": server.port}), server.log_dir)


async def _fault(run: Any, metrics: Path, server: Any, kill_after_step: int, restart_after_s: float,
                 steps_after_rejoin: int, events: dict[str, Any]) -> None:
    """Kill ``server`` while the step after ``kill_after_step`` generates; start it again later; once it
    rejoined, let ``run`` do ``steps_after_rejoin`` more steps."""
    for _ in iter(int, 1):  # the run's metrics file is the only signal: poll it
        if any(r["step"] >= kill_after_step for r in records_of(metrics, "train")):
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.5)  # into the next step's generation
    await kill_engine(server)
    events["killed_at_s"] = time.perf_counter()
    await asyncio.sleep(restart_after_s)
    again = engine_again(server)
    await asyncio.to_thread(again.start)
    events["restarted"] = again
    events["restarted_after_s"] = time.perf_counter() - events["killed_at_s"]
    for _ in iter(int, 1):
        back = [r["step"] for r in records_of(metrics, "train") if r.get("engines_rejoined")]
        if back:
            run.cfg.steps = min(run.cfg.steps, back[0] + steps_after_rejoin)  # read between steps
            return
        await asyncio.sleep(0.5)


def engine_pair_config(model: str) -> Any:
    """The server config of the two engines of a fault benchmark (the embedded model, LoRA, a 1024 window)."""
    from agentrl.inference import VLLMServerConfig

    return VLLMServerConfig(model=model, dtype="float32", max_model_len=1024, max_lora_rank=16, max_loras=2,
                            startup_timeout_s=600)


async def run_faults(max_steps: int, kill_after_step: int, restart_after_s: float, steps_after_rejoin: int,
                     work: Path, engine_a: str | None = None) -> dict[str, Any]:
    """Run the benchmark in ``work``; ``engine_a`` is the URL of a running engine on the embedded model (with
    LoRA) to use as A, which is then neither started nor stopped here. B is always the bench's own."""
    from agentrl.config.run import DEFAULT_MODEL, load_config
    from agentrl.inference import InferenceClient, VLLMServer
    from agentrl.launch.stack import ensure_model
    from agentrl.orchestrator.run import TrainingRun

    model = str(Path(ensure_model(DEFAULT_MODEL)).resolve())
    scfg = engine_pair_config(model)
    a = None if engine_a else VLLMServer(scfg, work / "engine-a")
    b = VLLMServer(scfg, work / "engine-b")
    events: dict[str, Any] = {}
    try:
        for server in (a, b):
            if server is not None:
                await asyncio.to_thread(server.start)
        url_a = engine_a or a.url
        cfg = load_config(None, {
            "env": "calc", "name": "faults", "output_dir": str(work / "runs"), "model": model, "steps": max_steps,
            "tasks_per_step": 4, "group_size": 4, "max_concurrency": 16, "eval_every": 0, "eval_size": 8,
            "checkpoint_every": 0, "engine_warmup": False, "endpoints": [url_a, b.url],
            "inference": {"max_model_len": 1024}, "sampling": {"max_context_tokens": 1024},
        })
        run = TrainingRun(cfg, progress=False)
        metrics = run.run_dir / "metrics.jsonl"
        fault = asyncio.create_task(_fault(run, metrics, b, kill_after_step, restart_after_s, steps_after_rejoin,
                                           events))
        t0 = time.perf_counter()
        try:
            summary = await run.run()
        finally:
            if not fault.done():
                fault.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fault
        wall = time.perf_counter() - t0
        fault_error = None if fault.cancelled() else fault.exception()
        train = records_of(metrics, "train")
        groups = records_of(metrics, "groups")[-1]
        served, weights_match = None, False
        if events.get("restarted") is not None:
            gens = []
            for url in (url_a, b.url):
                async with InferenceClient([url], timeout_s=60) as direct:
                    gens.append(await direct.generate(list(range(5, 45)), max_tokens=8, temperature=0.0,
                                                      model=cfg.adapter_name, ignore_eos=True))
            served = gens[1].weight_versions[-1][0] if gens[1].weight_versions else None
            weights_match = gens[0].token_ids == gens[1].token_ids and max(
                abs(x - y) for x, y in zip(gens[0].logprobs, gens[1].logprobs, strict=True)) < 1e-4
        return {
            "steps_requested": run.cfg.steps,
            "steps_completed": len(train),
            "groups_lost_unrecorded": groups_lost_unrecorded(groups),
            "groups_admitted": int(groups["groups_admitted"]),
            "episodes_failed_by_fault": int(sum(r.get("stop_inference_error", 0) for r in train)),
            "episodes_failed": int(sum(r.get("num_failed", 0) for r in train)),
            "engine_killed": "killed_at_s" in events,
            "engine_restarted_after_s": events.get("restarted_after_s"),
            "engine_rejoined": sum(r.get("engines_rejoined", 0) for r in train) > 0,
            "engines_live_per_step": [r.get("engines_live") for r in train],
            "final_version": summary["steps"],
            "version_served_after_rejoin": served,
            "version_after_rejoin_ok": served == str(summary["steps"]),
            "weights_after_rejoin_match": weights_match,
            "wall_s": wall,
            "fault_task_error": repr(fault_error) if fault_error else None,
        }
    finally:
        for server in (a, b, events.get("restarted")):
            if server is not None:
                await asyncio.to_thread(server.stop)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit 1 when the run lost a group, a step, or its engine did not come back right."""
    ap = argparse.ArgumentParser(prog="agentrl bench faults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--max-steps", type=int, default=60, help="the most steps the run may take")
    ap.add_argument("--kill-after-step", type=int, default=1, help="kill engine B once this step is recorded")
    ap.add_argument("--restart-after-s", type=float, default=5.0, help="restart engine B this long after")
    ap.add_argument("--steps-after-rejoin", type=int, default=2, help="steps the run takes after B is back")
    ap.add_argument("--work-dir", type=Path, default=None, help="engines' logs and the run (default: temp dir)")
    ap.add_argument("--engine-a", default=None,
                    help="URL of a running engine on the embedded model (LoRA enabled) to use as A")
    args = ap.parse_args(argv)
    if not 1 <= args.kill_after_step < args.max_steps:
        ap.error("--kill-after-step must be at least 1 and less than --max-steps")
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-faults-") as tmp:
        res = asyncio.run(run_faults(args.max_steps, args.kill_after_step, args.restart_after_s,
                                     args.steps_after_rejoin, Path(args.work_dir or tmp), args.engine_a))
    if not args.json:
        for k, v in res.items():
            print(f"{k:<30} {v}")
    print(json.dumps(res))
    ok = (res["steps_completed"] == res["steps_requested"] and res["groups_lost_unrecorded"] == 0
          and res["engine_rejoined"] and res["version_after_rejoin_ok"] and res["weights_after_rejoin_match"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
