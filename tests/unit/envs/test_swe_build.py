"""Rebuilding the bundled SWE tasks from the repositories and the seed gives the committed file, byte for byte."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_rebuild_is_identical() -> None:
    from agentrl.envs.swe.build_tasks import BuildConfig, build, dumps
    from agentrl.envs.swe.env import BUNDLED_TASKS

    rebuilt = dumps(build(BuildConfig(seed=0), log=lambda *_: None))
    assert rebuilt == BUNDLED_TASKS.read_text(), (
        "the bundled tasks are stale: run `python -m agentrl.envs.swe.build_tasks` and commit envs/swe/data/")
