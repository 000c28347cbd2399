"""The policy endpoint on its own event loop (a training run's): it answers while the hosting loop is busy,
its generations run on the hosting loop's client, and black-box episodes are recorded as on one loop."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import httpx
import pytest

from agentrl.config.policy import AgentConfig, PolicyConfig
from agentrl.config.run import SamplingConfig
from agentrl.envs.calc import CalcEnv
from agentrl.http.policy.blackbox import BlackBoxRunner
from agentrl.http.policy.service import PolicyService
from agentrl.http.policy.thread import EndpointThread, LoopGenerator
from agentrl.rollout.chat import ChatFormat
from tests.unit.http.policy.scripted import Scripted, scripted_chat

TOKEN = "x" * 32
TASK = {"id": "t1", "question": "What is 2 + 3?", "answer": 5}
CALL_ONCE = """
import json, os, openai
task = json.loads(os.environ["AGENTRL_TASK"])
r = openai.OpenAI(max_retries=0).chat.completions.create(model="m", messages=task["messages"])
print(r.choices[0].message.content)
"""


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return scripted_chat()


class LoopRecorder(Scripted):
    """A scripted engine that notes the thread each generation ran on."""

    threads: set[str]

    async def generate(self, prompt_ids: list[int], **kw: object):  # type: ignore[override]
        self.threads = getattr(self, "threads", set()) | {threading.current_thread().name}
        return await super().generate(prompt_ids, **kw)


async def test_the_endpoint_answers_while_the_hosting_loop_is_blocked(chat: ChatFormat) -> None:
    service = PolicyService(PolicyConfig(port=0), LoopGenerator(Scripted(chat, []), asyncio.get_running_loop()), chat)
    endpoint = EndpointThread(service)
    async with endpoint.serving(TOKEN) as url:
        answered = threading.Event()
        got: list[int] = []

        def client() -> None:
            r = httpx.post(f"{url}/v1/episodes", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            got.append(r.status_code)
            answered.set()

        threading.Thread(target=client, daemon=True).start()
        # this loop blocks until the endpoint has answered: on this loop, it never could
        assert answered.wait(timeout=60), "the endpoint did not answer while its host's loop was blocked"
        assert got == [201] and service.book.open_count == 1


async def test_episodes_run_through_the_thread_and_generate_on_the_hosting_loop(chat: ChatFormat,
                                                                                 tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(CALL_ONCE)
    engine = LoopRecorder(chat, ["The answer is 5.", "I think 4."])
    service = PolicyService(PolicyConfig(port=0), LoopGenerator(engine, asyncio.get_running_loop()), chat)
    endpoint = EndpointThread(service)
    async with endpoint.serving(TOKEN) as url:
        runner = BlackBoxRunner(AgentConfig(command=[sys.executable, str(script)]), service, url, CalcEnv,
                                SamplingConfig(), host=endpoint)
        rows = await runner.run_group(TASK, 2)
    assert sorted(r.reward for r in rows) == [0.0, 1.0] and not any(r.failed for r in rows)
    assert all(r.completion_ids and sum(r.loss_mask) == len(r.completion_ids) for r in rows)
    assert engine.threads == {threading.current_thread().name}  # the run's client, on the run's loop
    assert all(not ep.open for ep in service.book.episodes.values())
    assert not endpoint._thread.is_alive()  # type: ignore[union-attr]


async def test_a_cancelled_call_cancels_its_generation_on_the_hosting_loop(chat: ChatFormat) -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    class Hangs:
        async def generate(self, prompt_ids: list[int], **kw: object) -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancelled.set()
                raise

    gen = LoopGenerator(Hangs(), asyncio.get_running_loop())  # type: ignore[arg-type]
    done = threading.Event()

    def other_loop() -> None:
        async def main() -> None:
            task = asyncio.ensure_future(gen.generate([1, 2], max_tokens=4))
            await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        asyncio.run(main())
        done.set()

    threading.Thread(target=other_loop, daemon=True).start()
    await asyncio.wait_for(started.wait(), 30)
    await asyncio.wait_for(cancelled.wait(), 30)
    assert await asyncio.to_thread(done.wait, 30)


async def test_a_server_that_cannot_start_raises_and_leaves_no_thread(chat: ChatFormat) -> None:
    service = PolicyService(PolicyConfig(port=0), Scripted(chat, []), chat)
    endpoint = EndpointThread(service)
    with pytest.raises(ValueError, match="needs a token"):
        async with endpoint.serving(""):
            pass
    assert not endpoint._thread.is_alive()  # type: ignore[union-attr]
