"""The SWE environment under gVisor (``SandboxConfig(runtime="runsc")``) on a real Docker engine: the agent's
and the grader's sandboxes run under runsc; the oracle solves and doing nothing fails, as under runc."""

from __future__ import annotations

import uuid
from typing import ClassVar

import pytest

from agentrl.environment.base import run_scope
from agentrl.envs.swe import SweConfig, SweEnv
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted
from agentrl.sandbox import SandboxConfig
from agentrl.sandbox.runtime import engine_runtimes
from tests.conftest import require
from tests.integration.test_swe import _docker, containers_of, swe_image  # noqa: F401  (a fixture)

pytestmark = pytest.mark.integration


class GvisorSwe(SweEnv):
    config: ClassVar[SweConfig] = SweConfig(pool_size=1, max_sandboxes=4,
                                            sandbox=SandboxConfig(mem_mb=1024, runtime="runsc"))
    _run = None


async def test_oracle_and_null_under_gvisor(swe_image: str) -> None:  # noqa: F811
    have = engine_runtimes(_docker())
    require("runsc" in have, f"the engine has no runsc runtime (it has {sorted(have)}); run sandbox/provision.sh")
    tasks = SweEnv.tasks("all")[:3]
    async with run_scope(GvisorSwe, f"test-gvisor-{uuid.uuid4().hex[:6]}"):
        runner = GvisorSwe._run
        assert runner is not None
        owner = runner.owner
        await runner.pool.wait_ready(120)  # type: ignore[union-attr]
        [warm] = runner.pool._warm  # type: ignore[union-attr]
        assert _docker().api.inspect_container(warm.id)["HostConfig"]["Runtime"] == "runsc"
        oracle = await run_scripted(GvisorSwe, tasks, OraclePolicy(), max_concurrency=2)
        null = await run_scripted(GvisorSwe, tasks, NullPolicy(), max_concurrency=2)
    assert [t.reward for t in oracle] == [1.0] * 3, [(t.task_id, t.error) for t in oracle]
    assert [t.reward for t in null] == [0.0] * 3 and not any(t.failed for t in null), [t.error for t in null]
    assert containers_of(owner) == []
