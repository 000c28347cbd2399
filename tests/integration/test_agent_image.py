"""Black-box agent programs in containers (``agent.image``) on a real Docker engine: the program reaches the
policy endpoint through the forwarded socket and nothing else, its episode is recorded as on the host, a
failing or hanging program is a failed episode, and no container is left behind."""

from __future__ import annotations

import pytest

from agentrl.config.policy import AgentConfig, PolicyConfig
from agentrl.config.run import SamplingConfig
from agentrl.core.types import StopReason
from agentrl.envs.calc import CalcEnv
from agentrl.http.policy.blackbox import BlackBoxRunner, agent_mount
from agentrl.http.policy.run import serving
from agentrl.http.policy.service import PolicyService
from agentrl.rollout.chat import ChatFormat
from agentrl.sandbox import build_image, engine_reachable
from tests.conftest import require
from tests.unit.http.policy.scripted import Scripted, scripted_chat

pytestmark = pytest.mark.integration

TOKEN = "agent-image-token-0123456789"
TASK = {"id": "t1", "question": "What is 2 + 3?", "answer": 5}
PROGRAM = """
import json, os, socket, urllib.request
task = json.loads(os.environ["AGENTRL_TASK"])
for host, port in (("1.1.1.1", 53), ("8.8.8.8", 443)):  # no way out but the endpoint
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, port))
        raise SystemExit(f"the container reached {host}:{port}")
    except OSError:
        pass
    finally:
        s.close()
body = json.dumps({"model": "m", "messages": task["messages"]}).encode()
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=30))["choices"][0]["message"]["content"])
"""


@pytest.fixture(scope="module")
def sandbox_image() -> str:
    ok, why = engine_reachable()
    require(ok, f"no Docker engine reachable ({why}); run `eval \"$(sandbox/provision.sh)\"`")
    return build_image()


@pytest.fixture(scope="module")
def chat() -> ChatFormat:
    return scripted_chat()


def _agent_containers(episodes: set[str]) -> list[str]:
    import docker

    client = docker.from_env(timeout=30)
    try:
        found = client.containers.list(all=True, filters={"label": "agentrl.role=agent"})
        return [c.id for c in found if c.labels.get("agentrl.episode") in episodes]
    finally:
        client.close()


async def _run(chat: ChatFormat, image: str, command: list[str], texts: list[str], n: int, **agent: object) -> list:
    service = PolicyService(PolicyConfig(port=0), Scripted(chat, texts), chat)
    with agent_mount() as (mount, uds):
        async with serving(service, TOKEN, uds) as url:
            runner = BlackBoxRunner(AgentConfig(command=command, image=image, **agent), service, url, CalcEnv,
                                    SamplingConfig(), mount=mount)
            rows = await runner.run_group(TASK, n)
    assert _agent_containers(set(service.book.episodes)) == [], "an agent container was left behind"
    return rows


async def test_a_contained_agent_reaches_the_endpoint_and_nothing_else(sandbox_image: str, chat: ChatFormat) -> None:
    rows = await _run(chat, sandbox_image, ["python3", "-c", PROGRAM], ["The answer is 5.", "I think 4."], 2,
                      timeout_s=120)
    assert not any(r.failed for r in rows), [r.error for r in rows]
    assert sorted(r.reward for r in rows) == [0.0, 1.0]
    assert all(r.completion_ids and sum(r.loss_mask) == len(r.completion_ids) for r in rows)


@pytest.mark.parametrize(("command", "agent", "stop", "words"), [
    (["python3", "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"], {}, StopReason.ENV_ERROR, "status 3"),
    (["python3", "-c", "import time; time.sleep(60)"], {"timeout_s": 3.0}, StopReason.WALL_TIMEOUT, "ran past 3s"),
    (["no-such-program"], {}, StopReason.ENV_ERROR, "could not start"),
])
async def test_a_broken_contained_agent_is_a_failed_episode(sandbox_image: str, chat: ChatFormat, command: list[str],
                                                            agent: dict, stop: StopReason, words: str) -> None:
    (row,) = await _run(chat, sandbox_image, command, ["x"], 1, **{"timeout_s": 60.0, **agent})
    assert row.failed and row.stop_reason is stop and words in (row.error or ""), row.error
