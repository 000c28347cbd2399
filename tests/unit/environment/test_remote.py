"""`RemoteEnvironment` against a real server (uvicorn in a thread): a drop-in for a local environment,
with bounded retries and idempotent steps."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import agentrl
from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.environment.registry import load_env
from agentrl.environment.remote import RemoteEnvError, RemoteEnvironment
from agentrl.envs.calc import CalcEnv
from agentrl.http.server import create_app
from agentrl.inference.client import Generation
from agentrl.rollout.chat import ChatFormat
from agentrl.rollout.loop import run_episode
from agentrl.tools.modelgen.tokenizer import train_tokenizer
from tests.env_server_helpers import TOKEN, Probe, ThreadServer, config


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadServer]:
    with ThreadServer(create_app(config(), TOKEN)) as s:
        yield s


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    corpus = [
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "3 + 4"}}\n</tool_call>',
        "The answer is 7. What is 3 + 4?",
    ] * 20
    return ChatFormat(train_tokenizer(corpus, vocab_size=500))


class Scripted:
    """Replies with scripted texts, ending each with eos."""

    def __init__(self, chat: ChatFormat, texts: list[str]) -> None:
        self.chat, self.texts = chat, list(texts)

    async def generate(self, prompt_ids: list[int], **kw: Any) -> Generation:
        ids = [*self.chat.encode(self.texts.pop(0)), self.chat.eos_token_id]
        return Generation(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason="stop",
            weight_versions=None,
            endpoint="fake",
        )


def tool_call(name: str, **args: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


def test_bind_describes_the_remote_env(server: ThreadServer) -> None:
    remote = RemoteEnvironment.bind(server.url, TOKEN, env="calc")
    assert issubclass(remote, agentrl.Environment) and remote.name == "calc"
    assert (remote.max_turns, remote.max_tokens_per_turn, remote.system_prompt) == (
        CalcEnv.max_turns,
        CalcEnv.max_tokens_per_turn,
        CalcEnv.system_prompt,
    )
    assert remote.tool_schemas() == CalcEnv.tool_schemas()
    assert remote.tasks("test") == list(CalcEnv.tasks("test"))
    assert len(RemoteEnvironment.bind(server.url, TOKEN, env="probe").tasks("train")) == 250
    assert load_env("calc", url=server.url, token=TOKEN).name == "calc"
    with pytest.raises(RemoteEnvError, match=r"serves \['probe', 'calc'\], not 'nope'"):
        RemoteEnvironment.bind(server.url, TOKEN, env="nope")
    with pytest.raises(RemoteEnvError, match="HTTP 401"):
        RemoteEnvironment.bind(server.url, "wrong-token-but-long-enough", env="calc")


async def test_remote_episode_matches_local_episode(server: ThreadServer, chat: ChatFormat) -> None:
    task = CalcEnv.tasks("test")[5]
    script = [
        tool_call("calculate", expression=task["expression"]),
        tool_call("calculate", expression="1/0"),
        f"The answer is {task['answer']}.",
    ]
    remote = RemoteEnvironment.bind(server.url, TOKEN, env="calc")
    local_traj = await run_episode(CalcEnv, task, Scripted(chat, script), chat, SamplingConfig())
    remote_traj = await run_episode(remote, task, Scripted(chat, script), chat, SamplingConfig())
    remote_traj.check()
    assert remote_traj.error is None and remote_traj.stop_reason == StopReason.COMPLETED
    for field in (
        "reward",
        "metrics",
        "num_turns",
        "num_tool_calls",
        "num_malformed_tool_calls",
        "prompt_ids",
        "loss_mask",
        "logprobs",
        "stop_reason",
        "env",
    ):
        assert getattr(remote_traj, field) == getattr(local_traj, field), field
    assert len(remote_traj.completion_ids) == len(local_traj.completion_ids)
    strip = [(m.role, m.content, m.name) for m in remote_traj.messages]
    assert strip == [(m.role, m.content, m.name) for m in local_traj.messages]
    assert strip[3] == ("tool", str(task["answer"]), "calculate") and strip[5][1] == "Error: division by zero"
    assert remote_traj.reward == 1.0


async def test_tool_failures_map_onto_local_exceptions(server: ThreadServer) -> None:
    remote = RemoteEnvironment.bind(server.url, TOKEN, env="probe")
    env = remote()
    opening = await env.reset({"id": "map-1"})
    assert opening[0] == {"role": "system", "content": "Probe the tools."} and env.session_id
    assert await env.call_tool("count", {}) == "1"
    with pytest.raises(agentrl.ToolError, match="as requested"):
        await env.call_tool("fail", {"kind": "tool"})
    with pytest.raises(agentrl.environment.base.ToolArgumentError, match="unknown tool"):
        await env.call_tool("nope", {})
    with pytest.raises(TimeoutError):
        await env.call_tool("sleep", {"seconds": 10})  # the tool's own 1 s limit
    assert await env.call_tool("submit", {"answer": "42"}) == "submitted" and env.finished
    assert (await env.reward([]))["reward"] == 1.0
    await env.close()
    await env.close()  # idempotent
    crash = remote()
    await crash.reset({"id": "map-2"})
    with pytest.raises(RemoteEnvError, match="environment bug"):
        await crash.call_tool("fail", {"kind": "crash"})
    await crash.close()


class LoseFirstResponse(httpx.AsyncBaseTransport):
    """Forwards every request; the first step's answer is 'lost' (a read timeout after the server ran it)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/step") and not self.lost:
            await response.aread()
            self.lost += 1
            raise httpx.ReadTimeout("answer lost", request=request)
        return response


async def test_retried_step_never_runs_a_tool_twice(server: ThreadServer) -> None:
    transport = LoseFirstResponse()
    remote = RemoteEnvironment.bind(server.url, TOKEN, env="probe")
    remote.transport = transport
    env = remote()
    await env.reset({"id": "lost-1"})
    assert await env.call_tool("count", {"tag": "z"}) == "1"
    assert transport.lost == 1 and Probe.calls["lost-1:z"] == 1
    assert await env.call_tool("count", {"tag": "z"}) == "2"
    await env.close()


async def test_unreachable_server_is_a_clear_bounded_error() -> None:
    t0 = time.monotonic()
    with pytest.raises(RemoteEnvError, match=r"http://127\.0\.0\.1:9 failed GET /v1/envs after 3 attempts"):
        RemoteEnvironment.bind("http://127.0.0.1:9", TOKEN, max_retries=2)
    env = RemoteEnvironment("http://127.0.0.1:9", TOKEN, env="calc", max_retries=1)
    with pytest.raises(RemoteEnvError, match="is it running and reachable"):
        await env.reset({"id": "x"})
    await env.close()
    assert time.monotonic() - t0 < 10


def test_train_with_unreachable_env_url_fails_fast() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "train", "--env", "calc", "--env-url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "http://127.0.0.1:9 failed GET /v1/envs" in r.stderr
