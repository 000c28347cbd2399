"""`agentrl bench faults` on real parts: a training run on two engines loses one mid-step (SIGKILL), goes
on with the other, takes it back with the current weights, and loses no group."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.long]


async def test_a_run_survives_a_killed_engine_and_takes_it_back(vllm_server, tmp_path: Path) -> None:
    from agentrl.bench.faults import run_faults

    # engine A is the session's engine; B, the one killed and restarted, is the bench's own
    res = await run_faults(max_steps=60, kill_after_step=1, restart_after_s=1.0, steps_after_rejoin=1,
                           work=tmp_path, engine_a=vllm_server.url)
    assert res["engine_killed"] and res["fault_task_error"] is None, res
    assert res["steps_completed"] == res["steps_requested"] < 60, res
    assert res["groups_lost_unrecorded"] == 0 and res["groups_admitted"] > 0, res
    assert res["engines_live_per_step"][1] == 1, "the step after the kill ran on the engine that was left"
    assert res["engine_rejoined"] and res["engines_live_per_step"][-1] == 2, res
    assert res["version_after_rejoin_ok"] and res["weights_after_rejoin_match"], res
