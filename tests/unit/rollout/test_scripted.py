"""Scripted policies drive the real episode loop: tool-call text -> parsing -> call_tool -> reward."""

from __future__ import annotations

from typing import ClassVar

import pytest

import agentrl
from agentrl.core.types import StopReason
from agentrl.environment.base import run_scope
from agentrl.rollout.scripted import (
    POLICIES,
    NullPolicy,
    OraclePolicy,
    ScriptChat,
    run_scripted,
    summarize,
    tool_call_text,
)


class Vault(agentrl.Environment):
    """Open a vault by setting three digits, then submit."""

    name = "vault"
    max_turns = 3
    events: ClassVar[list[str]] = []

    @classmethod
    def tasks(cls, split: str = "train") -> list[agentrl.Task]:
        return [{"id": "v1", "code": [1, 2, 3]}, {"id": "v2", "code": [7, 0, 7]}]

    @classmethod
    async def setup_run(cls, run_id: str) -> None:
        cls.events.append(f"setup {run_id}")

    @classmethod
    async def teardown_run(cls) -> None:
        cls.events.append("teardown")

    @classmethod
    def reference_solution(cls, task: agentrl.Task) -> list[tuple[str, dict]]:
        return [*(("set_digit", {"pos": i, "value": d}) for i, d in enumerate(task["code"])), ("submit", {})]

    async def reset(self, task: agentrl.Task) -> str:
        self.digits = [0, 0, 0]
        return "Open the vault."

    @agentrl.tool
    def set_digit(self, pos: int, value: int) -> str:
        """Set one digit.

        Args:
            pos: 0, 1 or 2.
            value: the digit.
        """
        if not 0 <= pos <= 2:
            raise agentrl.ToolError("pos must be 0, 1 or 2")
        self.digits[pos] = value
        return "ok"

    @agentrl.tool
    def submit(self) -> str:
        """Try the code."""
        self.finish()
        return "submitted"

    async def reward(self, messages: list[agentrl.Message]) -> dict[str, float]:
        right = sum(a == b for a, b in zip(self.digits, self.task["code"], strict=True))
        return {"reward": float(right == 3), "partial": right / 3}


def test_script_chat_roundtrip() -> None:
    chat = ScriptChat()
    ids = chat.encode("hello") + chat.encode("world") + [chat.eos_token_id]
    assert chat.decode(ids) == "helloworld" and chat.encode("hello") == ids[:1]
    assert tool_call_text("f", {"a": 1}) == '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'


def test_policies_write_tool_calls() -> None:
    task = Vault.tasks()[0]
    turns = OraclePolicy().turns(Vault, task)
    assert len(turns) == Vault.max_turns  # 4 calls in 3 turns: the last turn carries two
    assert turns[-1].count("<tool_call>") == 2
    assert NullPolicy().turns(Vault, task) == [tool_call_text("submit", {})]
    assert set(POLICIES) == {"oracle", "null"}


async def test_oracle_and_null_through_the_loop() -> None:
    tasks = Vault.tasks()
    Vault.events.clear()
    async with run_scope(Vault, "unit"):
        oracle = await run_scripted(Vault, tasks, OraclePolicy(), max_concurrency=2)
        null = await run_scripted(Vault, tasks, NullPolicy(), max_concurrency=2)
    assert Vault.events == ["setup unit", "teardown"]
    assert [t.reward for t in oracle] == [1.0, 1.0] and [t.reward for t in null] == [0.0, 0.0]
    assert all(t.stop_reason == StopReason.COMPLETED and t.num_tool_calls == 4 for t in oracle)
    assert [m.name for m in oracle[0].messages if m.role == "tool"] == ["set_digit"] * 3 + ["submit"]
    s = summarize(oracle)
    assert s["success"] == 1.0 and s["metric_partial"] == 1.0 and s["unsolved"] == []
    assert summarize(null)["metric_partial"] == pytest.approx((0 + 1 / 3) / 2)  # code 7,0,7: one digit is 0


async def test_run_scope_tears_down_on_error() -> None:
    Vault.events.clear()
    with pytest.raises(RuntimeError):
        async with run_scope(Vault, "boom"):
            raise RuntimeError("x")
    assert Vault.events == ["setup boom", "teardown"]


def test_environment_without_reference_solution() -> None:
    class Plain(agentrl.Environment):
        pass

    with pytest.raises(NotImplementedError, match="--policy oracle"):
        OraclePolicy().turns(Plain, {"id": "x"})
