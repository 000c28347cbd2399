"""A saved policy describes itself (base model, template, parser, window, sampling) from its own record, its
run's directory or its adapter config; a base it does not fit is refused in one sentence naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentrl.config.run import RunConfig, load_config
from agentrl.launch.described import POLICY_FILE, NotAPolicy, read_policy, write_description
from agentrl.launch.fit import BaseMismatch, check_fits, fingerprint, shape_problem
from agentrl.tools.bench.models import lora_shapes, random_lora, save_lora

SHAPE = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
         "head_dim": 16, "intermediate_size": 64, "vocab_size": 50}


def _base(d: Path, hidden: int = 32, seed: int = 0) -> Path:
    """A model directory with a config and the weights of one attention block (safetensors)."""
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({**SHAPE, "hidden_size": hidden, "model_type": "qwen2"}))
    gen = torch.Generator().manual_seed(seed)
    heads = SHAPE["num_attention_heads"] * SHAPE["head_dim"]
    w = {f"model.layers.0.self_attn.{m}.weight": torch.randn(*s, generator=gen)
         for m, s in {"q_proj": (heads, hidden), "k_proj": (heads, hidden), "v_proj": (heads, hidden),
                      "o_proj": (hidden, heads)}.items()}
    save_file(w, str(d / "model.safetensors"))
    return d


def _adapter(d: Path, hidden: int = 32, base: str | None = None) -> Path:
    save_lora(d, random_lora(lora_shapes({**SHAPE, "hidden_size": hidden}, rank=4), seed=0), rank=4, alpha=8)
    if base is not None:
        cfg = json.loads((d / "adapter_config.json").read_text())
        (d / "adapter_config.json").write_text(json.dumps({**cfg, "base_model_name_or_path": base}))
    return d


def _run_cfg(tmp_path: Path, model: Path) -> RunConfig:
    return load_config(None, {"model": str(model), "output_dir": str(tmp_path / "runs"), "name": "r",
                              "chat_template": "hermes", "tool_parser": "hermes",
                              "sampling": {"temperature": 0.7, "max_context_tokens": 512},
                              "inference": {"max_model_len": 512}, "eval_temperature": 0.5})


def test_an_adapter_fits_the_base_of_its_shape_and_is_refused_on_another(tmp_path: Path) -> None:
    small, wide = _base(tmp_path / "small"), _base(tmp_path / "wide", hidden=48)
    adapter = _adapter(tmp_path / "a")
    assert shape_problem(adapter, small) is None
    assert "input size [48] in the model, [32] in the adapter" in (shape_problem(adapter, wide) or "")
    with pytest.raises(BaseMismatch) as e:
        check_fits(adapter, str(wide), trained_on=str(small), digest=None)
    text = str(e.value)
    assert str(adapter) in text and str(wide) in text and str(small) in text and text.count(". ") == 0


def test_the_recorded_fingerprint_refuses_a_model_of_the_same_shape(tmp_path: Path) -> None:
    base, tuned = _base(tmp_path / "base"), _base(tmp_path / "tuned", seed=1)
    assert fingerprint(base) != fingerprint(tuned) and fingerprint(base) == fingerprint(base)
    assert fingerprint(tmp_path / "nowhere") is None
    adapter = _adapter(tmp_path / "a")
    check_fits(adapter, str(base), trained_on=str(base), digest=fingerprint(base))
    with pytest.raises(BaseMismatch, match="another model than the one it was trained on"):
        check_fits(adapter, str(tuned), trained_on=str(base), digest=fingerprint(base))


def test_a_policy_with_its_record_describes_what_it_was_trained_with(tmp_path: Path) -> None:
    base = _base(tmp_path / "base")
    cfg = _run_cfg(tmp_path, base)
    adapter = _adapter(tmp_path / "elsewhere" / "final_adapter")  # copied out of its run: the record suffices
    (adapter / "chat_template.jinja").write_text("{{ messages }}")
    write_description(adapter, cfg, first_eval={"success": 0.5, "step": 0}, last_eval={"success": 0.7, "step": 3},
                      steps=3, wall_s=1.0, run_id="abc")
    policy = read_policy(adapter)
    assert (policy.kind, policy.base, policy.base_digest) == ("adapter", str(base), fingerprint(base))
    settings = policy.settings()
    assert settings["model"] == str(base) and settings["tool_parser"] == "hermes"
    assert settings["chat_template"] == str(adapter / "chat_template.jinja")  # the file it carries
    assert settings["sampling.temperature"] == 0.7 and settings["inference.max_model_len"] == 512
    assert (settings["trainer.lora_rank"], settings["trainer.lora_alpha"]) == (4, 8.0)
    assert policy.overrides()["sampling"]["max_context_tokens"] == 512
    assert policy.figures["last_eval"]["success"] == 0.7 and policy.source.endswith(POLICY_FILE)
    policy.check_base(str(base))
    with pytest.raises(BaseMismatch):
        policy.check_base(str(_base(tmp_path / "other", seed=2)))


def test_flags_and_the_file_go_over_what_the_policy_describes(tmp_path: Path) -> None:
    base = _base(tmp_path / "base")
    adapter = _adapter(tmp_path / "a")
    write_description(adapter, _run_cfg(tmp_path, base))
    beneath = read_policy(adapter).overrides()
    cfg = load_config(None, {"tool_parser": "llama3_json"}, beneath=beneath)
    assert (cfg.model, cfg.tool_parser, cfg.sampling.temperature) == (str(base), "llama3_json", 0.7)
    (tmp_path / "run.toml").write_text("[sampling]\ntemperature = 0.9\n")
    assert load_config(tmp_path / "run.toml", {}, beneath=beneath).sampling.temperature == 0.9


def test_a_run_directory_and_an_adapter_saved_before_the_record_describe_it_from_the_run(tmp_path: Path) -> None:
    base = _base(tmp_path / "base")
    cfg = _run_cfg(tmp_path, base)
    run = tmp_path / "runs" / "r"
    _adapter(run / "final_adapter", base="somewhere/else")
    (run / "run.json").write_text(json.dumps({"run_id": "x1"}))
    (run / "config.json").write_text(cfg.model_dump_json())
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in (
        {"kind": "eval", "step": 0, "success": 0.6, "run_id": "x1"}, {"kind": "train", "step": 1},
        {"kind": "eval", "step": 2, "success": 0.7, "run_id": "x1"}, {"kind": "eval", "step": 9, "run_id": "old"})))
    for path in (run, run / "final_adapter"):
        policy = read_policy(path)
        assert policy.path == run / "final_adapter" and policy.base == str(base)
        assert policy.settings()["chat_template"] == "hermes" and policy.figures["last_eval"]["success"] == 0.7
        assert policy.figures["steps"] == 2


def test_an_adapter_alone_names_its_base_and_a_whole_model_is_its_own(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path / "a", base="models/some-base")
    policy = read_policy(adapter)
    assert policy.base == "models/some-base" and policy.settings() == {
        "model": "models/some-base", "trainer.lora_rank": 4, "trainer.lora_alpha": 8.0}
    model = _base(tmp_path / "runs" / "full" / "final_model")
    (tmp_path / "runs" / "full" / "run.json").write_text("{}")
    (tmp_path / "runs" / "full" / "config.json").write_text(_run_cfg(tmp_path, model).model_dump_json())
    whole = read_policy(tmp_path / "runs" / "full")
    assert whole.kind == "model" and whole.settings()["model"] == str(model)
    whole.check_base("anything")  # a whole model has no base to fit


def test_a_path_that_holds_no_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotAPolicy, match="not a directory"):
        read_policy(tmp_path / "missing")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    (tmp_path / "run" / "config.json").write_text("{}")
    with pytest.raises(NotAPolicy, match="final_adapter or final_model"):
        read_policy(tmp_path / "run")

