"""Black-box training on real parts: agent programs that know nothing of agentrl are launched per episode
against the run's policy endpoint, in front of the session vLLM server, and trained on calc with the real
torchrun trainer. The episodes of each group rotate over four programs: `examples/blackbox_agent.py` (only the
`openai` SDK), `examples/agents_sdk_agent.py` (the OpenAI Agents SDK, with its default Responses model and with
its Chat Completions model) and `examples/langchain_agent.py` (LangChain).

Each program runs unmodified inside a small wrapper that then posts its episode's reward itself
(``reward = "agent"``), alternating 0 and 1 over the episodes of each task. Scored by the environment, every
episode of a group could score the same (the tiny model solves some tasks always and others never, and which
ones depends on its build and on sampling), and then nothing is trained: the check that the trainer takes the
endpoint's rows on-policy must not depend on that. The environment-scored path is covered by the unit tests
of the black-box runner (tests/unit/http/policy/test_blackbox.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from agentrl.config.run import load_config
from agentrl.orchestrator.metrics import read_jsonl
from agentrl.orchestrator.run import TrainingRun

pytestmark = [pytest.mark.integration, pytest.mark.long]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# the agent programs trained together, one after another over each task's episodes
PROGRAMS = [["blackbox_agent.py"], ["agents_sdk_agent.py"], ["agents_sdk_agent.py", "--api", "chat_completions"],
            ["langchain_agent.py"]]

WRAPPER = """
import fcntl, json, os, runpy, sys, urllib.request

counters, programs = sys.argv[1], json.loads(sys.argv[2])
task = json.loads(os.environ["AGENTRL_TASK"])
# the n-th episode of a task runs program n % len(programs) and scores n % 2: every group of two or more has
# both rewards, and every program runs
with open(os.path.join(counters, f"{task['id']}.count"), "a+") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    f.seek(0)
    n = len(f.read())
    f.write(".")
script, *args = programs[n % len(programs)]
sys.argv = [script, *args]
sys.path.insert(0, os.path.dirname(script))  # as `python script.py` would
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    assert not e.code, e.code
with open(os.path.join(counters, "ran.log"), "a") as f:
    f.write(" ".join(programs[n % len(programs)]) + "\\n")
url = f"{os.environ['OPENAI_BASE_URL']}/episodes/{os.environ['AGENTRL_EPISODE_ID']}/reward"
req = urllib.request.Request(url, data=json.dumps({"reward": float(n % 2)}).encode(), method="POST",
                             headers={"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
                                      "Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=60).read()
"""


async def test_train_unmodified_agent_programs_of_four_kinds_on_calc(vllm_server, tiny_model_dir: Path,
                                                                   tmp_path: Path) -> None:
    """Two real steps whose episodes are run, in turn, by a plain `openai` SDK loop, the OpenAI Agents SDK with
    its default Responses model and with its Chat Completions model, and a LangChain tool-calling agent."""
    pytest.importorskip("agents", reason="openai-agents is not installed (pip install 'agentrl[dev]')")
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed (pip install 'agentrl[dev]')")
    wrapper, counters = tmp_path / "agent_with_reward.py", tmp_path / "counters"
    wrapper.write_text(WRAPPER)
    counters.mkdir()
    programs = [[str(EXAMPLES / script), *args] for script, *args in PROGRAMS]
    overrides = {
        "env": "calc", "name": "blackbox", "output_dir": str(tmp_path), "model": str(tiny_model_dir),
        "endpoints": [vllm_server.url], "steps": 2, "tasks_per_step": 2, "group_size": 4, "eval_size": 4,
        "eval_every": 0, "checkpoint_every": 0, "engine_warmup": False,
        "agent": {"command": [sys.executable, str(wrapper), str(counters), json.dumps(programs)], "reward": "agent",
                  "timeout_s": 120},
        "trainer": {"lora_train_embedding": False},  # the adapter path: the engine is shared
    }
    summary = await TrainingRun(load_config(None, overrides), progress=False).run()
    recs = read_jsonl(tmp_path / "blackbox" / "metrics.jsonl")
    train = [r for r in recs if r["kind"] == "train"]
    evals = [r for r in recs if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2] and [r["version"] for r in train] == [1, 2]
    assert len(evals) == 2 and all(e["num_failed"] == 0 and e["num_episodes"] == 4 for e in evals), evals
    for r in train:
        # every episode of the agent programs became at least one row, none failed
        assert r["num_failed"] == 0, r["errors"]
        assert r["num_episodes"] == 8 and r["num_rows"] >= 8, r
        assert r["model_tokens"] > 0 and r["turns_mean"] >= 1
        if r["num_trained"]:
            assert r["train_num_tokens"] > 0 and r["train_loss"] == r["train_loss"]
            # on-policy: the endpoint's recorded behaviour logprobs match the trainer's
            assert r["train_is_weight_mean"] == pytest.approx(1.0, abs=0.02)
            assert r["train_policy_version"] == r["trained_on_version"] == r["version"] - 1
    # every group has both rewards (see WRAPPER), so every episode of both steps is trained on
    assert all(r["num_trained"] >= 8 and r["reward_mean"] == pytest.approx(0.5) for r in train), train
    ran = (counters / "ran.log").read_text().splitlines()
    # each group of four runs every program once (4 groups), and the evaluations add episodes of the first two
    assert len(ran) == 16 + 8 and all(ran.count(" ".join(p)) >= 4 for p in programs), ran
    assert summary["steps"] == 2 and 0.0 <= summary["success_after"] <= 1.0
    assert (tmp_path / "blackbox" / "final_adapter" / "adapter_model.safetensors").is_file()

