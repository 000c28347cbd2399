"""A complete custom tool environment: a tiny key-value store the agent must query.

.. doc-test: repo

Check its tools and reward (from the repository root; the reference solution scores 1.0)::

    agentrl eval --env examples.custom_env:Lookup --policy oracle

.. doc-test: skip: needs a chat model directory of your own and minutes of training

Then train it::

    agentrl train --env examples.custom_env:Lookup --model <a chat model directory>
"""

from __future__ import annotations

import agentrl

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima"}


class Lookup(agentrl.Environment):
    name = "lookup"
    system_prompt = "Use the tools to find facts, then call submit with your answer."
    max_turns = 4

    @classmethod
    def tasks(cls, split: str = "train") -> list[agentrl.Task]:
        countries = sorted(CAPITALS)[:3] if split == "train" else sorted(CAPITALS)[3:]
        return [{"id": f"{split}-{c}", "country": c} for c in countries]

    async def reset(self, task: agentrl.Task) -> str:
        return f"What is the capital of {task['country']}?"

    @agentrl.tool
    def capital_of(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: the country's English name, e.g. "France".
        """
        if country not in CAPITALS:
            raise agentrl.ToolError(f"no data for {country!r}; known: {sorted(CAPITALS)}")
        return CAPITALS[country]

    @agentrl.tool
    def submit(self, answer: str) -> str:
        """Submit the final answer and end the episode.

        Args:
            answer: the capital city.
        """
        self.answer = answer
        self.finish()
        return "submitted"

    async def reward(self, messages: list[agentrl.Message]) -> float:
        return float(getattr(self, "answer", "") == CAPITALS[self.task["country"]])

    @classmethod
    def reference_solution(cls, task: agentrl.Task) -> list[tuple[str, dict]]:
        """What a perfect agent does (``agentrl eval --policy oracle`` replays it)."""
        return [("capital_of", {"country": task["country"]}), ("submit", {"answer": CAPITALS[task["country"]]})]

