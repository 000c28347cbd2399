"""The run configs shipped in ``examples/`` load, and say what their comments promise."""

from __future__ import annotations

from pathlib import Path

from agentrl.config.run import load_config

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_the_smollm2_calc_config_sizes_a_real_model_run_for_two_cores() -> None:
    cfg = load_config(EXAMPLES / "smollm2_calc.toml", {"env": "calc"})
    # the warmed-up model, not the embedded one: the embedded-only preset values do not apply
    assert cfg.model == cfg.trainer_config().model_path == cfg.server_config().model == "models/smollm2-135m-calc"
    assert (cfg.steps, cfg.tasks_per_step, cfg.group_size, cfg.eval_every, cfg.time_limit_min) == (36, 4, 8, 0, 45.0)
    assert cfg.trainer.lora and cfg.trainer.lr == 2e-4 and cfg.trainer.lr_schedule == "cosine"
    assert set(cfg.trainer.lora_target_modules) >= {"q_proj", "o_proj", "gate_proj", "down_proj"}
    assert cfg.inference.dtype == "float32"
    # the window it was measured with, set in the file: not SmolLM2's own 8,192
    assert (cfg.inference.max_model_len, cfg.sampling.max_context_tokens, cfg.resolved().trainer.micro_batch_tokens) == (
        1024, 1024, 4096)
    # weight sync left at auto: the adapter served from the engine's LoRA slots, each sync an in-place copy
    assert cfg.transport.transport == "auto" and cfg.skip_uniform_groups
    assert cfg.resolved().transport.transport == "shm" and cfg.resolved().serves_adapter


def test_the_smollm2_lookup_config_takes_lookups_window() -> None:
    cfg = load_config(EXAMPLES / "smollm2_lookup.toml", {"env": "lookup"}).resolved()
    assert cfg.model == "models/smollm2-135m-lookup" and cfg.time_limit_min == 45.0 and cfg.eval_size == 200
    # the recipe its comments and docs/real-model.md describe: 8 questions x 4, 5e-4 after 3 warm-up steps
    assert (cfg.tasks_per_step, cfg.group_size) == (8, 4)
    assert (cfg.trainer.lr, cfg.trainer.lr_warmup_steps, cfg.trainer.lr_schedule) == (5e-4, 3, "cosine")
    # lookup's episodes (about 780 tokens after the warm-up, some past 1,024) fit the window and one micro-batch
    assert cfg.inference.max_model_len == cfg.sampling.max_context_tokens == 2048
    assert cfg.trainer.micro_batch_tokens >= 2048
    assert cfg.transport.transport == "merged"


def test_the_smollm2_swe_config_serves_the_adapter_from_the_slots() -> None:
    cfg = load_config(EXAMPLES / "smollm2_swe.toml", {"env": "swe"}).resolved()
    assert cfg.model == "models/smollm2-135m" and cfg.chat_template == "hermes" and cfg.steps == 2
    assert cfg.inference.max_model_len == cfg.sampling.max_context_tokens == 4096
    # nothing trained beside the adapter: it is synced in place into the engine's slot, which wraps its layers
    assert cfg.serves_adapter and cfg.transport.transport == "shm"
    assert cfg.inference.lora_target_modules == cfg.trainer.lora_target_modules
