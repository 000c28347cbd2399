"""``agentrl export``: a run's adapter merged into its base as a plain model directory (weights equal to peft's
merge, the run's chat template, its stop tokens, a card with its figures), or the adapter alone; an occupied
``--out`` is refused and a failure leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentrl.config.run import load_config
from agentrl.launch import export as export_mod
from agentrl.launch.described import POLICY_FILE, write_description
from agentrl.launch.export import ExportOutOccupied, export
from agentrl.rollout.templates import BUILTIN_DIR

IDS = torch.tensor([[1, 5, 9, 3, 7]])


@pytest.fixture(scope="module")
def run_dir(tiny_tokenizer_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor]:
    """A finished LoRA run of the random tiny model (hermes template) and peft's logits of its adapter on IDS."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("export")
    cfg = load_config(None, {"model": str(tiny_tokenizer_model), "output_dir": str(root), "name": "r",
                             "chat_template": "hermes", "sampling": {"temperature": 0.8}})
    run = root / "r"
    run.mkdir()
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(str(tiny_tokenizer_model), dtype=torch.float32),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
        want = model(input_ids=IDS).logits
    model.save_pretrained(run / "final_adapter")
    (run / "final_adapter" / "chat_template.jinja").write_text((BUILTIN_DIR / "hermes.jinja").read_text())
    write_description(run / "final_adapter", cfg, first_eval={"step": 0, "success": 0.25, "num_episodes": 200},
                      last_eval={"step": 6, "success": 0.7, "num_episodes": 200}, steps=6, wall_s=60.0, run_id="abc")
    return run, want


def test_a_run_exports_as_a_merged_model_with_its_template_stops_and_card(
        run_dir: tuple[Path, torch.Tensor], tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run, want = run_dir
    out = tmp_path / "exported"
    result = export(run, out)
    assert result["merged"] and result["chat_template"] == "hermes" and result["from"] == str(run / "final_adapter")
    assert not (out / "adapter_config.json").exists() and (out / "model.safetensors").is_file()
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)(input_ids=IDS).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (out / "chat_template.jinja").read_text() == (BUILTIN_DIR / "hermes.jinja").read_text()
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    generation = json.loads((out / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation["eos_token_id"] == result["stop_token_ids"]
    assert generation["temperature"] == 0.8 and generation["do_sample"] is True
    card = (out / "README.md").read_text()
    assert "| after training (step 6) | 0.700" in card and "| before training (step 0) | 0.250" in card
    assert "vllm serve exported --enable-auto-tool-choice --tool-call-parser hermes" in card
    assert json.loads((out / POLICY_FILE).read_text())["exported"]["merged"] is True
    assert [p.name for p in tmp_path.iterdir()] == ["exported"]


def test_an_occupied_out_is_refused_and_a_failure_leaves_nothing(
        run_dir: tuple[Path, torch.Tensor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run, _ = run_dir
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    with pytest.raises(ExportOutOccupied, match="not empty"):
        export(run, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["keep.txt"]

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("merge failed")

    monkeypatch.setattr(export_mod, "merge_into", broken)
    with pytest.raises(RuntimeError, match="merge failed"):
        export(run, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_adapter_only_and_a_lower_dtype(run_dir: tuple[Path, torch.Tensor], tmp_path: Path,
                                        tiny_tokenizer_model: Path) -> None:
    from safetensors import safe_open

    run, _ = run_dir
    out = export(run / "final_adapter", tmp_path / "adapter", adapter_only=True)["out"]
    files = {p.name for p in Path(out).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "chat_template.jinja", "README.md", POLICY_FILE} <= files
    assert "model.safetensors" not in files
    assert json.loads((Path(out) / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_tokenizer_model)
    assert "library_name: peft" in (Path(out) / "README.md").read_text()
    half = Path(export(run, tmp_path / "bf16", dtype="bfloat16")["out"])
    with safe_open(str(half / "model.safetensors"), framework="pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16


def test_the_command_writes_one_json_line_and_names_an_occupied_out(
        run_dir: tuple[Path, torch.Tensor], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from agentrl import cli

    monkeypatch.setattr(cli, "_setup", lambda verbose: None)
    run, _ = run_dir
    r = CliRunner().invoke(cli.app, ["export", str(run), "--out", str(tmp_path / "m")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout.strip().splitlines()[-1])["out"] == str(tmp_path / "m")
    r = CliRunner().invoke(cli.app, ["export", str(run), "--out", str(tmp_path / "m")])
    assert r.exit_code == 2 and "already exists and is not empty" in r.output
    r = CliRunner().invoke(cli.app, ["export", str(run), "--out", str(tmp_path / "x"), "--dtype", "int8"])
    assert r.exit_code == 2 and "expected one of float32, bfloat16, float16" in r.output


def test_a_full_weight_run_exports_its_model_in_the_dtype_asked(tiny_tokenizer_model: Path, tmp_path: Path) -> None:
    import shutil

    from transformers import AutoModelForCausalLM

    run = tmp_path / "runs" / "full"
    shutil.copytree(tiny_tokenizer_model, run / "final_model")
    cfg = load_config(None, {"model": str(tiny_tokenizer_model), "output_dir": str(tmp_path / "runs"), "name": "full",
                             "trainer": {"lora": False}})
    (run / "run.json").write_text(json.dumps({"run_id": "f1"}))
    (run / "config.json").write_text(cfg.model_dump_json())
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "eval", "step": 4, "success": 0.5, "run_id": "f1"}))
    out = tmp_path / "exported"
    result = export(run, out, dtype="float16")
    assert not result["merged"] and result["from"] == str(run / "final_model")
    want = AutoModelForCausalLM.from_pretrained(str(tiny_tokenizer_model), dtype=torch.float16)(input_ids=IDS).logits
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float16)(input_ids=IDS).logits
    torch.testing.assert_close(got, want)
    card = (out / "README.md").read_text()
    assert "library_name: transformers" in card and "| after training (step 4) | 0.500" in card


def test_an_output_layer_lora_is_merged_into_an_untied_output_layer(tiny_tokenizer_model: Path,
                                                                    tmp_path: Path) -> None:
    """``trainer.lora_train_unembed`` on a tied model: the merge gives the exported model an output layer of its
    own (the logits peft computes), and leaves the input embedding the base model's."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_tokenizer_model), dtype=torch.float32)
    assert base.get_output_embeddings().weight is base.get_input_embeddings().weight
    embedding = base.get_input_embeddings().weight.detach().clone()
    torch.manual_seed(1)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
        want = model(input_ids=IDS).logits
    model.save_pretrained(str(tmp_path / "adapter"))
    merged = export_mod.merge_into(tiny_tokenizer_model, tmp_path / "adapter")
    assert torch.equal(merged.get_input_embeddings().weight, embedding)
    merged.save_pretrained(str(tmp_path / "out"))
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(again(input_ids=IDS).logits, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(again.get_input_embeddings().weight, embedding)
