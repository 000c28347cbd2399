"""agentrl consumes an OpenEnv environment: ``examples/openenv_arith.py`` (written with ``openenv-core``,
its own server class and app) runs as a real process; ``OpenEnvEnvironment`` maps its MCP tools, tool
results and rewards; ``agentrl train --env openenv:<url>`` trains on it (the session vLLM server, real
torchrun, CPU) and ``agentrl eval`` evaluates it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentrl.environment.base import ToolArgumentError
from agentrl.orchestrator.metrics import read_jsonl
from tests.unit.environment.test_loading import AGENTRL

pytestmark = [pytest.mark.integration, pytest.mark.long]
pytest.importorskip("openenv.core.env_server.mcp_environment", reason="openenv-core is a test dependency")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def arith_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The example OpenEnv server, a process of its own (stopped by its pid at the end)."""
    port = _free_port()
    log = tmp_path_factory.mktemp("openenv-arith") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "openenv_arith.py"), "--port", str(port)],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        else:
            pytest.fail(f"the example OpenEnv server did not start:\n{log.read_text()[-3000:]}")
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


async def test_openenv_environment_maps_tools_results_and_rewards(arith_url: str) -> None:
    from agentrl.environment.registry import load_env

    cls = load_env(f"openenv:{arith_url}")
    async with httpx.AsyncClient(timeout=10) as http:
        assert cls.name == (await http.get(arith_url + "/metadata")).json()["name"]
    assert sorted(t["function"]["name"] for t in cls.tool_schemas()) == ["add", "answer", "multiply"]
    assert cls.tool_schemas()[0]["function"]["parameters"]["type"] == "object"
    train, test = cls.tasks("train"), cls.tasks("test")
    assert {t["seed"] for t in train[:100]}.isdisjoint(t["seed"] for t in test)
    for right in (True, False):
        env = cls()
        try:
            prompt = await env.reset(test[0])
            assert isinstance(prompt, str) and prompt.startswith("What is ")
            a, b, c = (int(x) for x in prompt.split("?")[0].removeprefix("What is ").replace("*", "+").split("+"))
            assert await env.call_tool("multiply", {"a": a, "b": b}) == str(a * b)
            assert await env.call_tool("add", json.dumps({"a": a * b, "b": c})) == str(a * b + c)
            with pytest.raises(ToolArgumentError, match="nope"):
                await env.call_tool("nope", {})
            assert not env.finished
            await env.call_tool("answer", {"value": a * b + c if right else -1})
            assert env.finished
            assert (await env.reward([]))["reward"] == (1.0 if right else 0.0)
        finally:
            await env.close()


def test_train_and_eval_on_an_openenv_server(vllm_server, tiny_model_dir: Path, arith_url: str,
                                             tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text("steps = 2\ntasks_per_step = 2\ngroup_size = 2\neval_size = 2\n"
                                       "eval_every = 0\n")
    env = f"openenv:{arith_url}"
    out = subprocess.run([AGENTRL, "train", "--env", env, "--model", str(tiny_model_dir),
                          "--endpoint", vllm_server.url, "--config", "run.toml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "runs" / "openenv"
    train = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["num_episodes"] == 4 and r["num_failed"] == 0 for r in train), train
    assert json.loads(out.stdout.splitlines()[-1])["steps"] == 2
    out = subprocess.run([AGENTRL, "eval", "--env", env, "--model", str(tiny_model_dir),
                          "--endpoint", vllm_server.url, "--n", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["env"] == env and result.get("num_failed", 0) == 0, result


def test_bind_fails_clearly_without_a_server() -> None:
    from agentrl.environment.openenv import OpenEnvEnvironment, OpenEnvError

    with pytest.raises(OpenEnvError, match="tools/list failed"):
        OpenEnvEnvironment.bind(f"http://127.0.0.1:{_free_port()}", timeout_s=5)

