"""The lookup environment: generated worlds, questions and splits, tools, reward, oracle and demonstrations."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter

import pytest

from agentrl.config.run import load_config
from agentrl.core.types import Message, StopReason, ToolCall
from agentrl.environment.base import ToolArgumentError, ToolError
from agentrl.environment.registry import load_env
from agentrl.environment.tasks import TaskSourceError
from agentrl.envs.lookup import LookupEnv, LookupTaskError, make_tasks, normalize, world
from agentrl.envs.lookup.tasks import TEST_WORLDS, question
from agentrl.envs.lookup.world import _generate, words
from agentrl.rollout.scripted import NullPolicy, OraclePolicy, run_scripted, run_scripted_eval

ORACLE_LOOKUPS_MEAN = 3.025
"""Mean search and open calls of the oracle over the test split (docs/environments.md states it)."""


def test_registered_by_name() -> None:
    assert load_env("lookup") is LookupEnv


def test_world_is_deterministic_and_shaped() -> None:
    a, b = world(5), _generate(5)
    assert [a.page(e) for e in a.entities.values()] == [b.page(e) for e in b.entities.values()]
    assert [e.name for e in world(6).entities.values()] != [e.name for e in a.entities.values()]
    kinds = Counter(e.kind for e in a.entities.values())
    assert kinds == {"country": 3, "city": 8, "organisation": 6, "person": 12}
    assert sorted(a.entities, key=lambda i: int(i[1:])) == [f"e{n}" for n in range(1, 30)]
    assert len({e.name for e in a.entities.values()}) == 29
    spouses = [e for e in a.entities.values() if "spouse" in e.links]
    assert len(spouses) == 8 and all(a.follow(a.follow(e, "spouse"), "spouse") is e for e in spouses)  # type: ignore[arg-type]
    for country in (e for e in a.entities.values() if e.kind == "country"):
        assert a.follow(a.follow(country, "capital"), "country") is country  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, TEST_WORLDS])
def test_every_start_has_a_look_alike(seed: int) -> None:
    w = world(seed)
    for e in w.entities.values():
        if e.kind != "country":
            alike = [o for o in w.entities.values() if o is not e and set(words(o.name)) & set(words(e.name))]
            assert alike, e.name


def test_search_ranks_the_exact_name_first_among_distractors() -> None:
    for task in LookupEnv.tasks("test"):
        found = world(task["seed"]).search(task["start"])
        assert found[0].name == task["start"] and len(found) >= 2 and len(found) <= 5


def test_tasks_are_deterministic_and_splits_disjoint() -> None:
    train, test = LookupEnv.tasks("train"), LookupEnv.tasks("test")
    assert len(train) == 2000 and len(test) == 200
    assert make_tasks("test", 20) == test[:20]
    assert {t["seed"] for t in train}.isdisjoint({t["seed"] for t in test})
    for task in test:
        assert task["question"] == question(task["start"], task["relations"])
        assert task["start"] in task["question"] and task["answer"] not in task["question"]
    with pytest.raises(TaskSourceError):
        LookupEnv.tasks("valid")


def test_oracle_scores_one_on_every_test_task_with_two_to_four_lookups() -> None:
    tasks = LookupEnv.tasks("test")
    trajs = asyncio.run(run_scripted(LookupEnv, tasks, OraclePolicy()))
    assert [t.reward for t in trajs] == [1.0] * len(tasks), [t.error for t in trajs if t.reward != 1.0]
    assert {t.stop_reason for t in trajs} == {StopReason.COMPLETED}
    lookups = [t.metrics["lookups"] for t in trajs]
    assert [t.num_tool_calls for t in trajs] == [n + 1 for n in lookups]  # and the answer
    assert set(lookups) == {2, 3, 4}
    assert statistics.mean(lookups) == pytest.approx(ORACLE_LOOKUPS_MEAN)
    assert max(t.num_turns for t in trajs) < LookupEnv.max_turns


def test_agentrl_eval_policy_oracle_scores_one() -> None:
    """What ``agentrl eval --env lookup --policy oracle`` runs, in process."""
    out = asyncio.run(run_scripted_eval(load_config(None, {"env": "lookup"}), "oracle", n=200))
    assert (out["num_tasks"], out["success"], out["reward_mean"], out["unsolved"]) == (200, 1.0, 1.0, [])
    assert out["metric_lookups"] == pytest.approx(ORACLE_LOOKUPS_MEAN)


def test_null_policy_scores_zero() -> None:
    trajs = asyncio.run(run_scripted(LookupEnv, LookupEnv.tasks("test")[:20], NullPolicy()))
    assert all(t.reward == 0.0 and not t.failed for t in trajs)


async def test_tools_and_their_errors() -> None:
    env = LookupEnv()
    task = LookupEnv.tasks("test")[0]
    await env.reset(task)
    start = world(task["seed"]).named(task["start"])
    found = await env.call_tool("search", {"query": task["start"]})
    assert found.splitlines()[0] == f"{start.id} {start.name} ({start.kind})" and len(found.splitlines()) >= 2
    assert (await env.call_tool("open", {"id": f" [{start.id.upper()}] "})).startswith(f"{start.name} (")
    assert (await env.call_tool("search", {"query": "zzz"})).startswith("No entity matches")
    for name, args, match in [("open", {"id": "e999"}, "no entity with id 'e999'"),
                              ("search", {"query": " ?! "}, "search needs words of a name"),
                              ("search", {"query": "a" * 201}, "query too long"),
                              ("answer", {"answer": " . "}, "the answer is empty")]:
        with pytest.raises(ToolError, match=match):
            await env.call_tool(name, args)
    with pytest.raises(ToolArgumentError, match="missing required argument"):
        await env.call_tool("open", {})
    assert not env.finished
    assert await env.call_tool("answer", {"answer": task["answer"]}) == f"Answer recorded: {task['answer']}"
    assert env.finished


def test_normalize() -> None:
    assert normalize("  The answer is: Port  Alder.") == "port alder"
    assert normalize("PORT-ALDER") == normalize("port alder") == "port alder"
    assert normalize("Answer: Norvania!") == "norvania"
    assert normalize("Port Alder Falls") != "port alder"


def _episode(final: str | None, answer: str | None) -> list[Message]:
    msgs = [Message(role="user", content="q"),
            Message(role="assistant", tool_calls=[ToolCall(id="c0", name="search", arguments={"query": "x"})]),
            Message(role="tool", content="e1 x", tool_call_id="c0")]
    if answer is not None:
        msgs.append(Message(role="assistant", tool_calls=[ToolCall(id="c1", name="answer", arguments={"answer": answer})]))
    if final is not None:
        msgs.append(Message(role="assistant", content=final))
    return msgs


@pytest.mark.parametrize(
    ("final", "answer", "reward"),
    [(None, "port alder", 1.0), (None, "Port Alder Falls", 0.0), ("The answer is Port Alder.", None, 1.0),
     ("Port Alder, I think", None, 0.0), (None, None, 0.0)],
)
async def test_reward_is_exact_match(final: str | None, answer: str | None, reward: float) -> None:
    env = LookupEnv()
    await env.reset({"id": "t", "seed": 0, "question": "q", "answer": "Port Alder"})
    if answer is not None:
        await env.call_tool("answer", {"answer": answer})
    got = await env.reward(_episode(final, answer))
    assert got["reward"] == reward and got["lookups"] == 1.0
    assert got["answered"] == float(final is not None or answer is not None)


async def test_demonstrations_replay_to_the_right_answer() -> None:
    for task in LookupEnv.tasks("train")[:30]:
        messages = LookupEnv.demonstration(task)
        assert [m["role"] for m in messages[:2]] == ["system", "user"] and messages[1]["content"] == task["question"]
        env = LookupEnv()
        await env.reset(task)
        for call, result in zip(messages[2::2], messages[3::2], strict=True):
            assert call["role"] == "assistant" and result["role"] == "tool"
            (fn,) = [c["function"] for c in call["tool_calls"]]
            assert await env.call_tool(fn["name"], fn["arguments"]) == result["content"]
        assert fn == {"name": "answer", "arguments": {"answer": task["answer"]}}
        assert env.finished and (await env.reward([]))["reward"] == 1.0


def test_check_tasks_names_the_broken_task() -> None:
    good = LookupEnv.tasks("test")[0]
    LookupEnv.check_tasks([good])
    for bad, match in [({**good, "answer": "Nowhere"}, "is not the chain's end"),
                       ({**good, "relations": ["sibling"]}, "relations must be"),
                       ({**good, "start": "Nobody Here"}, "no entity named"),
                       ({**good, "seed": "7"}, "integer 'seed'")]:
        with pytest.raises(LookupTaskError, match=f"lookup task 'lookup-test-0': .*{match}"):
            LookupEnv.check_tasks([bad])
    assert issubclass(LookupTaskError, ValueError)
