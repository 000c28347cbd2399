"""``agentrl export`` with stock parts: an adapter of the embedded model, exported, is served by vLLM's own OpenAI
server (not agentrl's launcher) and loaded by plain transformers, and both generate what agentrl's own serving
of the adapter generates; ``agentrl eval --endpoint`` scores the export as ``agentrl eval --adapter`` scores the
adapter (greedy, so the same episodes), and so does ``agentrl eval --model`` on the export alone (agentrl's own
engine); ``agentrl doctor`` passes it without ``--chat-template``."""

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
from typing import Any

import pytest

from tests.integration.conftest import tiny_model_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLI = [sys.executable, "-m", "agentrl.cli"]
MESSAGES = [{"role": "user", "content": "What is 12 plus 30?"}]
TOKENS = 12
EPISODES = 8


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a saved LoRA adapter of the tiny model that describes itself, its ``agentrl export``)."""
    from agentrl.config.run import load_config
    from agentrl.launch.described import write_description
    from agentrl.tools.bench.models import lora_shapes, random_lora, save_lora

    root = tmp_path_factory.mktemp("export")
    adapter = save_lora(root / "final_adapter", random_lora(lora_shapes(tiny_model_config(), rank=8), seed=5,
                                                            std=0.05), rank=8, alpha=16)
    write_description(adapter, load_config(None, {"model": str(tiny_model_dir), "output_dir": str(root)}))
    out = root / "exported"
    r = subprocess.run([*CLI, "export", str(adapter), "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1])["merged"] is True
    return adapter, out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stock_server(exported: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's own OpenAI server on the export (owned: its process group is killed by pid at the end)."""
    import httpx

    _, out = exported
    port = _free_port()
    log = tmp_path_factory.mktemp("stock-vllm") / "vllm.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(out), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--max-model-len", "1024", "--enable-auto-tool-choice",
           "--tool-call-parser", "hermes"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server stopped ({proc.returncode}): {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM's server did not start in 600 s: {log.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _prompt(model: Path) -> list[int]:
    from transformers import AutoTokenizer

    return list(AutoTokenizer.from_pretrained(str(model)).apply_chat_template(MESSAGES, add_generation_prompt=True,
                                                                                  return_dict=False))


async def _agentrl_greedy(vllm_server: Any, adapter: Path, prompt: list[int], tmp_path: Path) -> list[int]:
    """The adapter served by agentrl (published as ``agentrl eval --adapter`` publishes it): its greedy tokens."""
    from agentrl.config.run import load_config
    from agentrl.inference import InferenceClient
    from agentrl.launch.described import EVALUATED, publish_saved, read_policy, served_as_trained

    cfg = load_config(None, {"endpoints": [vllm_server.url], "adapter_name": "exported-check",
                             "output_dir": str(tmp_path)}, beneath=read_policy(adapter).overrides(EVALUATED))
    cfg = cfg.with_changes(served_as_trained(cfg, adapter)).resolved()
    assert cfg.serves_adapter  # a LoRA slot: the shared engine's base weights stay as they are
    async with InferenceClient([vllm_server.url], timeout_s=300) as client:
        await publish_saved(cfg, client, adapter, tmp_path / "adapters")
        gen = await client.generate(prompt, max_tokens=TOKENS, temperature=0.0, model=cfg.policy_model)
    return list(gen.token_ids)


@pytest.mark.timeout(1800)
async def test_the_export_serves_on_stock_vllm_and_transformers_as_agentrl_serves_the_adapter(
        vllm_server: Any, exported: tuple[Path, Path], stock_server: str, tmp_path: Path) -> None:
    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl.inference import InferenceClient

    adapter, out = exported
    prompt = _prompt(out)
    want = await _agentrl_greedy(vllm_server, adapter, prompt, tmp_path)
    async with InferenceClient([stock_server], model=str(out), timeout_s=300) as client:
        stock = list((await client.generate(prompt, max_tokens=TOKENS, temperature=0.0)).token_ids)
    assert stock == want
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    eos = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    with torch.no_grad():
        ids = model.generate(torch.tensor([prompt]), max_new_tokens=TOKENS, do_sample=False)[0, len(prompt):].tolist()
    assert ids == want[: len(ids)] and (len(ids) == TOKENS or ids[-1] in eos)
    # the stock server renders tools with the template the export carries
    body = {"model": str(out), "messages": MESSAGES, "max_tokens": 4, "tools": [{"type": "function", "function": {
        "name": "calculate", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]}
    async with httpx.AsyncClient(timeout=300) as h:
        r = await h.post(f"{stock_server}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text


@pytest.mark.timeout(1800)
def test_eval_scores_the_export_on_stock_vllm_as_the_adapter_and_doctor_passes_it(
        vllm_server: Any, exported: tuple[Path, Path], stock_server: str, tmp_path: Path) -> None:
    adapter, out = exported

    def evaluate(*args: str) -> dict[str, Any]:
        r = subprocess.run([*CLI, "eval", *args, "--n", str(EPISODES), "--temperature", "0"], capture_output=True,
                           text=True, timeout=900, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    stock = evaluate("--endpoint", stock_server, "--model", str(out))
    own = evaluate("--adapter", str(adapter), "--endpoint", vllm_server.url)
    assert stock["num_tasks"] == own["num_tasks"] == EPISODES and stock.get("num_failed", 0) == 0
    assert abs(stock["success"] - own["success"]) <= 1 / EPISODES, (stock, own)  # greedy: the same episodes
    assert own["described_by"] == str(adapter / "agentrl_policy.json") and "described_by" not in stock
    # agentrl's own engine on the export (no endpoint, no other flag): the export describes itself
    alone = evaluate("--model", str(out))
    assert alone["num_tasks"] == EPISODES and alone.get("num_failed", 0) == 0
    assert abs(alone["success"] - own["success"]) <= 1 / EPISODES, (alone, own)
    r = subprocess.run([*CLI, "doctor", "--model", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
