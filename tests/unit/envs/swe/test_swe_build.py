"""The bundled SWE tasks are what the builder makes from the bundled repositories."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def test_bundled_tasks_are_built_from_the_current_inputs() -> None:
    """The digest of the repositories, the builder's sources and config recorded at the last build is the
    current one: a change to any of them needs a rebuild (which also rewrites the digest)."""
    from agentrl.envs.swe.build_tasks import DIGEST_OUT, inputs_digest

    assert DIGEST_OUT.read_text().strip() == inputs_digest(), (
        "the bundled tasks are stale: run `python -m agentrl.envs.swe.build_tasks` and commit envs/swe/data/")


def test_rebuilding_a_repository_gives_its_bundled_tasks() -> None:
    """The builder is deterministic (a full rebuild compares every repository:
    `python -m agentrl.envs.swe.build_tasks --check`; one is rebuilt here)."""
    from agentrl.envs.swe.build_tasks import BuildConfig, build, dumps
    from agentrl.envs.swe.env import BUNDLED_TASKS

    repo = "textkit"
    bundled = [json.loads(line) for line in BUNDLED_TASKS.read_text().splitlines()]
    mine = [t for t in bundled if t["instance_id"].startswith(f"agentrl__{repo}-")]
    assert mine
    assert dumps(build(BuildConfig(seed=0), log=lambda *_: None, repos=(repo,))) == dumps(mine)
