"""Checks for ExampleEnv (written by ``agentrl init-env``): run ``python -m pytest`` in this directory."""

from __future__ import annotations

import asyncio

import pytest
from example_env import ExampleEnv

import agentrl
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted


def test_tools_have_schemas() -> None:
    names = [s["function"]["name"] for s in ExampleEnv.tool_schemas()]
    assert names == ["stock", "submit"]


def test_the_reference_solution_scores_one() -> None:
    trajs = asyncio.run(run_scripted(ExampleEnv, ExampleEnv.tasks("test"), OraclePolicy()))
    assert [t.reward for t in trajs] == [1.0] * len(trajs), [t.error for t in trajs if t.reward != 1.0]


def test_giving_up_scores_zero() -> None:
    trajs = asyncio.run(run_scripted(ExampleEnv, ExampleEnv.tasks("test"), NullPolicy()))
    assert all(t.reward == 0.0 and not t.failed for t in trajs)


def test_a_bad_tool_argument_is_an_observation_not_a_crash() -> None:
    env = ExampleEnv()
    asyncio.run(env.reset(ExampleEnv.tasks("train")[0]))
    with pytest.raises(agentrl.ToolError, match="no shop 'west'"):  # the model sees this message
        asyncio.run(env.call_tool("stock", {"item": "eggs", "shop": "west"}))
    with pytest.raises(agentrl.ToolArgumentError, match="shop"):  # checked against the tool's schema
        asyncio.run(env.call_tool("stock", {"item": "eggs"}))
