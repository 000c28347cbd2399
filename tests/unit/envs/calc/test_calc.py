"""The calc environment: safe evaluator, word-problem tasks, tool schema and reward."""

from __future__ import annotations

import time

import pytest

from agentrl.core.types import Message, ToolCall
from agentrl.environment.base import ToolError
from agentrl.envs.calc import CalcEnv, CalcError, make_tasks, safe_eval
from agentrl.envs.calc.env import last_number
from agentrl.envs.calc.tasks import split_of


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("23 + 3 * 12", 59),
        ("(2 + 3) * 4", 20),
        ("7 / 2", 3.5),
        ("96 / 8", 12),
        ("7 // 2", 3),
        ("-7 // 2", -4),
        ("17 % 5", 2),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("-3 + +4", 1),
        ("--5", 5),
        ("1.5 * 4", 6),
        ("0.1 + 0.2", 0.1 + 0.2),
        ("  42  ", 42),
        ("10 ** 15", 10**15),
        ("(" * 90 + "1" + ")" * 90, 1),
    ],
)
def test_safe_eval_values(expression: str, expected: float) -> None:
    value = safe_eval(expression)
    assert value == pytest.approx(expected)
    if float(expected).is_integer():
        assert isinstance(value, int)


HOSTILE = [
    "9**9**9",
    "2**10000",
    "10**16",
    "(10**8)**2",
    "99999999 * 99999999",
    "2 ** 65",
    "2 ** 0.5 ** -100",
    "(-8) ** 0.5",
    "0 ** -1",
    "1e400",
    "1e300 * 1e300",
    "(" * 500 + "1" + ")" * 500,
    "(" * 40 + "-" * 40 + "1" + ")" * 40,
    "-" * 150 + "1",
    "+".join(["1"] * 150),
    "1" + "+1" * 60,
    "__import__('os').system('ls')",
    "os",
    "x + 1",
    "(1).real",
    "abs(-1)",
    "lambda: 1",
    "'a' * 3",
    "b'1'",
    "[x for x in range(10)]",
    "{1: 2}",
    "1j",
    "True + 1",
    "None",
    "1 if 1 else 2",
    "1 < 2",
    "1 & 3",
    "1 ^ 2",
    "~1",
    "1; 2",
    "x = 1",
    "1 +",
    "",
    "   ",
    "1" * 300,
    "1/0",
    "1 // 0",
    "1 % 0",
    "1.0 / 0.0",
]


@pytest.mark.parametrize("expression", HOSTILE, ids=[repr(h[:30]) for h in HOSTILE])
def test_safe_eval_rejects_hostile_input_quickly(expression: str) -> None:
    start = time.perf_counter()
    with pytest.raises(CalcError) as info:
        safe_eval(expression)
    assert time.perf_counter() - start < 0.1
    assert 0 < len(str(info.value)) < 200


def test_calc_error_is_value_error() -> None:
    assert issubclass(CalcError, ValueError)
    with pytest.raises(CalcError):
        safe_eval(123)  # type: ignore[arg-type]


def test_tasks_are_deterministic_and_well_formed() -> None:
    a, b = make_tasks("train", 300, seed=0), make_tasks("train", 300, seed=0)
    assert a == b
    assert make_tasks("train", 300, seed=1) != a
    for i, task in enumerate(a):
        assert set(task) == {"id", "question", "expression", "answer"}
        assert task["id"] == f"calc-train-{i}"
        assert isinstance(task["answer"], int) and task["answer"] >= 0
        assert safe_eval(task["expression"]) == task["answer"]
        numbers = [
            int(x) for x in task["expression"].replace("(", " ").replace(")", " ").split() if x.isdigit()
        ]
        for n in numbers:  # every number of the expression is stated in the question
            assert str(n) in task["question"]
    assert len({t["question"] for t in a}) == len(a)


def test_splits_are_disjoint() -> None:
    train, test = CalcEnv.tasks("train"), CalcEnv.tasks("test")
    assert len(train) == 2000 and len(test) == 200
    assert {t["expression"] for t in train}.isdisjoint({t["expression"] for t in test})
    assert {t["question"] for t in train}.isdisjoint({t["question"] for t in test})
    assert split_of("add", (1, 2)) in ("train", "test")
    with pytest.raises(ValueError):
        CalcEnv.tasks("valid")


def test_tasks_are_varied() -> None:
    tasks = CalcEnv.tasks("train")
    operators = {tuple(op for op in "+-*/" if op in t["expression"]) for t in tasks}
    assert len(operators) >= 5
    assert len({t["question"].split()[0] for t in tasks}) >= 10


def test_calculate_tool_schema_has_argument_description() -> None:
    (schema,) = CalcEnv.tool_schemas()
    fn = schema["function"]
    assert fn["name"] == "calculate" and fn["description"]
    prop = fn["parameters"]["properties"]["expression"]
    assert prop["type"] == "string" and prop["description"]
    assert fn["parameters"]["required"] == ["expression"]


async def test_calculate_tool_and_errors() -> None:
    env = CalcEnv()
    await env.reset(CalcEnv.tasks("test")[0])
    assert await env.call_tool("calculate", {"expression": "23 + 3 * 12"}) == "59"
    assert await env.call_tool("calculate", {"expression": "7 / 2"}) == "3.5"
    with pytest.raises(ToolError, match="division by zero"):
        await env.call_tool("calculate", {"expression": "1/0"})
    with pytest.raises(ToolError):
        await env.call_tool("calculate", {"expression": "__import__('os')"})


def test_last_number() -> None:
    assert last_number("The answer is 59.") == 59
    assert last_number("3 apples and 1,234 pears") == 1234
    assert last_number("it is -4") == -4
    assert last_number("2.5 then 7.25") == 7.25
    assert last_number("no digits") is None


def _episode(final: str, with_tool: bool = True) -> list[Message]:
    msgs = [Message(role="system", content=CalcEnv.system_prompt or ""), Message(role="user", content="q")]
    if with_tool:
        call = ToolCall(id="c0", name="calculate", arguments={"expression": "23 + 3 * 12"})
        msgs += [
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", content="59", tool_call_id="c0"),
        ]
    return [*msgs, Message(role="assistant", content=final)]


@pytest.mark.parametrize(
    ("final", "with_tool", "reward", "used"),
    [
        ("The answer is 59.", True, 1.0, 1.0),
        ("59", True, 1.0, 1.0),
        ("The answer is 59.", False, 1.0, 0.0),
        ("It is 59, not 60.", True, 0.0, 1.0),
        ("The answer is 58.", True, 0.0, 1.0),
        ("I do not know.", True, 0.0, 1.0),
        ("", True, 0.0, 1.0),
    ],
)
async def test_reward(final: str, with_tool: bool, reward: float, used: float) -> None:
    env = CalcEnv()
    await env.reset({"id": "t", "question": "q", "expression": "23 + 3 * 12", "answer": 59})
    assert await env.reward(_episode(final, with_tool)) == {"reward": reward, "used_tool": used}


async def test_reward_zero_when_last_turn_is_a_tool_call() -> None:
    env = CalcEnv()
    await env.reset({"id": "t", "question": "q", "expression": "1 + 1", "answer": 2})
    call = ToolCall(id="c0", name="calculate", arguments={"expression": "1 + 1"})
    msgs = [Message(role="user", content="q"), Message(role="assistant", content="2", tool_calls=[call])]
    assert await env.reward(msgs) == {"reward": 0.0, "used_tool": 1.0}
    dict_msgs = [m.to_openai() for m in _episode("The answer is 2.")]
    assert (await env.reward(dict_msgs))["reward"] == 1.0  # OpenAI-style dicts work too
