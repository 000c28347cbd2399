"""``agentrl show RUN_DIR``: a run's sample episodes in the terminal, for users without a tracker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentrl.core.errors import ConfigError
from agentrl.tracking.samples import read_samples, sample_steps

ROLE_STYLE = {"system": "dim", "user": "bold cyan", "assistant": "bold green", "tool": "bold yellow"}


class NoSamples(ConfigError):
    """The run directory has no sample episodes (or not of the step asked for)."""

    code = "config.no_samples"


def _summary_line(run_dir: Path) -> str | None:
    try:
        s = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    before, after = s.get("success_before"), s.get("success_after")
    fmt = lambda x: "?" if x is None else f"{x:.3f}"  # noqa: E731
    return f"{s.get('steps', '?')} steps; held-out success {fmt(before)} -> {fmt(after)}"


def choose_step(run_dir: Path, step: int | None) -> int:
    """``step`` if the run has its sample, else the latest sample's step when ``step`` is None."""
    steps = sample_steps(run_dir)
    if not steps:
        raise NoSamples(f"{run_dir} has no sample episodes (samples/step_N.jsonl): is it a run directory? "
                        "Samples are written every tracking.samples_every steps")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise NoSamples(f"{run_dir} has no sample of step {step}; samples exist for steps "
                        f"{', '.join(map(str, steps))}")
    return step


def render(run_dir: Path, step: int | None = None, n: int = 3, *, width: int | None = None,
           max_chars: int = 2000) -> list[Any]:
    """Rich renderables for ``n`` sample episodes of ``step`` (default: the latest sampled step)."""
    from rich.panel import Panel
    from rich.text import Text

    run_dir = Path(run_dir)
    step = choose_step(run_dir, step)
    rows = read_samples(run_dir, step)
    out: list[Any] = []
    head = Text(f"{run_dir.name}: step {step}, {min(n, len(rows))} of {len(rows)} sampled episodes "
                f"(steps with samples: {', '.join(map(str, sample_steps(run_dir)))})", style="bold")
    if (line := _summary_line(run_dir)) is not None:
        head.append(f"\n{line}", style="dim")
    out.append(head)
    for r in rows[:n]:
        body = Text()
        for m in r["messages"]:
            role = m["role"] + (f" v{','.join(map(str, m['versions']))}" if m.get("versions") else "")
            body.append(f"{role}: ", style=ROLE_STYLE.get(m["role"], "bold"))
            content = m.get("content") or ""
            body.append(content if len(content) <= max_chars else content[:max_chars] + " [...]")
            for c in m.get("tool_calls") or []:
                body.append(f"\n  -> {c['name']}({json.dumps(c['arguments'])})", style="magenta")
            body.append("\n")
        if r.get("error"):
            body.append(f"error: {r['error']}\n", style="red")
        body.rstrip()
        mean = r.get("group_reward_mean")
        title = (f"task {r['task_id']}  reward {r['reward']:g}"
                 + (f" (group mean {mean:.2f})" if mean is not None else "")
                 + f"  stop {r['stop_reason']}  versions {','.join(map(str, r['versions'])) or '-'}"
                 + f"  turns {r['turns']}  tokens {r['model_tokens']}/{r['total_tokens']}")
        style = "green" if r["reward"] >= 1 else ("red" if r["reward"] <= 0 else "yellow")
        out.append(Panel(body, title=title, title_align="left", border_style=style, width=width))
    return out
