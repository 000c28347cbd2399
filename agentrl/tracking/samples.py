"""Sample episodes as rows people read: ``<run_dir>/samples/step_N.jsonl`` and the trackers' tables.

A row is one episode: its task, reward (and its group's mean, so the advantage is visible), stop reason,
error, turns and tokens, the policy versions that wrote it, and its messages: the prompt, each assistant
turn with the versions of its tokens and its tool calls, each tool result. The sample of a step takes one
episode from each of ``samples_per_step`` groups, drawn with the run's seed, so reruns pick the same ones.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.core.types import Trajectory

SAMPLES_DIR = "samples"
TABLE_COLUMNS = ["step", "task_id", "reward", "group_reward_mean", "stop_reason", "versions", "turns",
                 "tool_calls", "model_tokens", "conversation"]
"""The columns of the trackers' sample tables (one row per episode)."""
_STEP_FILE = re.compile(r"^step_(\d+)\.jsonl$")


def pick_episodes(batch: Sequence[Sequence[Trajectory]], k: int, rng: random.Random
                  ) -> list[tuple[Trajectory, Sequence[Trajectory]]]:
    """One episode from each of ``k`` groups of ``batch`` (all groups when there are fewer), in batch order,
    each with its group."""
    groups = [i for i, g in enumerate(batch) if g]
    chosen = sorted(rng.sample(groups, min(k, len(groups))))
    return [(batch[i][rng.randrange(len(batch[i]))], batch[i]) for i in chosen]


def version_spans(versions: Sequence[int], mask: Sequence[int]) -> list[list[int]]:
    """``[[version, tokens], ...]``: the runs of equal versions over the model's tokens (``mask`` 1)."""
    spans: list[list[int]] = []
    for v, m in zip(versions, mask, strict=False):
        if not m or v < 0:
            continue
        if spans and spans[-1][0] == v:
            spans[-1][1] += 1
        else:
            spans.append([v, 1])
    return spans


def _turn_versions(traj: Trajectory) -> list[list[int]]:
    """The distinct versions of each assistant turn's tokens (the contiguous runs of model tokens), in order."""
    turns: list[list[int]] = []
    inside = False
    for v, m in zip(traj.versions, traj.loss_mask, strict=False):
        if m and not inside:
            turns.append([])
        inside = bool(m)
        if m and v >= 0 and v not in turns[-1]:
            turns[-1].append(v)
    return turns


def episode_row(traj: Trajectory, *, step: int, kind: str = "train", group_reward_mean: float | None = None
                ) -> dict[str, Any]:
    """``traj`` as one JSON-able sample row (see the module docstring)."""
    turn_versions = _turn_versions(traj)
    assistant = [m for m in traj.messages if m.role == "assistant"]
    aligned = len(turn_versions) == len(assistant)  # a black-box row may hold turns it did not sample
    messages: list[dict[str, Any]] = []
    turn = 0
    for m in traj.messages:
        msg: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_calls:
            msg["tool_calls"] = [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]
        if m.role == "tool" and m.name:
            msg["name"] = m.name
        if m.role == "assistant":
            if aligned:
                msg["versions"] = turn_versions[turn]
            turn += 1
        messages.append(msg)
    spans = version_spans(traj.versions, traj.loss_mask)
    return {
        "step": step, "kind": kind, "task_id": traj.task_id, "group_id": traj.group_id, "env": traj.env,
        "reward": traj.reward, "group_reward_mean": group_reward_mean, "metrics": dict(traj.metrics),
        "stop_reason": traj.stop_reason.value, "error": traj.error, "turns": traj.num_turns,
        "tool_calls": traj.num_tool_calls, "malformed_tool_calls": traj.num_malformed_tool_calls,
        "model_tokens": traj.num_model_tokens, "total_tokens": len(traj.prompt_ids) + len(traj.completion_ids),
        "versions": sorted({v for v, _ in spans}), "version_spans": spans, "temperature": traj.temperature,
        **({"sampling_mask": _mask_summary(traj)} if traj.sampling_mask is not None else {}),
        "messages": messages,
    }


def _mask_summary(traj: Trajectory) -> dict[str, float]:
    """How the engine's truncation cut this episode's sampled tokens: how many were cut, the mean size of the
    kept sets, and the stored bytes per token."""
    mask = traj.sampling_mask
    assert mask is not None
    cut = [c for c in mask.counts if c]
    return {"masked_tokens": len(cut), "kept_tokens_mean": sum(cut) / len(cut) if cut else float(mask.vocab),
            "vocab": mask.vocab, "bytes_per_token": mask.bytes_per_token()}


def sample_rows(batch: Sequence[Sequence[Trajectory]], *, step: int, k: int, seed: int, kind: str = "train",
                sampling: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The sample of ``step``: rows of one episode from each of ``k`` groups (seeded by ``seed`` and ``step``);
    ``sampling``: the settings the episodes were sampled with (top-p, top-k, min-p...), written on every row."""
    rng = random.Random(seed * 1_000_003 + step)
    return [{**episode_row(t, step=step, kind=kind, group_reward_mean=sum(x.reward for x in g) / len(g)),
             **({"sampling": dict(sampling)} if sampling is not None else {})}
            for t, g in pick_episodes(batch, k, rng)]


def write_samples(run_dir: Path, step: int, rows: Sequence[dict[str, Any]]) -> Path:
    """Write ``rows`` to ``<run_dir>/samples/step_<step>.jsonl`` (replacing a file of a step trained again)."""
    path = Path(run_dir) / SAMPLES_DIR / f"step_{step}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sample_steps(run_dir: Path) -> list[int]:
    """The steps that have a sample file in ``run_dir``, in order."""
    d = Path(run_dir) / SAMPLES_DIR
    found = [int(m.group(1)) for p in d.glob("step_*.jsonl") if (m := _STEP_FILE.match(p.name))] if d.is_dir() else []
    return sorted(found)


def read_samples(run_dir: Path, step: int) -> list[dict[str, Any]]:
    """The sample rows of ``step``."""
    path = Path(run_dir) / SAMPLES_DIR / f"step_{step}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def conversation_text(row: dict[str, Any]) -> str:
    """The row's messages as plain text, one block per message (for table cells)."""
    out = []
    for m in row["messages"]:
        head = m["role"] + (f" [v{','.join(map(str, m['versions']))}]" if m.get("versions") else "")
        body = m.get("content") or ""
        for c in m.get("tool_calls") or []:
            body += ("\n" if body else "") + f"-> {c['name']}({json.dumps(c['arguments'])})"
        out.append(f"{head}: {body}")
    return "\n\n".join(out)


def table_rows(rows: Sequence[dict[str, Any]]) -> list[list[Any]]:
    """``rows`` as table rows in :data:`TABLE_COLUMNS` order (cells: numbers and strings)."""
    return [[r["step"], r["task_id"], r["reward"], r["group_reward_mean"], r["stop_reason"],
             ",".join(map(str, r["versions"])), r["turns"], r["tool_calls"], r["model_tokens"], conversation_text(r)]
            for r in rows]
