"""``agentrl bench peers`` on real parts: a two-step run of each side (agentrl's ``train`` on a real vLLM engine,
TRL 1.16's ``GRPOTrainer`` installed into its own directory), every weight and then the same LoRA adapter,
then agentrl's evaluator on the base and both final models (adapters merged into the base first). The JSON is well-formed and follows from its own per-seed figures; both sides trained every step
on the same prompts, token for token (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.conftest import require

pytestmark = [pytest.mark.integration, pytest.mark.long]


def _run(model: Path, work: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> dict:
    """A two-step run of each side at ``flags``; its JSON line."""
    require(importlib.util.find_spec("vllm") is not None, "vLLM is not installed")
    from agentrl.tools.bench.peers.install import PeerUnavailable, ensure_trl
    from agentrl.tools.bench.peers.main import main
    from agentrl.tools.bench.peers.settings import TRL_VERSION

    try:
        ensure_trl(TRL_VERSION)
    except PeerUnavailable as e:
        require(False, f"TRL cannot be installed here: {e}")
    assert main(["--steps", "2", "--tasks-per-step", "2", "--group-size", "4", "--eval-n", "8", "--json",
                 "--model", str(model), "--work", str(work), *flags]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, "--json prints only the JSON line"
    return json.loads(out[-1])


def test_bench_peers_trains_the_same_lora_adapter_on_both_sides(tiny_model_dir: Path, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    r = _run(tiny_model_dir, tmp_path / "runs", capsys, "--weights", "lora")
    assert r["weights"] == "lora" and r["trl_peft"]["r"] == 16 and r["trl_peft"]["target_modules"]
    assert r["trl_settings"]["learning_rate"] == r["lr"]
    assert r["same_prompt_ids"] and any(d.startswith("LoRA:") for d in r["differences"])
    (seed,) = r["per_seed"]
    for side in ("agentrl", "trl"):
        assert seed[side]["episodes"] == 2 * 2 * 4 and 0 <= seed[side]["success_after"] <= 1, side
    # each side's final adapter, and the plain model merged from it that the evaluator scored
    runs = tmp_path / "runs"
    for adapter in (*runs.glob("*/final_adapter"), *runs.glob("*-work/trl/final_adapter")):
        assert (adapter / "adapter_config.json").is_file(), adapter
        assert (adapter.with_name("final_adapter-merged") / "config.json").is_file(), adapter
    assert len(list(runs.glob("**/final_adapter-merged/config.json"))) == 2
    assert len(list(runs.glob("*-work/seed.json"))) == 1


def test_bench_peers_runs_both_frameworks_on_the_same_work(tiny_model_dir: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from agentrl.tools.bench.peers.settings import TRL_VERSION

    r = _run(tiny_model_dir, tmp_path / "runs", capsys)
    assert r["weights"] == "full" and r["trl_peft"] is None
    assert r["peer"] == {"framework": "trl", "version": TRL_VERSION, "generation": "transformers generate"}
    assert r["same_prompt_ids"], "TRL rendered the prompts agentrl sends the engine, token for token"
    (seed,) = r["per_seed"]
    for side in ("agentrl", "trl"):
        f = seed[side]
        assert f["episodes"] == 2 * 2 * 4, side
        assert f["loop_s"] > 0 and f["gen_tokens_per_s"] > 0 and f["trainer_tokens_per_s"] > 0, side
        assert 0 < f["gen_frac"] < 1, side
        assert f["success_before"] == seed["agentrl"]["success_before"], "one evaluation of the base model"
        assert 0 <= f["success_after"] <= 1 and f["gain"] == pytest.approx(f["success_after"] - f["success_before"])
        assert r[f"{side}_gain"] == pytest.approx(f["gain"], abs=1e-4)
    assert r["time_ratio"] == pytest.approx(seed["agentrl"]["s_per_1000_episodes"] / seed["trl"]["s_per_1000_episodes"],
                                            rel=1e-3)
    assert r["trl_settings"]["num_generations"] == 4 and r["trl_settings"]["gradient_accumulation_steps"] == 2
    assert r["differences"] and "| **agentrl (sync, vLLM server), mean** |" in r["table"]
    assert r["agentrl_mode"] == "sync" and r["agentrl_max_staleness"] == 0  # the training default, and named
    # both final models are plain Hugging Face directories
    runs = tmp_path / "runs"
    assert len(list(runs.glob("*/final_model/config.json"))) == 1
    assert len(list(runs.glob("*-work/trl/final_model/config.json"))) == 1
