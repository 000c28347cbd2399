"""Sample episodes as rows, their files, `agentrl show`, and the model card."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.config.run import load_config
from agentrl.core.types import Message, StopReason, ToolCall, Trajectory
from agentrl.tracking.card import model_card
from agentrl.tracking.samples import (
    TABLE_COLUMNS,
    episode_row,
    read_samples,
    sample_rows,
    sample_steps,
    table_rows,
    version_spans,
    write_samples,
)
from agentrl.tracking.show import NoSamples, render


def _episode(task: str, reward: float, versions: tuple[int, int] = (3, 4)) -> Trajectory:
    """Two assistant turns (the second resumed under a newer version), a tool result between them."""
    v1, v2 = versions
    return Trajectory(
        task_id=task, env="calc", group_id=f"g-{task}", prompt_ids=[1, 2, 3],
        completion_ids=[10, 11, 12, 20, 21, 30, 31, 32], loss_mask=[1, 1, 1, 0, 0, 1, 1, 1],
        logprobs=[-0.1] * 8, versions=[v1, v1, v1, -1, -1, v1, v2, v2],
        messages=[Message(role="user", content="What is 2+3?"),
                  Message(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="calculate",
                                                                              arguments={"expression": "2+3"})]),
                  Message(role="tool", content="5", tool_call_id="c1", name="calculate"),
                  Message(role="assistant", content="The answer is 5.")],
        reward=reward, stop_reason=StopReason.COMPLETED, num_turns=2, num_tool_calls=1)


def test_episode_row_carries_versions_per_turn() -> None:
    row = episode_row(_episode("t1", 1.0), step=5, group_reward_mean=0.5)
    assert row["versions"] == [3, 4] and row["version_spans"] == [[3, 4], [4, 2]]
    assistant = [m for m in row["messages"] if m["role"] == "assistant"]
    assert [m["versions"] for m in assistant] == [[3], [3, 4]]
    assert assistant[0]["tool_calls"] == [{"name": "calculate", "arguments": {"expression": "2+3"}}]
    assert row["messages"][2] == {"role": "tool", "content": "5", "name": "calculate"}
    assert (row["reward"], row["stop_reason"], row["model_tokens"], row["total_tokens"]) == (1.0, "completed", 6, 11)
    json.dumps(row)
    assert version_spans([1, 1, -1, 2], [1, 1, 0, 1]) == [[1, 2], [2, 1]]


def test_sample_is_one_per_group_and_seeded(tmp_path: Path) -> None:
    batch = [[_episode(f"t{g}", float(i % 2)) for i in range(4)] for g in range(6)]
    rows = sample_rows(batch, step=10, k=3, seed=0)
    assert len({r["task_id"] for r in rows}) == 3 and all(r["group_reward_mean"] == 0.5 for r in rows)
    assert rows == sample_rows(batch, step=10, k=3, seed=0)
    assert len(sample_rows(batch, step=10, k=50, seed=0)) == 6
    settings = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.0}
    assert all(r["sampling"] == settings for r in sample_rows(batch, step=10, k=3, seed=0, sampling=settings))
    write_samples(tmp_path, 10, rows)
    write_samples(tmp_path, 2, rows[:1])
    assert sample_steps(tmp_path) == [2, 10] and read_samples(tmp_path, 10) == rows
    table = table_rows(rows)
    assert len(table[0]) == len(TABLE_COLUMNS)
    assert "assistant [v3]: -> calculate" in table[0][-1] and "tool: 5" in table[0][-1]


def test_show_prints_episodes(tmp_path: Path) -> None:
    write_samples(tmp_path, 4, sample_rows([[_episode("t9", 1.0)]], step=4, k=2, seed=1))
    (tmp_path / "summary.json").write_text(json.dumps({"steps": 4, "success_before": 0.3, "success_after": 0.5}))
    result = CliRunner().invoke(app, ["show", str(tmp_path), "-n", "1"], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    out = result.output
    assert "step 4" in out and "0.300 -> 0.500" in out and "task t9" in out and "reward 1" in out
    assert 'calculate({"expression": "2+3"})' in out and "assistant v3,4:" in out and "tool: 5" in out
    with pytest.raises(NoSamples, match="no sample of step 7; samples exist for steps 4"):
        render(tmp_path, 7)
    bad = CliRunner().invoke(app, ["show", str(tmp_path / "nothing")])
    assert bad.exit_code == 2 and "has no sample episodes" in bad.output


@pytest.mark.parametrize("lora", [True, False])
def test_model_card(tmp_path: Path, lora: bool) -> None:
    cfg = load_config(None, {"env": "calc", "name": "calc-3", "output_dir": str(tmp_path),
                             "trainer": None if lora else {"lora": False}})
    first = {"step": 0, "success": 0.37, "num_episodes": 200}
    last = {"step": 80, "success": 0.62, "num_episodes": 200}
    card = model_card(cfg, first_eval=first, last_eval=last, steps=80, wall_s=900.0, run_id="abc")
    assert card.startswith("---\n") and f"library_name: {'peft' if lora else 'transformers'}" in card
    assert "base_model:" not in card, "a local model directory is no hub id"
    assert "| before training (step 0) | 0.370 ± 0.034 (n = 200) |" in card
    assert "| after training (step 80) | 0.620 ± 0.034 (n = 200) |" in card
    assert "```toml" in card and 'env = "calc"' in card and "15.0 min" in card
    if lora:
        assert "PeftModel.from_pretrained(base, \"final_adapter\")" in card and "--enable-lora" in card
    else:
        assert 'AutoModelForCausalLM.from_pretrained("final_model")' in card and "vllm serve final_model" in card
    merged = model_card(cfg, first_eval=first, last_eval=last, steps=80, wall_s=900.0, run_id="abc", form="merged",
                        path="calc-export", dtype="bfloat16")
    assert "library_name: transformers" in merged and "vllm serve calc-export --enable-auto-tool-choice" in merged
    assert "| after training (step 80) | 0.620 ± 0.034 (n = 200) |" in merged
    assert ("merged into them (bfloat16)" in merged) == lora and "agentrl eval --env calc --model calc-export" in merged
    hub = load_config(None, {"env": "calc", "model": "Qwen/Qwen2.5-0.5B-Instruct"})
    assert "base_model: Qwen/Qwen2.5-0.5B-Instruct" in model_card(hub, first_eval=None, last_eval=None, steps=0,
                                                                  wall_s=None, run_id="x")
