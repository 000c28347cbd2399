"""`agentrl bench soak` on real parts, the CI version: a short async swe run through a real env server
(sandboxes in Docker) on two engines, with every kind of fault injected once or more, loses no group,
leaks neither memory nor descriptors past absolute bounds, and leaves no sandbox behind; the engine it killed
and restarted comes back into rotation and ends serving the run's final adapter (version and weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.sandbox import engine_reachable
from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.long]


async def test_a_soak_under_every_fault_loses_nothing_and_leaks_nothing(vllm_server, tmp_path: Path) -> None:
    from agentrl.tools.bench.soak import FAULTS, run_soak

    ok, why = engine_reachable()
    require(ok, f"no Docker engine reachable ({why}); run `eval \"$(sandbox/provision.sh)\"`")
    # engine A is the session's engine; B, the one killed and restarted, is the bench's own
    # the faults start with the first step (about 40 s in, the trainer's start-up) and take about 15 s each on
    # an idle machine; on a loaded one they take longer, so the soak goes on until each has landed once
    # B is killed once: a second kill would find it restarting, or make the soak wait for a second restart
    res = await run_soak(minutes=1.0, fault_every_s=12.0, work=tmp_path, engine_a=vllm_server.url,
                         max_engine_kills=1, every_fault_once=True)
    (tmp_path / "result.json").write_text(json.dumps(res, indent=1))
    faults = res["faults"]
    # every kind of fault landed at least once
    assert {f["fault"] for f in faults if f["ok"]} == set(FAULTS), faults
    assert res["groups_lost_unrecorded"] == 0 and res["groups_admitted"] > 0, res
    assert res["steps_completed"] >= 3, res
    # B was killed (SIGKILL, mid-step), restarted on its port, taken back with the current adapter, then trained on
    assert [f["fault"] for f in faults].count("engine_kill") == 1, faults
    assert res["engine_b_restart"].startswith("up in"), res["engine_b_restart"]
    assert res["engines_rejoined"] >= 1 and res["engines_live_at_end"] == 2, res
    assert res["version_after_rejoin_ok"] and res["weights_after_rejoin_match"], res
    assert res["sandboxes_left"] == 0, res
    assert res["fds_end"] - res["fds_start"] <= 32, res
    assert res["rss_mib_end"] - res["rss_mib_start"] <= 400, res
