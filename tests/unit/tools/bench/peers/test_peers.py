"""``bench peers``' pure parts: the settings mapping (the peer's learning-rate schedule is agentrl's, step for
step), the figures and the table, the peer's requirement check, and the environment adapter TRL drives (its
tools run the environment's own ``call_tool``). TRL itself runs only in the real-part test."""

from __future__ import annotations

import asyncio
import inspect
import subprocess
from pathlib import Path

import pytest

from agentrl.config.run import load_config
from agentrl.environment.base import ToolError
from agentrl.envs.calc import CalcEnv
from agentrl.tools.bench.peers import install, report, settings
from agentrl.tools.bench.peers.run import prompts_of
from agentrl.tools.bench.peers.trl_side import _environment_class


def _cfg(**kw: object):
    over = settings.agentrl_overrides(model="models/tiny", steps=kw.pop("steps", 20), tasks_per_step=16, group_size=8,
                                      seed=3, output_dir="runs", name="x")
    return load_config(None, {**over, **kw}).resolved()


def test_the_mapping_carries_the_runs_batch_shape_rates_clipping_and_limits() -> None:
    cfg = _cfg()
    m = settings.trl_config(cfg, CalcEnv, out_dir="o", generation="generate")
    assert (m["num_generations"], m["per_device_train_batch_size"], m["gradient_accumulation_steps"]) == (8, 8, 16)
    assert m["learning_rate"] == cfg.trainer.lr == 4e-4  # the calc preset's full-weight rate
    assert (m["epsilon"], m["epsilon_high"], m["beta"]) == (0.2, 0.28, 0.0)
    assert m["loss_type"] == "dapo" and m["scale_rewards"] == "group"
    assert m["max_tool_calling_iterations"] == CalcEnv.max_turns - 1
    assert m["max_completion_length"] == CalcEnv.max_turns * CalcEnv.max_tokens_per_turn
    assert (m["bf16"], m["fp16"], m["seed"], m["max_steps"], m["shuffle_dataset"]) == (False, False, 3, 20, False)
    assert not m["use_vllm"] and settings.trl_config(cfg, CalcEnv, out_dir="o", generation="vllm")["use_vllm"]


def test_the_peers_learning_rate_schedule_is_agentrls_step_for_step() -> None:
    import torch
    from transformers import get_scheduler

    from agentrl.trainer.schedule import lr_at

    cfg = _cfg(steps=12)
    m = settings.trl_config(cfg, CalcEnv, out_dir="o", generation="generate")
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=m["learning_rate"])
    sched = get_scheduler(m["lr_scheduler_type"], opt, num_warmup_steps=0, num_training_steps=m["max_steps"],
                          scheduler_specific_kwargs=m["lr_scheduler_kwargs"])
    theirs = []
    for _ in range(cfg.steps):
        theirs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert theirs == pytest.approx([lr_at(k, cfg.trainer) for k in range(cfg.steps)], rel=1e-9)
    assert theirs[-1] < theirs[0] * 0.2  # it decays (a mapping to "constant" would fail here)


def test_a_schedule_the_peer_cannot_follow_is_refused() -> None:
    with pytest.raises(ValueError, match="warm-up"):
        settings.trl_config(_cfg(trainer={"lora": False, "lr_warmup_steps": 2, "lr_decay_steps": 20}), CalcEnv,
                            out_dir="o", generation="generate")
    with pytest.raises(ValueError, match="plain LoRA adapter"):  # the embedding trains whole beside it
        settings.trl_config(_cfg(trainer={"lora": True, "lora_train_embedding": True, "lr_decay_steps": 20}),
                            CalcEnv, out_dir="o", generation="generate")
    with pytest.raises(ValueError, match="lr_decay_steps"):
        settings.trl_config(_cfg(trainer={"lora": False, "lr_decay_steps": 7}), CalcEnv, out_dir="o",
                            generation="generate")


def test_lora_maps_to_the_same_peft_adapter_served_merged() -> None:
    over = settings.agentrl_overrides(model="models/tiny", steps=20, tasks_per_step=16, group_size=8, seed=3,
                                      output_dir="runs", name="x", weights="lora")
    cfg = load_config(None, over).resolved()
    t = cfg.trainer
    assert t.lora and not t.lora_trains_whole and cfg.transport.transport == "merged"
    assert settings.trl_peft(cfg) == {"r": t.lora_rank, "lora_alpha": t.lora_alpha, "lora_dropout": 0.0,
                                      "target_modules": list(t.lora_target_modules), "bias": "none",
                                      "use_rslora": False, "task_type": "CAUSAL_LM"}
    assert settings.trl_config(cfg, CalcEnv, out_dir="o", generation="generate")["learning_rate"] == t.lr
    assert settings.trl_peft(_cfg()) is None  # full weights: no adapter
    assert "LoRA: the same adapter" in " ".join(settings.trl_differences(cfg, CalcEnv, "generate"))
    with pytest.raises(ValueError, match="weights"):
        settings.agentrl_overrides(model="m", steps=1, tasks_per_step=1, group_size=2, seed=0, output_dir="r",
                                   name="x", weights="qlora")


def test_an_adapter_is_merged_into_a_plain_model_the_evaluator_loads(tmp_path: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from agentrl.tools.bench.peers.run import merge_adapter

    torch.manual_seed(0)
    base = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True))
    base.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / "tokenizer_config.json").write_text("{}")
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 9, 3]])
    want = peft_model(input_ids=ids).logits
    out = merge_adapter(tmp_path / "base", tmp_path / "adapter", tmp_path / "merged")
    assert not (out / "adapter_config.json").exists() and (out / "tokenizer_config.json").is_file()
    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)(input_ids=ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    plain = LlamaForCausalLM.from_pretrained(str(tmp_path / "base"))(input_ids=ids).logits
    assert not torch.allclose(got, plain, atol=1e-3)  # the adapter changed the model


def test_the_differences_name_what_the_mapping_cannot_remove() -> None:
    text = " ".join(settings.trl_differences(_cfg(), CalcEnv, "generate"))
    for phrase in ("malformed tool call", "all score the same", "transformers generate", "64 tokens"):
        assert phrase in text


def test_async_mode_runs_at_the_pipelines_default_bound_and_says_so() -> None:
    from agentrl.config.run import ASYNC_MAX_STALENESS

    over = settings.agentrl_overrides(model="models/tiny", steps=20, tasks_per_step=16, group_size=8, seed=3,
                                      output_dir="runs", name="x", mode="async")
    cfg = load_config(None, over).resolved()
    assert cfg.mode == "async" and cfg.pipeline.max_staleness == ASYNC_MAX_STALENESS
    text = " ".join(settings.trl_differences(cfg, CalcEnv, "generate"))
    assert f"at most {ASYNC_MAX_STALENESS} versions behind" in text and "on-policy" in text
    assert "Overlap" not in " ".join(settings.trl_differences(_cfg(), CalcEnv, "generate"))  # sync: nothing to say


def _side(loop_s: float, episodes: int, before: float, after: float) -> dict:
    steps = [{"s": loop_s / 2, "gen_s": loop_s / 4, "model_tokens": 100, "batch_tokens": 400,
              "episodes": episodes // 2}] * 2
    return {"steps": steps, "loop_s": loop_s, "success_before": before, "success_after": after}


def test_the_summary_charges_each_framework_its_loop_time_per_1000_episodes() -> None:
    one = {"seed": 0, "order": ["agentrl", "trl"], "eval_n": 200,
           "agentrl": _side(40.0, 1000, 0.3, 0.5), "trl": _side(80.0, 1000, 0.3, 0.4)}
    s = report.summarize([one])
    assert s["time_ratio"] == pytest.approx(0.5)
    assert s["agentrl"]["gen_tokens_per_s"] == pytest.approx(200 / 20.0)  # 200 tokens over 20 s of generation
    assert s["agentrl"]["trainer_tokens_per_s"] == pytest.approx(800 / 20.0)
    assert s["agentrl"]["gain"] == pytest.approx(0.2)
    # one seed: the binomial error of the two evaluations
    assert s["agentrl"]["gain_se"] == pytest.approx((0.3 * 0.7 / 200 + 0.5 * 0.5 / 200) ** 0.5)
    two = {**one, "seed": 1, "agentrl": _side(60.0, 1000, 0.3, 0.3), "trl": _side(80.0, 1000, 0.3, 0.5)}
    s = report.summarize([one, two])
    assert s["time_ratio"] == pytest.approx(100.0 / 160.0)  # totals over the seeds, not a mean of ratios
    assert s["agentrl"]["gain"] == pytest.approx(0.1) and s["agentrl"]["gain_se"] == pytest.approx(0.1)
    assert "| **TRL (transformers generate), mean** |" in report.table(s, "transformers generate")
    assert "| **agentrl (async, vLLM server), mean** |" in report.table(s, "transformers generate", "async")


def _fake_dist(root: Path, requires: list[str]) -> Path:
    target = root / "trl-9.9.9"
    (target / "trl").mkdir(parents=True)
    (target / "trl" / "__init__.py").write_text("")
    info = target / "trl-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trl\nVersion: 9.9.9\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    return target


def test_requirements_the_environment_lacks_are_named_and_extras_ignored(tmp_path: Path) -> None:
    target = _fake_dist(tmp_path, ["packaging>=1", "no-such-package-agentrl>=1", "packaging>=999",
                                   'deepspeed>=0.1; extra == "deepspeed"'])
    missing = install.unmet_requirements(target, "9.9.9")
    assert missing[0] == "no-such-package-agentrl>=1" and missing[1].startswith("packaging>=999 (found ")
    assert len(missing) == 2
    with pytest.raises(install.PeerUnavailable, match="no-such-package-agentrl"):
        install.ensure_trl("9.9.9", root=tmp_path)  # installed already: only checked


def test_a_peer_that_cannot_be_installed_stops_with_one_sentence(tmp_path: Path, monkeypatch) -> None:
    def failing(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for trl==0.0.1\n")

    monkeypatch.setattr(install.subprocess, "run", failing)
    with pytest.raises(install.PeerUnavailable, match=r"TRL 0\.0\.1 could not be installed .*No matching"):
        install.ensure_trl("0.0.1", root=tmp_path)


def test_a_framework_run_that_fails_ends_the_command_with_its_log_tail(monkeypatch, capsys) -> None:
    """A peer that crashes mid-run (TRL's colocated vLLM on a model it cannot reload) is one sentence with its
    log's tail and path, exit 1, no traceback."""
    from agentrl.tools.bench.errors import BenchFailed
    from agentrl.tools.bench.peers import main as peers_main

    def crashed(args):
        raise BenchFailed("python -m agentrl.tools.bench.peers.trl_side ... exited with 1: AttributeError: x (log: l)")

    monkeypatch.setattr(peers_main, "measure", crashed)
    assert peers_main.main(["--steps", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("agentrl bench peers: ") and "AttributeError" in err and "Traceback" not in err


def test_the_adapter_runs_the_environments_own_tools_and_reward() -> None:
    Adapter = _environment_class(CalcEnv)
    env = Adapter()
    task = CalcEnv.tasks("train")[0]
    import json

    env.reset(task=json.dumps(task), prompt=[])
    assert inspect.signature(env.calculate) == inspect.signature(CalcEnv.calculate).replace(
        parameters=list(inspect.signature(CalcEnv.calculate).parameters.values())[1:])
    assert env.calculate(expression=task["expression"]) == str(task["answer"])
    with pytest.raises(ToolError):
        env.calculate(expression="2 +* 3")
    good = [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "calculate", "arguments": {"expression": task["expression"]}}}]},
        {"role": "tool", "content": str(task["answer"])},
        {"role": "assistant", "content": f"The answer is {task['answer']}."}]
    assert env._reward(good) == 1.0
    assert env._reward([*good[:-1], {"role": "assistant", "content": "The answer is 1."}]) == 0.0


def test_the_peers_prompts_are_the_episodes_opening_messages() -> None:
    task = CalcEnv.tasks("train")[1]
    (prompt,) = prompts_of(CalcEnv, [task])
    assert prompt == [{"role": "system", "content": CalcEnv.system_prompt},
                      {"role": "user", "content": asyncio.run(CalcEnv().reset(task))}]
