"""An unmodified smolagents ``ToolCallingAgent`` (examples/smolagents_agent.py) through a real
`agentrl serve-policy` on SmolLM2-135M-Instruct (built-in ``hermes`` template, the model's 8,192-token window):
every call it makes is answered, and each episode is recorded as rows, whatever the model answers.

The example runs inside a small wrapper that logs the status and usage of every HTTP response its process
receives (``Client.send`` of httpx, or httpx2, under the ``openai`` SDK that smolagents' ``OpenAIModel``
drives): a refused call would show there as a 4xx. Not on the embedded tiny model: with its tokenizer
smolagents' own system prompt and tool descriptions make the first call of a calc question 2,015 tokens (the
forced call's opening included) and the second 2,108, beyond its 2,048-token window; SmolLM2's tokenizer
makes the first 1,315 to 1,326 on calc's test tasks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_policy_window import TOKEN, serving
from tests.integration.test_real_model import ROOT, smollm2_dir, smollm2_gguf  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "smolagents_agent.py"

WRAPPER = """
import importlib, json, os, runpy, sys

log, script = sys.argv[1], sys.argv[2]


def logging_send(send):
    def logged_send(self, request, **kw):
        response = send(self, request, **kw)
        entry = {"path": request.url.path, "status": response.status_code}
        if not kw.get("stream"):
            response.read()
            json_body = response.headers.get("content-type", "").startswith("application/json")
            body = response.json() if json_body else {}
            entry["usage"], entry["error"] = body.get("usage"), body.get("error")
        with open(log, "a") as f:
            f.write(json.dumps(entry) + "\\n")
        return response
    return logged_send


for name in ("httpx", "httpx2"):  # the openai SDK's HTTP client (httpx2 in its newer releases)
    try:
        module = importlib.import_module(name)
    except ImportError:
        continue
    module.Client.send = logging_send(module.Client.send)
sys.argv = [script, *sys.argv[3:]]
sys.path.insert(0, os.path.dirname(script))  # as `python script.py` would
runpy.run_path(script, run_name="__main__")
"""


def run_episode(url: str, task: dict[str, Any], work: Path, timeout_s: float = 900) -> dict[str, Any]:
    """One episode of the example against the endpoint at ``url``: its exit status, output, the HTTP responses its
    process received (``calls``: those of /chat/completions) and the endpoint's trajectory of it."""
    import httpx

    work.mkdir(parents=True, exist_ok=True)
    wrapper, log = work / "logged_agent.py", work / "http.jsonl"
    wrapper.write_text(WRAPPER)
    log.unlink(missing_ok=True)
    with httpx.Client(timeout=60) as h:
        ep = h.post(f"{url}/v1/episodes", json={"task_id": str(task["id"])},
                    headers={"Authorization": f"Bearer {TOKEN}"}).json()
        env = {**os.environ, "OPENAI_BASE_URL": ep["base_url"], "OPENAI_API_KEY": ep["api_key"],
               "AGENTRL_EPISODE_ID": ep["episode_id"], "AGENTRL_TASK": json.dumps(task)}
        proc = subprocess.run([sys.executable, str(wrapper), str(log), str(EXAMPLE)], env=env, capture_output=True,
                              text=True, timeout=timeout_s)
        trajectory = h.get(f"{ep['base_url']}/episodes/{ep['episode_id']}/trajectory",
                           headers={"Authorization": f"Bearer {TOKEN}"}).json()
    responses = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    assert responses or proc.returncode, "the wrapper logged no HTTP response of the agent"
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-3000:], "responses": responses,
            "calls": [r for r in responses if r["path"].endswith("/chat/completions")], "trajectory": trajectory}


@pytest.fixture(scope="module")
def smollm2(request: pytest.FixtureRequest) -> Path:
    """``models/smollm2-135m`` as this checkout has it, else converted from the packaged file (test_real_model)."""
    from agentrl.tools.modelgen.gguf import SMOLLM2

    there = ROOT / SMOLLM2.default_dir
    if (there / "config.json").is_file() and (there / "model.safetensors").is_file():
        return there
    return request.getfixturevalue("smollm2_dir")


def calc_tasks(n: int) -> list[dict[str, Any]]:
    """The first ``n`` calc test tasks as an agent program receives them (opening messages, no answer)."""
    from agentrl.envs.calc import CalcEnv

    return [{"id": t["id"], "answer": t["answer"],
             "messages": [{"role": "system", "content": CalcEnv.system_prompt},
                          {"role": "user", "content": t["question"]}]} for t in CalcEnv.tasks("test")[:n]]


@pytest.mark.timeout(2400)
def test_smolagents_tool_calling_agent_runs_through_serve_policy_on_smollm2(smollm2: Path, tmp_path: Path) -> None:
    pytest.importorskip("smolagents", reason="smolagents is not installed (pip install 'agentrl[agents]')")
    with serving(smollm2, "--chat-template", "hermes") as url:
        for i, task in enumerate(calc_tasks(2)):
            ep = run_episode(url, {k: v for k, v in task.items() if k != "answer"}, tmp_path / str(i))
            assert ep["rc"] == 0, ep["stderr"]
            refused = [r for r in ep["responses"] if r["status"] >= 400]
            assert not refused, refused
            calls, trajectory = ep["calls"], ep["trajectory"]
            # every chat call the agent made was answered and recorded in its episode
            assert calls and len(calls) == trajectory["calls"], (calls, trajectory)
            # smolagents' first prompt is beyond the calc preset's 1,024-token window the endpoint used to serve
            assert 1024 < calls[0]["usage"]["prompt_tokens"] < 8192, calls[0]
            rows = trajectory["rows"]
            assert rows and sum(r["calls"] for r in rows) == len(calls), trajectory
            assert all(r["completion_ids"] and any(r["loss_mask"]) for r in rows)
            assert all(len(r["logprobs"]) == len(r["completion_ids"]) == len(r["loss_mask"]) for r in rows)
