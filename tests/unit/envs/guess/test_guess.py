"""The guess environment: budgets and reward rule, splits, the guess tool, oracle and demonstrations."""

from __future__ import annotations

import asyncio
import statistics

import pytest

from agentrl.config.run import load_config
from agentrl.core.types import StopReason
from agentrl.environment.base import ToolArgumentError, ToolError
from agentrl.environment.registry import load_env
from agentrl.environment.tasks import TaskSourceError
from agentrl.envs.guess import GuessEnv, GuessTaskError, binary_search, make_tasks, score
from agentrl.envs.guess.tasks import budget, max_guesses
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted, run_scripted_eval, tool_call_text

ORACLE_GUESSES_MEAN = 6.46
"""Mean guesses (one a turn) of binary search over the test split (docs/environments.md states it)."""


def test_registered_by_name() -> None:
    assert load_env("guess") is GuessEnv


def test_budget_and_reward_rule() -> None:
    assert [budget(1, 100), budget(1, 127), budget(1, 128), budget(1, 250)] == [7, 7, 8, 8]
    assert max_guesses(1, 100) == 12
    assert [score(1, 100, g) for g in (1, 7, 8, 9, 12, 13, None)] == [1.0, 1.0, 0.9, 0.8, 0.5, 0.0, 0.0]


@pytest.mark.parametrize(("low", "high"), [(1, 100), (1, 127), (1, 128), (500, 749)])
def test_binary_search_finds_every_target_within_the_budget(low: int, high: int) -> None:
    for target in range(low, high + 1):
        guesses = binary_search(low, high, target)
        assert guesses[-1] == target and len(guesses) <= budget(low, high)


def test_tasks_are_deterministic_and_splits_disjoint() -> None:
    train, test = GuessEnv.tasks("train"), GuessEnv.tasks("test")
    assert len(train) == 2000 and len(test) == 200
    assert make_tasks("test", 200) == test
    key = lambda t: (t["low"], t["high"], t["target"])  # noqa: E731
    assert {key(t) for t in train}.isdisjoint({key(t) for t in test}) and len({key(t) for t in train}) == 2000
    assert all(100 <= t["high"] - t["low"] + 1 <= 250 and t["low"] <= t["target"] <= t["high"] for t in train)
    with pytest.raises(TaskSourceError):
        GuessEnv.tasks("valid")


def test_oracle_scores_one_on_every_test_task() -> None:
    tasks = GuessEnv.tasks("test")
    trajs = asyncio.run(run_scripted(GuessEnv, tasks, OraclePolicy()))
    assert [t.reward for t in trajs] == [1.0] * len(tasks), [t.error for t in trajs if t.reward != 1.0]
    assert {t.stop_reason for t in trajs} == {StopReason.COMPLETED}
    turns = [t.num_turns for t in trajs]
    assert [t.num_tool_calls for t in trajs] == turns == [t.metrics["guesses"] for t in trajs]
    assert statistics.mean(turns) == pytest.approx(ORACLE_GUESSES_MEAN) and max(turns) == 8
    assert sum(n >= 5 for n in turns) == 181  # 90.5% of the oracle's episodes take 5 turns or more


def test_agentrl_eval_policy_oracle_scores_one() -> None:
    """What ``agentrl eval --env guess --policy oracle`` runs, in process."""
    out = asyncio.run(run_scripted_eval(load_config(None, {"env": "guess"}), "oracle", n=200))
    assert (out["num_tasks"], out["success"], out["reward_mean"], out["unsolved"]) == (200, 1.0, 1.0, [])
    assert out["metric_guesses"] == pytest.approx(ORACLE_GUESSES_MEAN)


def test_null_policy_scores_zero() -> None:
    trajs = asyncio.run(run_scripted(GuessEnv, GuessEnv.tasks("test")[:20], NullPolicy()))
    assert all(t.reward == 0.0 and not t.failed for t in trajs)


async def test_feedback_and_errors() -> None:
    env = GuessEnv()
    opening = await env.reset({"id": "t", "low": 1, "high": 100, "target": 42})
    assert "from 1 to 100" in opening and "12 guesses" in opening and "within 7" in opening
    assert await env.call_tool("guess", {"number": 50}) == "Too high: the number is lower than 50. 11 guesses left."
    assert await env.call_tool("guess", {"number": 25}) == "Too low: the number is higher than 25. 10 guesses left."
    with pytest.raises(ToolError, match="outside the range; guess a whole number from 1 to 100"):
        await env.call_tool("guess", {"number": 101})
    with pytest.raises(ToolArgumentError, match="integer"):
        await env.call_tool("guess", {"number": "forty"})
    assert env.made == 2 and not env.finished
    assert await env.call_tool("guess", {"number": 42}) == "Correct: the number is 42, found in 3 guesses."
    assert env.finished and await env.reward([]) == {"reward": 1.0, "found": 1.0, "guesses": 3.0}


def _linear(task: dict, count: int) -> list[str]:
    return [tool_call_text("guess", {"number": task["low"] + i}) for i in range(count)]


@pytest.mark.parametrize(("target_offset", "reward", "guesses"), [(7, 0.9, 8.0), (11, 0.5, 12.0), (30, 0.0, 12.0)])
def test_slow_searches_earn_less_and_running_out_earns_nothing(target_offset: int, reward: float,
                                                               guesses: float) -> None:
    class Linear:
        name = "linear"

        def turns(self, env_cls: type, task: dict) -> list[str]:
            return _linear(task, 40)

    task = {"id": "t", "low": 1, "high": 100, "target": 1 + target_offset}
    (traj,) = asyncio.run(run_scripted(GuessEnv, [task], Linear()))
    assert traj.reward == pytest.approx(reward) and traj.metrics["guesses"] == guesses
    assert traj.stop_reason is StopReason.COMPLETED and traj.num_turns == guesses
    if not reward:
        assert "No guesses left; the number was 31." in traj.messages[-1].content


def test_guessing_everything_in_one_turn_is_cut_at_the_guess_limit() -> None:
    class Burst:
        name = "burst"

        def turns(self, env_cls: type, task: dict) -> list[str]:
            return ["\n".join(_linear(task, 100))]

    (traj,) = asyncio.run(run_scripted(GuessEnv, [{"id": "t", "low": 1, "high": 100, "target": 60}], Burst()))
    assert traj.reward == 0.0 and traj.metrics["guesses"] == 12.0 and traj.num_turns == 1


async def test_demonstrations_replay_to_the_right_guess() -> None:
    for task in GuessEnv.tasks("train")[:30]:
        messages = GuessEnv.demonstration(task)
        assert [m["role"] for m in messages[:2]] == ["system", "user"]
        env = GuessEnv()
        assert await env.reset(task) == messages[1]["content"]
        for call, result in zip(messages[2::2], messages[3::2], strict=True):
            assert call["role"] == "assistant" and result["role"] == "tool"
            (fn,) = [c["function"] for c in call["tool_calls"]]
            assert await env.call_tool(fn["name"], fn["arguments"]) == result["content"]
        assert fn == {"name": "guess", "arguments": {"number": task["target"]}}
        assert messages[-1]["content"].startswith("Correct") and (await env.reward([]))["reward"] == 1.0


def test_check_tasks_names_the_broken_task() -> None:
    GuessEnv.check_tasks(GuessEnv.tasks("test")[:3])
    for bad in [{"id": "b", "low": 10, "high": 5, "target": 7}, {"id": "b", "low": 1, "high": 9, "target": 10},
                {"id": "b", "low": "1", "high": 9, "target": 5}, {"id": "b", "low": 1, "high": 9}]:
        with pytest.raises(GuessTaskError, match="guess task 'b': needs integers low <= target <= high"):
            GuessEnv.check_tasks([bad])
