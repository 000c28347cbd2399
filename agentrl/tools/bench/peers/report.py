"""The table of ``agentrl bench peers``: per seed and as means with their spread, from each side's results.

Pure arithmetic on the per-seed results of :func:`agentrl.tools.bench.peers.run.run_seed`:

- **seconds per 1,000 episodes**: the training loop's wall time over its episodes;
- **generation tokens/s**: model tokens sampled over the time spent generating (tool calls included, as both
  frameworks interleave them);
- **trainer tokens/s**: the tokens of every sampled sequence (prompt, completion and tool results) over the
  step time that was not generation;
- **held-out success** before and after, and the gain, with its standard error: over seeds (the spread of
  the per-seed gains) when there are two or more, else the binomial error of the two evaluations.

``time_ratio`` is agentrl's seconds per 1,000 episodes over the peer's (below 1: agentrl is faster), from the
totals over every seed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from agentrl.tools.bench.errors import NoMeasurements

SIDES = ("agentrl", "trl")


def side_figures(side: dict[str, Any]) -> dict[str, float]:
    """The figures of one framework's run of one seed."""
    steps = side["steps"]
    episodes = sum(s["episodes"] for s in steps)
    gen_s = sum(s["gen_s"] for s in steps)
    rest_s = sum(max(s["s"] - s["gen_s"], 0.0) for s in steps)
    return {
        "loop_s": side["loop_s"], "episodes": episodes,
        "s_per_1000_episodes": 1000.0 * side["loop_s"] / max(episodes, 1),
        "gen_tokens_per_s": sum(s["model_tokens"] for s in steps) / max(gen_s, 1e-9),
        "trainer_tokens_per_s": sum(s["batch_tokens"] for s in steps) / max(rest_s, 1e-9),
        "gen_frac": gen_s / max(sum(s["s"] for s in steps), 1e-9),
        "success_before": side["success_before"], "success_after": side["success_after"],
        "gain": side["success_after"] - side["success_before"],
    }


def _binomial_se(p: float, n: int) -> float:
    return math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))


def summarize(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-seed figures, each side's means (with the spread over seeds), and ``time_ratio``."""
    if not seeds:
        raise NoMeasurements("no seeds to summarise")
    per_seed = [{"seed": s["seed"], "order": s["order"], **{k: side_figures(s[k]) for k in SIDES}} for s in seeds]
    out: dict[str, Any] = {"per_seed": per_seed}
    for k in SIDES:
        rows = [p[k] for p in per_seed]
        gains = [r["gain"] for r in rows]
        if len(gains) >= 2:
            gain_se = statistics.stdev(gains) / math.sqrt(len(gains))
        else:
            n = seeds[0]["eval_n"]
            gain_se = math.hypot(_binomial_se(rows[0]["success_before"], n), _binomial_se(rows[0]["success_after"], n))
        episodes = sum(r["episodes"] for r in rows)
        out[k] = {
            "s_per_1000_episodes": 1000.0 * sum(r["loop_s"] for r in rows) / max(episodes, 1),
            "s_per_1000_episodes_seeds": [round(r["s_per_1000_episodes"], 2) for r in rows],
            "gen_tokens_per_s": statistics.fmean(r["gen_tokens_per_s"] for r in rows),
            "trainer_tokens_per_s": statistics.fmean(r["trainer_tokens_per_s"] for r in rows),
            "gen_frac": statistics.fmean(r["gen_frac"] for r in rows),
            "success_before": statistics.fmean(r["success_before"] for r in rows),
            "success_after": statistics.fmean(r["success_after"] for r in rows),
            "gain": statistics.fmean(gains), "gain_se": gain_se,
        }
    out["time_ratio"] = out["agentrl"]["s_per_1000_episodes"] / max(out["trl"]["s_per_1000_episodes"], 1e-9)
    out["gain_difference"] = out["agentrl"]["gain"] - out["trl"]["gain"]
    out["gain_difference_se"] = math.hypot(out["agentrl"]["gain_se"], out["trl"]["gain_se"])
    return out


def table(summary: dict[str, Any], generation: str, mode: str = "sync") -> str:
    """The summary as a Markdown table, one row per framework and seed, then the means; ``mode``: agentrl's."""
    head = ("| framework | seed | s / 1,000 episodes | generation tok/s | trainer tok/s | generation share "
            "| success before | after | gain |\n|---|---|---|---|---|---|---|---|---|")
    rows = []
    names = {"agentrl": f"agentrl ({mode}, vLLM server)", "trl": f"TRL ({generation})"}
    for k in SIDES:
        for p in summary["per_seed"]:
            r = p[k]
            rows.append(f"| {names[k]} | {p['seed']} | {r['s_per_1000_episodes']:.1f} | {r['gen_tokens_per_s']:.0f} "
                        f"| {r['trainer_tokens_per_s']:.0f} | {r['gen_frac']:.2f} | {r['success_before']:.3f} "
                        f"| {r['success_after']:.3f} | {r['gain']:+.3f} |")
        m = summary[k]
        rows.append(f"| **{names[k]}, mean** | all | **{m['s_per_1000_episodes']:.1f}** | {m['gen_tokens_per_s']:.0f} "
                    f"| {m['trainer_tokens_per_s']:.0f} | {m['gen_frac']:.2f} | {m['success_before']:.3f} "
                    f"| {m['success_after']:.3f} | **{m['gain']:+.3f} ± {m['gain_se']:.3f}** |")
    return "\n".join([head, *rows])
