"""Rollouts: one episode as a state machine, the asyncio agent loop that drives it against an engine, the
token-faithful chat format and tool-call parsing, and the workers that run GRPO groups of episodes.

- :mod:`agentrl.rollout.episode`: `Episode`, open → step* → score → close;
- :mod:`agentrl.rollout.loop`: `run_episode`, generate → parse → run tools → observe → reward;
- :mod:`agentrl.rollout.chat`, :mod:`agentrl.rollout.toolcalls`: prompts, observation deltas, tool calls;
- :mod:`agentrl.rollout.groups`: `RolloutWorkers`, groups of episodes with a bound on episodes in flight;
- :mod:`agentrl.rollout.scripted`: scripted policies (oracle, null) through the same loop;
- :mod:`agentrl.rollout.stats`: summaries of a batch of trajectories.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_episode"]


def __getattr__(name: str) -> Any:
    """``from agentrl.rollout import run_episode`` as before the package split (lazily: no cycles)."""
    if name == "run_episode":
        from agentrl.rollout.loop import run_episode

        return run_episode
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
