"""Black-box episodes with a scripted engine and real agent processes: the environment's reward or the
program's, and every way a program can fail recorded as a failed episode (never raised)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.config.policy import AgentConfig, PolicyConfig
from agentrl.config.run import SamplingConfig
from agentrl.envs.calc import CalcEnv
from agentrl.modelgen.tokenizer import train_tokenizer
from agentrl.orchestrator.samples import to_samples
from agentrl.policy.blackbox import BlackBoxRunner
from agentrl.policy.run import serving
from agentrl.policy.service import PolicyService
from agentrl.rollout.chat import ChatFormat
from agentrl.types import StopReason
from tests.unit.policy.scripted import Scripted

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
