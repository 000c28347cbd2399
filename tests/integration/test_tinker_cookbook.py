"""tinker-cookbook 0.6.1's recipes, unmodified, against ``agentrl serve-tinker`` on the embedded tiny model: each
recipe runs as its own process (``python -m tinker_cookbook.recipes...`` with the recipe's own flags only), offline
(``HF_HUB_OFFLINE=1``), its ``model_name`` the model directory's path, which the server serves under that name and
the cookbook's ``get_tokenizer`` loads locally."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.long]  # about 1 to 2 minutes in all

KEY = "tml-agentrl-cookbook-test"
RECIPE_TIMEOUT_S = 300


@dataclass
class Served:
    url: str
    model_name: str
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``serve-tinker`` on the tiny model, served under its directory's absolute path; killed with its engine
    (the whole process group) at the end."""
    require(importlib.util.find_spec("tinker") is not None, "the tinker SDK is not installed (pip install 'agentrl[tinker]')")
    require(importlib.util.find_spec("tinker_cookbook") is not None,
            "tinker-cookbook is not installed (pip install --no-deps tinker-cookbook==0.6.1, see docs/tinker.md)")
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    root = tmp_path_factory.mktemp("serve-tinker-cookbook")
    model_name = str(tiny_model_dir.resolve())
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = root / "server.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentrl.cli", "serve-tinker", "--model", str(tiny_model_dir), "--model-name",
             model_name, "--port", str(port), "--dir", str(root / "state"), "--max-rank", "8", "--max-adapters", "2"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"serve-tinker exited: {log.read_text()[-2000:]}"
            try:
                if httpx.get(f"{url}/api/v1/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"serve-tinker not up in 120 s: {log.read_text()[-2000:]}"
            time.sleep(0.3)
        yield Served(url, model_name, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _run_recipe(served: Served, module: str, log_path: Path, *flags: str) -> list[dict]:
    """Run one recipe to its end; return the rows of the metrics file it wrote."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TINKER_API_KEY": KEY,
           "TINKER_COOKBOOK_RUNS_DIR": str(log_path.parent), "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", module, f"model_name={served.model_name}", "renderer_name=role_colon",
           f"base_url={served.url}", f"log_path={log_path}", "behavior_if_log_dir_exists=delete", *flags]
    out = log_path.parent / f"{log_path.name}.out"
    with out.open("wb") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=RECIPE_TIMEOUT_S, check=False)
    text = out.read_text(errors="replace")
    assert proc.returncode == 0, f"{module} failed (rc {proc.returncode}):\n{text[-4000:]}\nserver:\n" \
                                 f"{served.log.read_text(errors='replace')[-2000:]}"
    metrics = log_path / "metrics.jsonl"
    assert metrics.is_file(), f"{module} wrote no metrics.jsonl:\n{text[-2000:]}"
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def test_chat_sl_recipe_trains_on_its_example_conversations(served: Served, tmp_path: Path) -> None:
    """chat_sl on the cookbook's bundled example conversations: three steps, a finite training loss each, and
    the recipe's final checkpoint saved on the server."""
    import tinker_cookbook

    data = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    rows = _run_recipe(served, "tinker_cookbook.recipes.chat_sl.train", tmp_path / "sl", f"dataset={data}",
                       "lora_rank=8", "batch_size=8", "max_steps=3", "max_length=512", "eval_every=0", "save_every=0")
    steps = [r for r in rows if "train_mean_nll" in r]
    assert [r["step"] for r in steps] == [0, 1, 2], rows
    assert all(0 < r["train_mean_nll"] < 20 for r in steps), steps
    checkpoints = (tmp_path / "sl" / "checkpoints.jsonl").read_text()
    assert "tinker://" in checkpoints and "final" in checkpoints, checkpoints


def test_math_rl_recipe_samples_from_the_weights_it_trains(served: Served, tmp_path: Path) -> None:
    """math_rl on the arithmetic env with importance sampling: three steps, and the recipe's own check that the
    sampler's logprobs of the sampled tokens are the trainer's (``optim/kl_sample_train_*``) near zero at every
    step: the engine serves exactly the adapter trained."""
    rows = _run_recipe(served, "tinker_cookbook.recipes.math_rl.train", tmp_path / "rl", "env=arithmetic",
                       "loss_fn=importance_sampling", "lora_rank=8", "group_size=4", "groups_per_batch=4",
                       "max_steps=3", "eval_every=0", "save_every=0", "learning_rate=1e-4")
    steps = [r for r in rows if "optim/kl_sample_train_v1" in r]
    assert [r["step"] for r in steps] == [0, 1, 2], rows
    for r in steps:
        assert -0.1 <= r["env/all/reward/total"] <= 1.0, r  # 1 if correct, minus 0.1 without the stop token
        # Float32 on both sides; the engine's and the trainer's kernels differ only in summation order.
        assert abs(r["optim/kl_sample_train_v1"]) < 1e-4, r
        assert abs(r["optim/kl_sample_train_v2"]) < 1e-4, r
