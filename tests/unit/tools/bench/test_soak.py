"""``agentrl bench soak``'s pure parts: the memory slope, the driver's own readings, the fault rotation."""

from __future__ import annotations

import mmap
import os

import pytest

from agentrl.tools.bench.soak import FAULTS, FREEZE_S, SOAK_ENV, Faults, open_fds, rss_mib, slope_per_hour


def test_the_slope_is_per_hour_and_needs_two_distinct_times() -> None:
    assert slope_per_hour([(0.0, 100.0), (1800.0, 150.0), (3600.0, 200.0)]) == pytest.approx(100.0)
    assert slope_per_hour([(0.0, 5.0), (10.0, 5.0)]) == 0.0
    assert slope_per_hour([(3.0, 1.0)]) is None and slope_per_hour([(3.0, 1.0), (3.0, 2.0)]) is None
    # least squares, not the end points: one outlier in the middle does not make a trend
    assert slope_per_hour([(0.0, 10.0), (1.0, 90.0), (2.0, 10.0)]) == pytest.approx(0.0)


def test_the_drivers_readings_see_its_own_memory_and_descriptors() -> None:
    before, fds = rss_mib(), open_fds()
    r, w = os.pipe()
    try:
        assert open_fds() == fds + 2
    finally:
        os.close(r)
        os.close(w)
    # fresh pages from the kernel, each written once: a heap allocation may reuse pages already resident
    size = 64 << 20
    with mmap.mmap(-1, size) as pages:
        pages[::mmap.PAGESIZE] = b"\x01" * (size // mmap.PAGESIZE)
        assert rss_mib() > before + 50


def test_every_fault_has_an_injector_and_the_env_is_swe_with_short_limits() -> None:
    assert len(set(FAULTS)) == len(FAULTS) == 5
    assert all(callable(getattr(Faults, name, None)) for name in FAULTS)
    namespace: dict = {}
    exec(compile(SOAK_ENV, "soak_env.py", "exec"), namespace)
    env = namespace["SoakSwe"]
    assert env.name == "swe" and env.config.bash_timeout_s + 1 < FREEZE_S, "a frozen command outlasts its limit"


def test_an_unknown_fault_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl.tools.bench.soak import main

    with pytest.raises(SystemExit) as exc:
        main(["--faults", "engine_kill,disk_full"])
    assert exc.value.code == 2 and "unknown disk_full" in capsys.readouterr().err


async def test_the_finish_is_cancelled_while_it_waits_for_a_fault(tmp_path) -> None:
    """The run can end (its time-limit backstop) while the finish waits for the fault under way: cancelling the
    finish ends it at once, and the fault's own task is left to the bench's teardown."""
    import asyncio
    import time
    from types import SimpleNamespace

    from agentrl.tools.bench.soak import _finish

    fault = asyncio.create_task(asyncio.sleep(60))  # a fault under way, e.g. frozen sandboxes
    faults = SimpleNamespace(restarting=None)
    finish = asyncio.create_task(_finish(SimpleNamespace(), faults, fault, tmp_path / "metrics.jsonl", 0.0,
                                         time.perf_counter(), 600.0, asyncio.Event(), None))
    await asyncio.sleep(0.05)
    finish.cancel()
    done, _ = await asyncio.wait([finish], timeout=2)
    assert finish in done and finish.cancelled() and not fault.done()
    fault.cancel()


async def test_a_failed_restart_of_engine_b_is_not_waited_for(tmp_path) -> None:
    """Engine B's restart failed (a CI run once waited the whole 600 s for it): the finish stops the run after
    its next step at once; a restart still under way is waited for, and then B's return."""
    import asyncio
    import json
    import time
    from types import SimpleNamespace

    from agentrl.tools.bench.soak import _finish

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"kind": "train", "step": 3, "engines_live": 1}) + "\n")

    async def failing() -> None:
        raise RuntimeError("cannot serve on 127.0.0.1:8000")

    async def finish(restart: asyncio.Task) -> tuple[bool, list[int]]:
        ends: list[int] = []
        schedule = asyncio.create_task(asyncio.sleep(0))
        back = await asyncio.wait_for(_finish(SimpleNamespace(stop_after=ends.append), SimpleNamespace(
            restarting=restart), schedule, metrics, 0.0, time.perf_counter(), 600.0, asyncio.Event(), None), 5)
        return back, ends

    assert await finish(asyncio.create_task(failing())) == (False, [4])

    async def rejoins() -> None:  # B is up: the run's next step has both engines live
        await asyncio.sleep(0.3)
        with metrics.open("a") as f:
            f.write(json.dumps({"kind": "train", "step": 4, "engines_live": 2}) + "\n")

    later = asyncio.create_task(rejoins())
    assert await finish(asyncio.create_task(asyncio.sleep(0.1))) == (True, [5])
    await later


async def test_faults_go_on_past_the_minutes_until_each_has_landed_once(tmp_path) -> None:
    """On a loaded machine fewer faults fit into the minutes: with ``every_fault_once`` the schedule is stopped
    only once every fault in the rotation has landed, a failed one (nothing to freeze yet) taking its turn again."""
    import asyncio
    import json
    import time
    from types import SimpleNamespace

    from agentrl.tools.bench.soak import _finish, _schedule

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"kind": "train", "step": 1, "engines_live": 2}) + "\n")
    tries: dict[str, int] = {}

    async def inject(name: str) -> dict:
        tries[name] = tries.get(name, 0) + 1
        await asyncio.sleep(0.05)
        return {"ok": name != "tool_hang" or tries[name] > 1}  # the first freeze finds no sandbox

    faults = SimpleNamespace(restarting=None, inject=inject, can_inject=lambda name: True)
    names = ("engine_kill", "tool_hang", "malformed_burst")
    log: list[dict] = []
    stop, landed = asyncio.Event(), asyncio.Event()
    t0 = time.perf_counter()
    schedule = asyncio.create_task(_schedule(faults, names, metrics, 0.0, t0, stop, log, landed))
    ends: list[int] = []
    run = SimpleNamespace(stop_after=ends.append)  # TrainingRun.stop_after: the run ends after that step
    # the minutes (here 0) are over before the first fault: without the rule the schedule would stop at once
    # (no step after it with both engines live, and no time to wait for one: the run stops after its next step)
    assert await asyncio.wait_for(_finish(run, faults, schedule, metrics, 0.0, t0, 0.0, stop, landed), 10) is False
    assert {f["fault"] for f in log if f["ok"]} == set(names) and tries["tool_hang"] == 2, log
    assert schedule.done() and stop.is_set() and ends == [2]


async def test_the_env_server_starts_while_the_engines_do_and_a_failed_start_is_raised_after_both() -> None:
    import threading
    import time

    from agentrl.tools.bench.soak import _start_all

    order: list[str] = []
    env_started = threading.Event()

    class Engine:
        def __init__(self, name: str, fail: bool = False) -> None:
            self.name, self.fail = name, fail

        def start(self) -> None:
            assert env_started.wait(5), "the env server did not start beside the engines"
            order.append(self.name)
            if self.fail:
                raise RuntimeError(f"{self.name} failed")

    class EnvServer:
        def start(self, timeout_s: float) -> None:
            env_started.set()
            time.sleep(0.2)
            order.append("env")

    with pytest.raises(RuntimeError, match="a failed"):
        await _start_all([Engine("a", fail=True), Engine("b")], EnvServer())
    assert order == ["a", "env"], "the env server's start is over before the error is raised; b never starts"
    order.clear()
    env_started.clear()
    await _start_all([Engine("a"), Engine("b")], EnvServer())
    assert sorted(order) == ["a", "b", "env"] and order.index("a") < order.index("b")
