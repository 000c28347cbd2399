"""agentrl sft: a short warm-up on transcripts writes a model directory that loads, carries its chat template and
records what it did; LoRA is merged; bad data and a non-empty output are refused with one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.tools.modelgen.finetune import (
    MARKER,
    SftConfig,
    SftDataError,
    conversations_from_env,
    conversations_from_jsonl,
    finetune,
)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from agentrl.tools.modelgen import TINY, install_pinned

    return install_pinned(tmp_path_factory.mktemp("tiny") / "tiny", TINY)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_warm_up_writes_a_loadable_model_with_its_template(tiny: Path, tmp_path: Path, lora: bool) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    convs = conversations_from_env("calc", 8, seed=0)
    out = tmp_path / "warm"
    record = finetune(tiny, out, convs, chat_template="hermes", progress=False, source={"env": "calc"},
                      config=SftConfig(steps=2, batch_size=4, lr=1e-3, lora=lora, examples=8, threads=1))
    assert record["chat_template"] == "hermes" and record["examples"] == 8 and len(record["loss_every_10"]) == 1
    assert json.loads((out / MARKER).read_text())["config"]["lora"] is lora
    from agentrl.rollout.templates import resolve

    assert (out / "chat_template.jinja").read_text() == resolve("hermes").text  # type: ignore[union-attr]
    weights = load_file(str(out / "model.safetensors"))
    assert not any("lora" in k for k in weights), "the adapter is merged into plain weights"
    before = load_file(str(tiny / "model.safetensors"))
    changed = [k for k in before if k in weights and not torch.equal(before[k], weights[k])]
    assert changed and (lora is False or all("embed" not in k and "norm" not in k for k in changed))
    AutoModelForCausalLM.from_pretrained(str(out))
    from agentrl.launch.doctor import diagnose

    assert diagnose(out, "hermes").chat_template == "own" and diagnose(out, "hermes").ok  # its own is hermes now


def test_jsonl_transcripts_are_read_and_bad_rows_named(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
    good.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert len(conversations_from_jsonl(good, 2)) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    with pytest.raises(SftDataError, match=r"bad.jsonl, line 2: .*assistant message"):
        conversations_from_jsonl(bad, 10)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SftDataError, match="holds no conversations"):
        conversations_from_jsonl(tmp_path / "empty.jsonl", 10)


def test_an_environment_without_demonstrations_says_to_pass_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain_env.py").write_text(
        "import agentrl\n"
        "class Plain(agentrl.Environment):\n"
        "    @classmethod\n"
        "    def tasks(cls, split='train'):\n"
        "        return [{'id': '1'}]\n"
        "    async def reset(self, task):\n"
        "        return 'hi'\n"
        "    async def reward(self, messages):\n"
        "        return 0.0\n")
    with pytest.raises(SftDataError, match=r"has no demonstrations .*--data FILE.jsonl"):
        conversations_from_env("plain_env:Plain", 4, seed=0)


def test_a_non_empty_output_is_refused(tiny: Path, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(SftDataError, match="is not empty"):
        finetune(tiny, tmp_path / "out", conversations_from_env("calc", 2, 0), chat_template=None,
                 config=SftConfig(steps=1), source={})
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]
