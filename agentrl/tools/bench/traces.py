"""Seeded synthetic RL rollout traces shaped like PolyTrace ("RL in the Wild", Zhou et al.).

What the generator reproduces from the paper's observations:

- long-tailed sequence lengths that differ by task (lognormal, or Pareto for a heavier tail), capped
  by the generation budget, with a per-task difficulty factor shared by the G rollouts of a group
  (hard prompts make the whole group long);
- output-length drift: the median output grows linearly with the training step;
- multi-turn episodes whose tool calls have heavy-tailed, unstable latencies;
- determinism: group ``k`` depends only on (seed, mix, k), so traces of different lengths agree on
  their common prefix and sync/async replays of one trace see identical work.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Literal

from agentrl.tools.bench.errors import BenchArgumentError

Dist = Literal["lognormal", "pareto"]


@dataclass(frozen=True)
class Turn:
    """One model call: new prompt tokens to prefill, tokens to decode, then the tool call's latency."""

    prompt_tokens: int
    """Tokens appended since the previous call (turn 0: the whole prompt; later: tool observations)."""
    output_tokens: int
    tool_latency_s: float
    """Latency of the tool call that follows this turn (0.0 on the last turn)."""


@dataclass(frozen=True)
class Episode:
    """One rollout: its turns in order."""

    turns: list[Turn]

    @property
    def total_tokens(self) -> int:
        """Length of the final training sequence (prompt, outputs and observations)."""
        return sum(t.prompt_tokens + t.output_tokens for t in self.turns)

    @property
    def output_tokens(self) -> int:
        return sum(t.output_tokens for t in self.turns)


@dataclass(frozen=True)
class MixSpec:
    """Distribution parameters of one task mix (token counts are medians before drift)."""

    name: str
    prompt_median: float
    output_median: float
    output_sigma: float
    """Lognormal σ of per-turn output length (the tail knob); for Pareto see ``pareto_alpha``."""
    max_output_tokens: int
    turns_min: int = 1
    turns_max: int = 1
    obs_median: float = 0.0
    """Median tool-observation tokens appended after each tool call."""
    tool_median_s: float = 0.0
    tool_sigma: float = 1.0
    task_sigma: float = 0.5
    """Lognormal σ of the per-group difficulty factor that scales every member's output length."""
    output_dist: Dist = "lognormal"
    tool_dist: Dist = "lognormal"
    pareto_alpha: float = 1.5
    """Pareto shape for ``*_dist="pareto"`` (smaller: heavier tail; < 2: infinite variance)."""
    drift_per_step: float = 0.02
    """Median output length grows by this fraction of its initial value per training step."""
    max_context_tokens: int = 32768


MIXES: dict[str, MixSpec] = {
    # single-turn reasoning: 16k budget, outputs grow as reasoning improves
    "math": MixSpec("math", prompt_median=300, output_median=1500, output_sigma=1.0,
                    max_output_tokens=16384, drift_per_step=0.03),
    # multi-turn tool use (search / code interpreter): unstable tool latency dominates turns
    "tool": MixSpec("tool", prompt_median=800, output_median=350, output_sigma=0.9, max_output_tokens=4096,
                    turns_min=2, turns_max=8, obs_median=250, tool_median_s=2.0, tool_sigma=1.2),
    # software engineering agents: long contexts, many turns, sandbox commands
    "swe": MixSpec("swe", prompt_median=3000, output_median=250, output_sigma=0.8, max_output_tokens=2048,
                   turns_min=8, turns_max=40, obs_median=600, tool_median_s=3.0, tool_sigma=1.0,
                   drift_per_step=0.01),
}


def _draw(rng: random.Random, dist: Dist, median: float, sigma: float, alpha: float) -> float:
    """A positive draw with the given median: lognormal(σ) or Pareto(α)."""
    if median <= 0:
        return 0.0
    if dist == "pareto":
        return median / 2 ** (1 / alpha) * rng.paretovariate(alpha)
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def make_group(spec: MixSpec, step: int, group_size: int, rng: random.Random) -> list[Episode]:
    """The G episodes of one GRPO group generated at training step ``step``."""
    difficulty = math.exp(spec.task_sigma * rng.gauss(0.0, 1.0))
    prompt = max(16, round(_draw(rng, "lognormal", spec.prompt_median, 0.5, spec.pareto_alpha)))
    out_median = spec.output_median * (1.0 + spec.drift_per_step * step) * difficulty
    episodes = []
    for _ in range(group_size):
        n_turns = rng.randint(spec.turns_min, spec.turns_max)
        turns: list[Turn] = []
        context, new = 0, prompt
        for k in range(n_turns):
            out = _draw(rng, spec.output_dist, out_median, spec.output_sigma, spec.pareto_alpha)
            out = max(1, min(round(out), spec.max_output_tokens, spec.max_context_tokens - context - new))
            context += new + out
            last = k == n_turns - 1 or context >= spec.max_context_tokens - 16
            latency = 0.0 if last else _draw(rng, spec.tool_dist, spec.tool_median_s, spec.tool_sigma,
                                             spec.pareto_alpha)
            turns.append(Turn(new, out, latency))
            if last:
                break
            new = max(1, round(_draw(rng, "lognormal", spec.obs_median, 0.7, spec.pareto_alpha)))
            if context + new >= spec.max_context_tokens - 16:
                break
        episodes.append(Episode(turns))
    return episodes


@dataclass
class Trace:
    """``steps[s][g][i]``: episode i of group g of step s (flat group order is the replay order)."""

    mix: str
    seed: int
    group_size: int
    groups_per_step: int
    steps: list[list[list[Episode]]] = field(default_factory=list)
    max_output_tokens: int = 0
    """The mix's per-turn output cap: the ``max_tokens`` every model call is sent with."""

    @property
    def groups(self) -> list[list[Episode]]:
        """All groups in replay order."""
        return [g for step in self.steps for g in step]

    def total_tokens(self) -> int:
        return sum(e.total_tokens for g in self.groups for e in g)


def mix_spec(mix: str, tail: Dist | None = None, sigma: float | None = None, drift: float | None = None) -> MixSpec:
    """A named mix, optionally with another output tail (``tail``/``sigma``) or drift."""
    if mix not in MIXES:
        raise BenchArgumentError(f"unknown mix {mix!r}; known: {sorted(MIXES)}")
    spec = MIXES[mix]
    if tail is not None:
        spec = replace(spec, output_dist=tail)
    if sigma is not None:
        spec = replace(spec, output_sigma=sigma)
    if drift is not None:
        spec = replace(spec, drift_per_step=drift)
    return spec


def make_trace(mix: str | MixSpec, steps: int, groups_per_step: int, group_size: int, seed: int = 0) -> Trace:
    """A deterministic trace of ``steps`` × ``groups_per_step`` groups of ``group_size`` episodes."""
    spec = mix_spec(mix) if isinstance(mix, str) else mix
    out = Trace(spec.name, seed, group_size, groups_per_step, max_output_tokens=spec.max_output_tokens)
    for s in range(steps):
        row = []
        for g in range(groups_per_step):
            k = s * groups_per_step + g
            row.append(make_group(spec, s, group_size, random.Random(seed * 1_000_003 + k)))
        out.steps.append(row)
    return out
