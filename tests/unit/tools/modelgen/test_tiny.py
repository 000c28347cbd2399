"""The embedded tiny model: a short build is deterministic, idempotent and loads with transformers."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from agentrl.tools.modelgen import DEFAULT_TINY_DIR, build_tiny_model, read_marker
from agentrl.tools.modelgen.tokenizer import TOOL_TOKENS

STEPS = 3


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", seed=0, warmup_steps=STEPS, progress=False
    )


def test_default_dir_is_relative() -> None:
    assert DEFAULT_TINY_DIR == Path("models/tiny") and not DEFAULT_TINY_DIR.is_absolute()


def test_directory_layout_and_config(built: Path) -> None:
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
        "agentrl_model.json",
    ):
        assert (built / name).exists(), name
    config = json.loads((built / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert config["head_dim"] == 64
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] == 2048
    marker = read_marker(built)
    assert marker is not None and marker["config"]["seed"] == 0
    assert marker["config"]["warmup"]["steps"] == STEPS


def test_loads_with_auto_classes_and_generates(built: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built)
    assert model.config.vocab_size == len(tokenizer)
    assert model.dtype == torch.float32
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token_id == eos and model.generation_config.eos_token_id == eos
    assert tokenizer.pad_token == "<|endoftext|>"
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Ann has 2 apples."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_tokenizer_round_trips_tool_tokens(built: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer: Any = AutoTokenizer.from_pretrained(built)
    assert 512 <= len(tokenizer) <= 1100
    text = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "23 + 3 * 12"}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=False) == text
    for tok in TOOL_TOKENS:
        assert len(tokenizer.encode(tok, add_special_tokens=False)) == 1
    assert tokenizer.decode(ids, skip_special_tokens=True).startswith("<tool_call>")


def test_rebuild_is_a_no_op(built: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in built.iterdir()}
    start = time.monotonic()
    assert build_tiny_model(built, seed=0, warmup_steps=STEPS, progress=False) == built
    assert time.monotonic() - start < 1.0
    assert {p.name: p.stat().st_mtime_ns for p in built.iterdir()} == before


def test_build_is_deterministic(built: Path, tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0, warmup_steps=STEPS, progress=False)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (built / name).read_bytes(), name
    assert read_marker(again)["digest"] == read_marker(built)["digest"]  # type: ignore[index]


def test_other_config_rebuilds_in_place(built: Path, tmp_path: Path) -> None:
    target = build_tiny_model(tmp_path / "m", seed=1, warmup_steps=1, progress=False)
    first = (target / "model.safetensors").read_bytes()
    assert first != (built / "model.safetensors").read_bytes()
    build_tiny_model(target, seed=1, warmup_steps=2, progress=False)
    assert read_marker(target)["config"]["warmup"]["steps"] == 2  # type: ignore[index]
    assert (target / "model.safetensors").read_bytes() != first


def test_parse_tool_calls() -> None:
    from agentrl.tools.modelgen.probe import parse_tool_calls

    content, calls = parse_tool_calls(
        '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    )
    assert content == "" and calls is not None
    assert calls[0]["function"] == {"name": "calculate", "arguments": {"expression": "1 + 2"}}
    assert parse_tool_calls("The answer is 3.") == ("The answer is 3.", [])
    assert parse_tool_calls("<tool_call>\n{not json}\n</tool_call>")[1] is None
    assert parse_tool_calls("<tool_call>\n{")[1] is None


def test_probe_runs_full_episodes(built: Path) -> None:
    from agentrl.tools.modelgen.probe import probe_success

    for temperature in (1.0, 0.0):
        assert 0.0 <= probe_success(built, n=2, temperature=temperature) <= 1.0


def test_warmup_probe_schedule_and_stop(built: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.tools.modelgen.sft import WarmupConfig
    from agentrl.tools.modelgen.tiny import _Probe

    tokenizer = AutoTokenizer.from_pretrained(built)
    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32)
    cfg = WarmupConfig(probe_from=2, probe_every=2, probe_tasks=2, target_success=0.0)
    probe = _Probe(model, tokenizer, cfg, seed=0, progress=False)
    before = torch.random.get_rng_state()
    assert probe(1, 1.0) is False and probe.history == {}  # before probe_from
    assert probe(2, 1.0) is True and list(probe.history) == [2]  # on schedule: success >= 0.0
    assert probe(3, 1.0) is False and list(probe.history) == [2]  # off schedule
    assert torch.equal(torch.random.get_rng_state(), before), "probing must not move the warm-up's RNG"
    assert model.training and tokenizer.padding_side == AutoTokenizer.from_pretrained(built).padding_side
    never = _Probe(model, tokenizer, WarmupConfig(probe_from=1, probe_every=1, probe_tasks=2, target_success=1.01),
                   seed=0, progress=False)
    assert never(1, 1.0) is False and 0.0 <= never.history[1] <= 1.0
    off = _Probe(model, tokenizer, WarmupConfig(probe_every=0), seed=0, progress=False)
    assert off(600, 1.0) is False and off.history == {}


def test_probe_tasks_are_unseen_train_tasks() -> None:
    from agentrl.envs.calc import CalcEnv
    from agentrl.tools.modelgen.data import probe_tasks, train_tasks

    probes = probe_tasks(50, seed=0, exclude=500)
    seen = {t["question"] for t in train_tasks(500, 0)}
    test = {t["question"] for t in CalcEnv.tasks("test")}
    assert len(probes) == 50 and not ({t["question"] for t in probes} & (seen | test))


def test_warmup_stops_when_on_step_says_so(built: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.tools.modelgen.sft import WarmupConfig, warmup

    model = AutoModelForCausalLM.from_pretrained(built, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(built)
    calls: list[int] = []
    losses = warmup(model, tokenizer, WarmupConfig(steps=5, num_examples=16, probe_every=0), progress=False,
                    on_step=lambda step, loss: calls.append(step) or step == 2)
    assert len(losses) == 2 and calls == [1, 2]
