"""Black-box episodes with a scripted engine and real agent processes: the environment's reward or the
program's, and every way a program can fail recorded as a failed episode (never raised)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from agentrl.config.policy import AgentConfig, PolicyConfig
from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.envs.calc import CalcEnv
from agentrl.http.policy.blackbox import BlackBoxRunner
from agentrl.http.policy.run import serving
from agentrl.http.policy.service import PolicyService
from agentrl.orchestrator.samples import to_samples
from agentrl.rollout.chat import ChatFormat
from agentrl.tools.modelgen.tokenizer import train_tokenizer
from tests.unit.http.policy.scripted import Scripted

TASK = {"id": "t1", "question": "What is 6 * 7?", "answer": 42}
CALL_ONCE = """
import json, os, openai
task = json.loads(os.environ["AGENTRL_TASK"])
assert task["messages"][-1]["content"] == "What is 6 * 7?" and "task" not in task
r = openai.OpenAI(max_retries=0).chat.completions.create(model="m", messages=task["messages"])
print(r.choices[0].message.content)
"""
POST_REWARD = """
import json, os, httpx, openai
task = json.loads(os.environ["AGENTRL_TASK"])
assert task["task"]["answer"] == 42
openai.OpenAI(max_retries=0).chat.completions.create(model="m", messages=task["messages"])
url = os.environ["OPENAI_BASE_URL"] + "/episodes/" + os.environ["AGENTRL_EPISODE_ID"] + "/reward"
httpx.post(url, json={"reward": 0.7}, headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}).raise_for_status()
"""


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return ChatFormat(train_tokenizer(["The answer is 42.", "What is 6 * 7?", "I think 41."] * 20, vocab_size=400))


async def _run(chat: ChatFormat, tmp_path: Path, program: str, texts: list[str], n: int = 1,
               **agent: object) -> list:
    script = tmp_path / "agent.py"
    script.write_text(program)
    service = PolicyService(PolicyConfig(port=0, token="x" * 32), Scripted(chat, texts), chat)
    async with serving(service, "x" * 32) as url:
        runner = BlackBoxRunner(AgentConfig(command=[sys.executable, str(script)], **agent), service, url, CalcEnv,
                                SamplingConfig())
        return await runner.run_group(TASK, n)


async def test_env_reward_scores_the_programs_answers(chat: ChatFormat, tmp_path: Path) -> None:
    rows = await _run(chat, tmp_path, CALL_ONCE, ["The answer is 42.", "I think 41."], n=2)
    assert sorted(r.reward for r in rows) == [0.0, 1.0] and not any(r.failed for r in rows)
    assert len({r.episode_id for r in rows}) == 2 and len({r.group_id for r in rows}) == 1
    assert all(r.completion_ids and sum(r.loss_mask) == len(r.completion_ids) for r in rows)
    samples, _ = to_samples([rows], normalize_std=False)
    assert sorted(s.advantage for s in samples) == [-0.5, 0.5]


async def test_the_program_can_post_its_reward(chat: ChatFormat, tmp_path: Path) -> None:
    (row,) = await _run(chat, tmp_path, POST_REWARD, ["I think 41."], reward="agent")
    assert row.reward == 0.7 and not row.failed


@pytest.mark.parametrize(("program", "agent", "stop", "words"), [
    ("import sys; sys.stderr.write('boom'); sys.exit(3)", {}, StopReason.ENV_ERROR, "status 3: boom"),
    ("import time; time.sleep(30)", {"timeout_s": 1.0}, StopReason.WALL_TIMEOUT, "ran past 1s"),
    ("print('no call')", {}, StopReason.ENV_ERROR, "made no call"),
    ("x = bytearray(512 << 20)", {"memory_mb": 256}, StopReason.ENV_ERROR, "MemoryError"),
    (CALL_ONCE, {"reward": "agent"}, StopReason.ENV_ERROR, None),
])
async def test_a_broken_program_is_a_failed_episode(chat: ChatFormat, tmp_path: Path, program: str, agent: dict,
                                                    stop: StopReason, words: str | None) -> None:
    if agent.get("reward") == "agent":
        program = program.replace('and "task" not in task', "")
        words = "without posting a reward"
    (row,) = await _run(chat, tmp_path, program, ["The answer is 42."], **agent)
    assert row.failed and row.stop_reason is stop and words in (row.error or ""), row.error
    assert row.completion_ids == [] and to_samples([[row]])[0] == []


DRIVER = """
import asyncio, sys
from pathlib import Path
from agentrl.config.policy import AgentConfig, PolicyConfig
from agentrl.config.run import SamplingConfig
from agentrl.envs.calc import CalcEnv
from agentrl.tools.modelgen.tokenizer import train_tokenizer
from agentrl.http.policy.blackbox import BlackBoxRunner
from agentrl.http.policy.run import serving
from agentrl.http.policy.service import PolicyService
from agentrl.rollout.chat import ChatFormat
from tests.unit.http.policy.scripted import Scripted

async def main():
    chat = ChatFormat(train_tokenizer(["The answer is 42."] * 20, vocab_size=300))
    service = PolicyService(PolicyConfig(port=0, token="x" * 32), Scripted(chat, []), chat)
    async with serving(service, "x" * 32) as url:
        runner = BlackBoxRunner(AgentConfig(command=[sys.executable, sys.argv[1], sys.argv[2]]), service, url,
                                CalcEnv, SamplingConfig())
        await runner.run_group({"id": "t1", "question": "What is 6 * 7?", "answer": 42}, 2)

asyncio.run(main())
"""
SLEEPER = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
with open(os.path.join(sys.argv[1], f"{os.getpid()}.pids"), "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def test_a_sigkilled_driver_leaves_no_agent_program_behind(tmp_path: Path) -> None:
    """The run's driver dies by SIGKILL mid-episode: its agent programs, and what they started in sessions of
    their own, end within 10 s (the warden: agentrl.core.utils.lifeline)."""
    import os
    import signal
    import subprocess
    import time

    (tmp_path / "driver.py").write_text(DRIVER)
    (tmp_path / "agent.py").write_text(SLEEPER)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    root = Path(__file__).resolve().parents[4]
    driver = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tmp_path / "agent.py"), str(pids_dir)],
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, start_new_session=True)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(list(pids_dir.glob("*.pids"))) < 2:
            assert driver.poll() is None and time.monotonic() < deadline, "the agents did not start"
            time.sleep(0.2)
        pids = [int(p) for f in pids_dir.glob("*.pids") for p in f.read_text().split()]
        assert all(_alive(p) for p in pids)
        driver.kill()
        driver.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [p for p in pids if _alive(p)], "agent processes outlived their driver by 10 s"
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
        for pid in pids:  # what a failure left, by its pid
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


EXAMPLES = Path(__file__).resolve().parents[4] / "examples"
WRONG_ARGS = '<tool_call>\n{"name": "calculate", "arguments": {"expr": "2 + 3"}}\n</tool_call>'


@pytest.mark.parametrize("script", [["agents_sdk_agent.py"], ["langchain_agent.py"]])
async def test_the_example_agents_end_an_episode_the_model_never_answers(tmp_path: Path, script: list[str]) -> None:
    """A model that only ever calls the tool, half the time with arguments the tool does not take: the framework
    examples end the episode unanswered (scored 0, trained on) instead of crashing into a failed episode (the
    Agents SDK raises MaxTurnsExceeded, a LangChain tool a ValidationError)."""
    pytest.importorskip("agents", reason="openai-agents is not installed (pip install 'agentrl[dev]')")
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (pip install 'agentrl[dev]')")
    from tests.unit.http.policy.scripted import CALL, scripted_chat

    chat = scripted_chat()
    service = PolicyService(PolicyConfig(port=0, token="x" * 32), Scripted(chat, [WRONG_ARGS, CALL] * 4), chat)
    async with serving(service, "x" * 32) as url:
        command = [sys.executable, str(EXAMPLES / script[0]), *script[1:]]
        runner = BlackBoxRunner(AgentConfig(command=command, timeout_s=60), service, url, CalcEnv, SamplingConfig())
        (row,) = await runner.run_group(TASK, 1)
    assert not row.failed and row.reward == 0.0, row.error
    assert row.num_turns >= 4, "the model's every call was answered and the episode ran to the agent's limit"


# what the model samples after the opening a forced tool call puts in the prompt (`<tool_call>\n{"name":`)
FORCED_CALCULATE = ' "calculate", "arguments": {"expression": "6 * 7"}}\n</tool_call>'
FORCED_FINAL_ANSWER = ' "final_answer", "arguments": {"answer": "42"}}\n</tool_call>'


async def test_the_smolagents_example_answers_with_its_final_answer_tool(tmp_path: Path) -> None:
    """smolagents' ToolCallingAgent forces a tool call on every turn (``tool_choice: "required"``) and answers by
    calling its ``final_answer`` tool: the episode runs its calculator, is recorded (one row per call) and is not
    failed; calc's reward scores it 0 even when the answer is right, since the last assistant turn is a tool
    call, not text."""
    pytest.importorskip("smolagents", reason="smolagents is not installed (pip install 'agentrl[dev]')")
    from tests.unit.http.policy.scripted import scripted_chat

    chat = scripted_chat()
    engine = Scripted(chat, [FORCED_CALCULATE, FORCED_FINAL_ANSWER])
    # smolagents' own prompt is long: the scripted tokenizer's 400 tokens make it thousands
    service = PolicyService(PolicyConfig(port=0, token="x" * 32, max_context_tokens=32768), engine, chat)
    async with serving(service, "x" * 32) as url:
        command = [sys.executable, str(EXAMPLES / "smolagents_agent.py")]
        runner = BlackBoxRunner(AgentConfig(command=command, timeout_s=60), service, url, CalcEnv, SamplingConfig())
        rows = await runner.run_group(TASK, 1)
    assert not any(r.failed for r in rows), [r.error for r in rows]
    # smolagents sends its call back as assistant text ("Calling tools: [...]") and the result as a user message
    # ("Observation: ..."): the second call rewrites the first's history, so it starts a row of its own
    assert len(engine.prompts) == 2 and len(rows) == 2 and all(r.completion_ids for r in rows)
    first, second = (chat.tokenizer.decode(p) for p in engine.prompts)
    assert first.endswith('<tool_call>\n{"name":') and "What is 6 * 7?" in first
    assert "42" not in first and "42" in second, "the calculator's result reached the model"
    assert [r.reward for r in rows] == [0.0] * len(rows)


async def test_an_evaluation_view_samples_at_its_own_temperature_beside_training(chat: ChatFormat,
                                                                                 tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(CALL_ONCE)
    engine = Scripted(chat, ["The answer is 42."] * 4, delay=0.05)
    service = PolicyService(PolicyConfig(port=0, token="x" * 32, temperature=1.0), engine, chat)
    async with serving(service, "x" * 32) as url:
        train = BlackBoxRunner(AgentConfig(command=[sys.executable, str(script)]), service, url, CalcEnv,
                               SamplingConfig(temperature=1.0))
        held_out = train.with_sampling(SamplingConfig(temperature=0.0))
        rows = await asyncio.gather(train.run_group(TASK, 2), held_out.run_group({**TASK, "id": "e1"}, 2))
    assert [sorted(r.temperature for r in g) for g in rows] == [[1.0, 1.0], [0.0, 0.0]]
    assert sorted(kw["temperature"] for kw in engine.kwargs) == [0.0, 0.0, 1.0, 1.0]
    assert train.sampling.temperature == 1.0 and service.config.temperature == 1.0
