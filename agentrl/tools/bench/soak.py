"""``agentrl bench soak``: a long async run of the swe environment through the env server, with faults injected
on a schedule, that must lose no data and leak nothing.

The bench starts an env server (``agentrl serve-env``, sandboxes in Docker) serving the swe environment with
short command limits (``bash_timeout_s`` 5 s, so a frozen sandbox outlasts them), two vLLM engines on the
embedded tiny model (or uses a running one as A: ``--engine-a``; B is always the bench's own), and trains
asynchronously against both. Once the first step is recorded, one fault every ``--fault-every-s`` seconds, in
turn (``--faults`` picks a subset):

- ``engine_kill``: engine B is killed with SIGKILL and started again on its port (it rejoins at the current
  version; A carries the run meanwhile);
- ``sandbox_kill``: one running sandbox container of the env server is killed (``docker kill``), whatever
  it was doing;
- ``env_server_restart``: the env server is killed with SIGKILL and started again on the same port (its
  sessions are gone; the run's requests to it are retried, then fail as episodes);
- ``tool_hang``: every running sandbox of the env server is frozen (``docker pause``) for longer than a
  command's time limit, then thawed: commands in flight hang past their timeout;
- ``malformed_burst``: for a few seconds the run samples at temperature 2, so the model's output (its tool
  calls included) is malformed.

After ``--minutes`` no new fault starts (with ``--every-fault-once``, not before each fault has landed at least
once, for at most ``LANDING_WAIT_S`` more: a loaded machine runs fewer faults per minute); the run goes on
until engine B is up and in rotation again (at most ``--rejoin-wait-s``), trains one more step on both engines, and stops. The bench then asks B which policy
version it serves and compares B's greedy answer with A's: a restarted engine must hold the run's final
adapter itself, not only its version label.

The driver's resident memory and open file descriptors are sampled every 2 s. The last line is one JSON
object: ``steps_completed``, ``groups_lost_unrecorded`` (groups admitted but neither trained on, dropped,
released nor buffered at the end: must be 0), ``episodes``, ``episodes_failed_by_cause`` (stop reason ->
episodes), ``errors`` (distinct first lines), ``faults`` (each injected fault: when, and what it did),
``engines_rejoined`` (rejoins of a restarted engine), ``engine_b_restart`` (how B's last restart ended: ``up in
N s`` or its error), ``engines_live_at_end``, ``final_version``,
``version_served_by_b``, ``version_after_rejoin_ok`` (B serves the final version), ``weights_after_rejoin_match``
(B's greedy tokens are A's, logprobs within 1e-4), ``rss_mib_start``/``rss_mib_end``/``rss_mib_per_hour`` (the
driver's, from the first fault on: the slope of a least-squares line), ``fds_start``/``fds_end``, ``wall_s``, and
``sandboxes_left`` (containers of the env servers that exist once the bench has stopped them: must be 0).

    agentrl bench soak --minutes 60 --json
    agentrl bench soak --minutes 5 --faults engine_kill     # the engine fault alone
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentrl.core.types import FAILED_STOP_REASONS
from agentrl.orchestrator.metrics import groups_lost_unrecorded, records_of

if TYPE_CHECKING:
    from agentrl.config.run import RunConfig

FAULTS = ("engine_kill", "sandbox_kill", "env_server_restart", "tool_hang", "malformed_burst")
"""The faults, in the order they are injected (then again from the first)."""

SOAK_ENV = '''"""The swe environment with short command limits: a frozen sandbox outlasts them (``agentrl bench soak``)."""

from typing import ClassVar

from agentrl.envs.swe import SweEnv
from agentrl.envs.swe.config import SweConfig


class SoakSwe(SweEnv):
    config: ClassVar[SweConfig] = SweConfig(bash_timeout_s=5.0, test_timeout_s=60.0)
'''
FREEZE_S = 12.0
"""How long ``tool_hang`` keeps the sandboxes frozen: past ``bash_timeout_s`` (5 s) and its kill grace."""
BURST_S = 8.0
"""How long ``malformed_burst`` samples at ``BURST_TEMPERATURE``."""
BURST_TEMPERATURE = 2.0
LANDING_WAIT_S = 600.0
"""With ``--every-fault-once``: how long past ``--minutes`` the faults go on until each has landed once."""
REJOIN_WAIT_S = 600.0
"""After the faults, how long the run waits for engine B to be back in rotation (a vLLM start on a loaded CPU
takes minutes)."""


def rss_mib() -> float:
    """This process's resident memory (MiB)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def open_fds() -> int:
    """This process's open file descriptors."""
    return len(os.listdir("/proc/self/fd"))


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per hour; None under two points."""
    if len(points) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var == 0:
        return None
    return 3600 * sum((t - mt) * (v - mv) for t, v in points) / var


class Faults:
    """Injects the faults into one run: engine B, the env server, its sandboxes and the run's sampling."""

    def __init__(self, run: Any, engine_b: Any, env_server: Any, work: Path, seed: int,
                 max_engine_kills: int | None = None) -> None:
        import docker

        self.run, self.engine_b, self.env_server, self.work = run, engine_b, env_server, work
        self.engine_kills_left = max_engine_kills
        """How many more times ``engine_kill`` may be injected (None: no limit)."""
        self.docker = docker.from_env(timeout=30)
        self.rng = random.Random(seed)
        self.restarting: asyncio.Task | None = None
        self.restart_outcome: str | None = None
        """How engine B's last restart ended: ``up in N s``, or its error (None: not restarted)."""
        self.servers: list[Any] = [engine_b]
        """Every engine B started (stopped at the end)."""
        self.env_servers: list[Any] = [env_server]
        self.pending: list[asyncio.Future] = []
        """Starts of engines and env servers running in threads: awaited by :meth:`close` (cancelling a fault
        does not stop its thread, which would otherwise start a process after the bench stopped them all)."""
        self.env_server_pids: list[int] = [env_server.pid]
        """Every env server started (its sandboxes carry its pid)."""

    def _containers(self, pid: int, *, running: bool) -> list[Any]:
        """The sandbox containers started by the env server process ``pid`` (their ``agentrl.pid`` label):
        the running ones, or all."""
        label = {"label": f"agentrl.pid={pid}"}
        if running:
            return self.docker.containers.list(filters={**label, "status": "running"})
        return self.docker.containers.list(all=True, filters=label)

    def sandboxes(self) -> list[Any]:
        """The env server's running sandbox containers."""
        return self._containers(self.env_server.pid, running=True)

    async def _start(self, start: Any, *args: Any) -> None:
        """``start(*args)`` in a thread, finished even if the fault is cancelled (see ``pending``)."""
        future = asyncio.ensure_future(asyncio.to_thread(start, *args))
        self.pending.append(future)
        await asyncio.shield(future)

    def can_inject(self, name: str) -> bool:
        """Whether fault ``name`` may still be injected (``engine_kill`` has a budget)."""
        return name != "engine_kill" or self.engine_kills_left is None or self.engine_kills_left > 0

    async def inject(self, name: str) -> dict[str, Any]:
        """Inject fault ``name``; what it did."""
        return await getattr(self, name)()

    async def engine_kill(self) -> dict[str, Any]:
        from agentrl.tools.bench.faults import engine_again, kill_engine

        if self.restarting is not None and not self.restarting.done():
            return {"ok": False, "detail": "engine B is still restarting from the last kill"}
        server = self.engine_b
        if self.engine_kills_left is not None:
            self.engine_kills_left -= 1
        await kill_engine(server)

        async def restart() -> None:
            await asyncio.sleep(1.0)
            again = engine_again(server)
            self.servers.append(again)
            try:
                await self._start(again.start)
            except Exception as e:
                self.restart_outcome = f"{type(e).__name__}: {e}"
                raise
            self.restart_outcome = f"up in {again.startup_s:.1f}s"
            self.engine_b = again

        self.restarting = asyncio.create_task(restart())
        return {"ok": True, "detail": f"SIGKILL to engine B ({server.url}); restarting on the same port"}

    async def sandbox_kill(self) -> dict[str, Any]:
        boxes = await asyncio.to_thread(self.sandboxes)
        if not boxes:
            return {"ok": False, "detail": "no sandbox was running"}
        box = self.rng.choice(boxes)
        await asyncio.to_thread(box.kill)
        return {"ok": True, "detail": f"killed sandbox {box.short_id} ({len(boxes)} running)"}

    async def env_server_restart(self) -> dict[str, Any]:
        from agentrl.tools.bench.env_server import ServerProcess

        old = self.env_server
        port = int(old.url.rsplit(":", 1)[1])
        await asyncio.to_thread(old.kill)
        t0 = time.perf_counter()
        new = ServerProcess(old.envs, port=port, token=old.token, extra=old.extra,
                            log_path=self.work / f"env-server-{len(self.env_servers)}.log")
        self.env_servers.append(new)
        await self._start(new.start, 120.0)
        self.env_server = new
        self.env_server_pids.append(new.pid)
        return {"ok": True, "detail": f"SIGKILL to the env server; back on port {port} in "
                                      f"{time.perf_counter() - t0:.1f}s"}

    async def tool_hang(self) -> dict[str, Any]:
        boxes = await asyncio.to_thread(self.sandboxes)
        if not boxes:
            return {"ok": False, "detail": "no sandbox was running"}
        frozen = []
        for box in boxes:
            with contextlib.suppress(Exception):  # it may have ended meanwhile
                await asyncio.to_thread(box.pause)
                frozen.append(box)
        await asyncio.sleep(FREEZE_S)
        for box in frozen:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(box.unpause)
        return {"ok": bool(frozen), "detail": f"froze {len(frozen)} sandboxes for {FREEZE_S:.0f}s"}

    async def malformed_burst(self) -> dict[str, Any]:
        workers = self.run.orch.runner
        normal = workers.sampling
        workers.sampling = normal.model_copy(update={"temperature": BURST_TEMPERATURE})
        try:
            await asyncio.sleep(BURST_S)
        finally:
            workers.sampling = normal
        return {"ok": True, "detail": f"sampled at temperature {BURST_TEMPERATURE} for {BURST_S:.0f}s"}

    async def close(self) -> None:
        if self.restarting is not None:
            self.restarting.cancel()
            with contextlib.suppress(BaseException):
                await self.restarting
        await asyncio.gather(*self.pending, return_exceptions=True)
        for server in self.servers:
            await asyncio.to_thread(server.stop)
        for env_server in self.env_servers:
            await asyncio.to_thread(env_server.stop)

    def left_behind(self) -> int:
        """Sandbox containers of the env servers that still exist (after :meth:`close`: must be 0)."""
        return sum(len(self._containers(pid, running=False)) for pid in self.env_server_pids)


async def _schedule(faults: Faults, names: tuple[str, ...], metrics: Path, every_s: float, t0: float,
                    stop: asyncio.Event, log: list[dict[str, Any]], all_landed: asyncio.Event) -> None:
    """After the first recorded step, inject one fault every ``every_s`` seconds, ``names`` in turn, until
    ``stop`` is set (a fault under way is finished first: a frozen sandbox is always thawed); ``all_landed`` is
    set once each of ``names`` has landed (``ok``) at least once."""
    for _ in iter(int, 1):  # the run's metrics file is the only signal: poll it
        if records_of(metrics, "train") or stop.is_set():
            break
        await asyncio.sleep(0.5)
    for name in itertools.cycle(names):
        if stop.is_set():
            return
        if not faults.can_inject(name):  # its budget is spent: the next one takes its turn
            if not any(faults.can_inject(n) for n in names):
                await stop.wait()
            continue
        at = time.perf_counter() - t0
        try:
            rec = await faults.inject(name)
        except Exception as e:  # a fault that could not be injected is reported, and the soak goes on
            rec = {"ok": False, "detail": f"{type(e).__name__}: {e}"}
        log.append({"fault": name, "at_s": round(at, 1), **rec})
        if set(names) <= {f["fault"] for f in log if f["ok"]}:
            all_landed.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, every_s - (time.perf_counter() - t0 - at)))


async def _finish(run: Any, faults: Faults, schedule: asyncio.Task, metrics: Path, until_s: float, t0: float,
                  rejoin_wait_s: float, stop: asyncio.Event, all_landed: asyncio.Event | None) -> bool:
    """At ``until_s`` (and, given ``all_landed``, once it is set or ``LANDING_WAIT_S`` later): no new fault;
    once engine B is up and both engines are in rotation again (a step with two live engines recorded after
    that), one more step, then the run stops. Whether B was back in time (after ``rejoin_wait_s`` without it,
    or at once when its restart failed, the run stops after its next step)."""
    await asyncio.sleep(max(0.0, until_s - (time.perf_counter() - t0)))
    if all_landed is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_landed.wait(), LANDING_WAIT_S)
    stop.set()
    # wait for the fault under way and B's restart to end, whatever their outcome (asyncio.wait raises neither's
    # error), while a cancellation of this task still goes through
    await asyncio.wait([t for t in (schedule, faults.restarting) if t is not None])
    seen = len(records_of(metrics, "train"))
    restart = faults.restarting
    failed = restart is not None and (restart.cancelled() or restart.exception() is not None)
    deadline = time.perf_counter() + (0.0 if failed else rejoin_wait_s)  # a failed restart is not waited for
    while time.perf_counter() < deadline:
        back = [r["step"] for r in records_of(metrics, "train")[seen:] if r.get("engines_live") == 2]
        if back:
            run.stop_after(back[0] + 1)
            return True
        await asyncio.sleep(0.5)
    steps = records_of(metrics, "train")
    run.stop_after((steps[-1]["step"] if steps else 0) + 1)
    return False


async def _sample(points: list[tuple[float, float, int]], t0: float) -> None:
    while True:
        points.append((time.perf_counter() - t0, rss_mib(), open_fds()))
        await asyncio.sleep(2.0)


async def run_soak(minutes: float, fault_every_s: float, work: Path, engine_a: str | None = None,
                   seed: int = 0, faults_injected: tuple[str, ...] = FAULTS,
                   rejoin_wait_s: float = REJOIN_WAIT_S, max_engine_kills: int | None = None,
                   every_fault_once: bool = False) -> dict[str, Any]:
    """Run the soak in ``work``; ``engine_a``: the URL of a running engine on the embedded model (LoRA
    enabled) to use as A, neither started nor stopped here; ``faults_injected``: which faults, in turn;
    ``max_engine_kills``: at most this many ``engine_kill`` (then the rotation skips it); ``every_fault_once``:
    faults go on past ``minutes`` until each has landed once (at most ``LANDING_WAIT_S`` more)."""
    from agentrl.config.run import DEFAULT_MODEL
    from agentrl.envs.swe import SweEnv
    from agentrl.inference import VLLMServer
    from agentrl.launch.stack import ensure_model
    from agentrl.orchestrator.run import TrainingRun
    from agentrl.tools.bench.env_server import ServerProcess
    from agentrl.tools.bench.faults import engine_pair_config, same_policy

    work.mkdir(parents=True, exist_ok=True)
    model = str(Path(ensure_model(DEFAULT_MODEL)).resolve())
    (work / "soak_env.py").write_text(SOAK_ENV)
    # the shortest issues leave room for a few turns in the engines' 1024-token window
    shortest = sorted(SweEnv.tasks("all"), key=lambda t: len(t["problem_statement"]))[:4]
    tasks = work / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in shortest))
    scfg = engine_pair_config(model)
    a = None if engine_a else VLLMServer(scfg, work / "engine-a")
    b = VLLMServer(scfg, work / "engine-b")
    env_server = ServerProcess([f"{work / 'soak_env.py'}:SoakSwe"], log_path=work / "env-server-0.log")
    faults: Faults | None = None
    result: dict[str, Any] = {}
    try:
        await _start_all([s for s in (a, b) if s is not None], env_server)
        cfg = _run_config(env_server, work, model, tasks, [engine_a or a.url, b.url], minutes=minutes,
                          rejoin_wait_s=rejoin_wait_s, every_fault_once=every_fault_once, seed=seed)
        run = await TrainingRun(cfg, progress=False).open()  # open: its run directory is claimed
        metrics = run.run_dir / "metrics.jsonl"
        faults = Faults(run, b, env_server, work, seed, max_engine_kills)
        injected: list[dict[str, Any]] = []
        points: list[tuple[float, float, int]] = []
        summary, b_back, wall = await _drive(run, faults, metrics, injected, points, names=faults_injected,
                                             every_s=fault_every_s, until_s=minutes * 60,
                                             rejoin_wait_s=rejoin_wait_s, every_fault_once=every_fault_once)
        served, weights_match = None, False
        if b_back:
            served, weights_match = await same_policy(engine_a or a.url, faults.engine_b.url, cfg.adapter_name)
        result = _result(minutes, metrics, summary, injected, points, wall, served, weights_match)
        result["engine_b_restart"] = faults.restart_outcome
    finally:
        if faults is not None:
            await faults.close()
            result["sandboxes_left"] = await asyncio.to_thread(faults.left_behind)
        else:
            await asyncio.to_thread(env_server.stop)
            await asyncio.to_thread(b.stop)
        if a is not None:
            await asyncio.to_thread(a.stop)
    return result


async def _start_all(engines: list[Any], env_server: Any) -> None:
    """Start the env server while the engines start (one after the other, as a run's engines would); both
    starts are over when this returns, and the first error, if any, is raised then."""

    async def start_engines() -> None:
        for server in engines:
            await asyncio.to_thread(server.start)

    outcomes = await asyncio.gather(start_engines(), asyncio.to_thread(env_server.start, 300.0),
                                    return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


def _run_config(env_server: Any, work: Path, model: str, tasks: Path, endpoints: list[str], *, minutes: float,
                rejoin_wait_s: float, every_fault_once: bool, seed: int) -> RunConfig:
    """The soak's training run: async, on the swe ``tasks`` served by ``env_server``, sampling from both
    ``endpoints``, with a time limit that is only a backstop."""
    from agentrl.config.run import load_config

    return load_config(None, {
        "env": "swe", "env_url": env_server.url, "env_token": env_server.token, "name": "soak",
        "output_dir": str(work / "runs"), "model": model, "steps": 100_000,
        # a backstop only: the run stops one step after engine B is back in rotation (see _finish)
        "time_limit_min": minutes + (rejoin_wait_s + LANDING_WAIT_S * every_fault_once + 600) / 60,
        "mode": "async", "tasks": str(tasks), "eval_tasks": str(tasks), "tasks_per_step": 2, "group_size": 2,
        "eval_every": 0, "eval_size": 2, "checkpoint_every": 0, "engine_warmup": False, "seed": seed,
        "endpoints": endpoints, "inference": {"max_model_len": 1024},
        "sampling": {"max_context_tokens": 1024},
    })


async def _drive(run: Any, faults: Faults, metrics: Path, injected: list[dict[str, Any]],
                 points: list[tuple[float, float, int]], *, names: tuple[str, ...], every_s: float, until_s: float,
                 rejoin_wait_s: float, every_fault_once: bool) -> tuple[dict[str, Any], bool, float]:
    """Train until the run stops, with the fault schedule (faults ``names``, logged in ``injected``), its end
    (:func:`_finish`) and the memory samples (into ``points``) running beside it. The run's summary, whether
    engine B was back in rotation in time, and the seconds it took."""
    t0 = time.perf_counter()
    stop, all_landed = asyncio.Event(), asyncio.Event()
    schedule = asyncio.create_task(_schedule(faults, names, metrics, every_s, t0, stop, injected, all_landed))
    finish = asyncio.create_task(_finish(run, faults, schedule, metrics, until_s, t0, rejoin_wait_s,
                                         stop, all_landed if every_fault_once else None))
    helpers = [schedule, finish, asyncio.create_task(_sample(points, t0))]
    try:
        summary = await run.run()
        b_back = finish.done() and not finish.cancelled() and finish.exception() is None and finish.result()
    finally:
        for task in helpers:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    wall = time.perf_counter() - t0
    points.append((wall, rss_mib(), open_fds()))
    return summary, b_back, wall


def _result(minutes: float, metrics: Path, summary: dict[str, Any], injected: list[dict[str, Any]],
            points: list[tuple[float, float, int]], wall: float, served: str | None,
            weights_match: bool) -> dict[str, Any]:
    """The soak's result (all but ``sandboxes_left``): the run's records in ``metrics`` and its ``summary``,
    the faults ``injected``, the driver's memory and descriptors (``points``, from the first fault on) and
    engine B's policy (``served``, ``weights_match``)."""
    train = records_of(metrics, "train")
    groups = records_of(metrics, "groups")[-1]
    failed = {r.value: int(sum(t.get(f"stop_{r.value}", 0) for t in train)) for r in FAILED_STOP_REASONS}
    first_fault = injected[0]["at_s"] if injected else 0.0
    after = [(t, m) for t, m, _ in points if t >= first_fault]
    fds_after = [f for t, _, f in points if t >= first_fault]
    return {
        "minutes": minutes,
        "steps_completed": len(train),
        "groups_lost_unrecorded": groups_lost_unrecorded(groups),
        "groups_admitted": int(groups["groups_admitted"]),
        "episodes": int(sum(t.get("num_episodes", 0) for t in train)),
        "episodes_failed_by_cause": {k: v for k, v in sorted(failed.items()) if v},
        "malformed_tool_calls": int(sum(t.get("malformed_tool_calls", 0) for t in train)),
        "errors": sorted({e for t in train for e in t.get("errors", [])})[:10],
        "faults": injected,
        "engines_rejoined": int(sum(t.get("engines_rejoined", 0) for t in train)),
        "engines_live_at_end": train[-1].get("engines_live") if train else None,
        "final_version": summary["steps"],
        "version_served_by_b": served,
        "version_after_rejoin_ok": served == str(summary["steps"]),
        "weights_after_rejoin_match": weights_match,
        "rss_mib_start": round(after[0][1], 1) if after else None,
        "rss_mib_end": round(points[-1][1], 1),
        "rss_mib_per_hour": (None if (s := slope_per_hour(after)) is None else round(s, 1)),
        "fds_start": fds_after[0] if fds_after else None,
        "fds_end": points[-1][2],
        "wall_s": round(wall, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the soak; exit 1 when a group was lost unrecorded, no step completed, a sandbox was left, or engine B
    did not end up serving the run's final policy."""
    ap = argparse.ArgumentParser(prog="agentrl bench soak", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print only the JSON line")
    ap.add_argument("--minutes", type=float, default=60.0, help="how long faults are injected")
    ap.add_argument("--fault-every-s", type=float, default=30.0, help="seconds between two faults")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help=f"which faults, comma-separated, injected in turn (default: all: {','.join(FAULTS)})")
    ap.add_argument("--max-engine-kills", type=int, default=None,
                    help="kill engine B at most this many times (default: whenever its turn comes)")
    ap.add_argument("--every-fault-once", action="store_true",
                    help="go on past --minutes until each fault has landed at least once "
                         f"(for at most {LANDING_WAIT_S:.0f} s more)")
    ap.add_argument("--rejoin-wait-s", type=float, default=REJOIN_WAIT_S,
                    help="after the faults, how long to wait for engine B to be back in rotation")
    ap.add_argument("--seed", type=int, default=0, help="the run's seed and the choice of sandboxes to kill")
    ap.add_argument("--work-dir", type=Path, default=None, help="engines' and servers' logs and the run "
                                                                "(default: a temporary directory)")
    ap.add_argument("--engine-a", default=None,
                    help="URL of a running engine on the embedded model (LoRA enabled) to use as A")
    args = ap.parse_args(argv)
    names = tuple(n.strip() for n in args.faults.split(",") if n.strip())
    unknown = sorted(set(names) - set(FAULTS))
    if unknown or not names:
        ap.error(f"--faults: unknown {', '.join(unknown) or '(none given)'}; choose from {', '.join(FAULTS)}")
    with tempfile.TemporaryDirectory(prefix="agentrl-bench-soak-") as tmp:
        res = asyncio.run(run_soak(args.minutes, args.fault_every_s, Path(args.work_dir or tmp), args.engine_a,
                                   args.seed, names, args.rejoin_wait_s, args.max_engine_kills,
                                   args.every_fault_once))
    if not args.json:
        for k, v in res.items():
            print(f"{k:<26} {v}")
    print(json.dumps(res))
    ok = (res["groups_lost_unrecorded"] == 0 and res["steps_completed"] > 0 and res.get("sandboxes_left") == 0
          and res["version_after_rejoin_ok"] and res["weights_after_rejoin_match"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
