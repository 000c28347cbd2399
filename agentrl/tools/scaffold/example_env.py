"""ExampleEnv: an agentrl environment (written by ``agentrl init-env example_env``).

The agent answers questions about a shop's stock by calling the ``stock`` tool, then ``submit``s a
number. Replace the tasks, tools and reward with your own; keep the shape.

Next steps, from this directory:

    agentrl eval --env example_env.py:ExampleEnv --policy oracle   # the reference solution scores 1.0
    agentrl eval --env example_env.py:ExampleEnv --policy null     # giving up scores 0.0
    python -m pytest test_example_env.py                           # the same checks, as tests
    agentrl train --env example_env.py:ExampleEnv --model <chat model dir>

Run the two ``eval`` checks after every change: they go through the real agent loop (tool-call parsing,
argument validation against the schema, observations, reward) without a model. Training uses the
``train`` split; ``agentrl eval`` reports on the ``test`` split.
"""

from __future__ import annotations

import random
from typing import Any

import agentrl

ITEMS = ("apples", "bolts", "candles", "dice", "eggs", "flags", "gloves", "hats")
SHOPS = ("north", "south", "east")


def _stock(seed: int) -> dict[str, dict[str, int]]:
    """Each task has its own stock table, so the answer has to be looked up, not remembered."""
    rng = random.Random(seed)
    return {shop: {item: rng.randint(0, 40) for item in ITEMS} for shop in SHOPS}


class ExampleEnv(agentrl.Environment):
    name = "example_env"
    """The name runs and the env server use."""
    system_prompt = "You help count a shop's stock. Use the tools; finish by calling submit with a number."
    max_turns = 6
    """Assistant turns per episode."""

    @classmethod
    def tasks(cls, split: str = "train") -> list[agentrl.Task]:
        """Tasks are JSON objects with an ``id``; here 200 train and 50 test tasks made from a seed."""
        seeds = range(200) if split == "train" else range(1000, 1050)
        out = []
        for seed in seeds:
            rng = random.Random(seed)
            item, shops = rng.choice(ITEMS), rng.sample(SHOPS, k=rng.randint(1, 3))
            out.append({"id": f"{split}-{seed}", "seed": seed, "item": item, "shops": sorted(shops)})
        return out

    async def reset(self, task: agentrl.Task) -> str:
        """Start an episode; the returned text is the first user message."""
        self.table = _stock(task["seed"])
        self.answer: int | None = None
        return f"How many {task['item']} are in stock in the {' and '.join(task['shops'])} shop(s) together?"

    @agentrl.tool
    def stock(self, item: str, shop: str) -> int:
        """Look up how many of an item one shop has.

        Args:
            item: one of apples, bolts, candles, dice, eggs, flags, gloves, hats.
            shop: north, south or east.
        """
        if shop not in self.table:
            raise agentrl.ToolError(f"no shop {shop!r}; shops: {', '.join(SHOPS)}")  # shown to the model
        if item not in self.table[shop]:
            raise agentrl.ToolError(f"no item {item!r}; items: {', '.join(ITEMS)}")
        return self.table[shop][item]

    @agentrl.tool
    def submit(self, total: int) -> str:
        """Give the final answer and end the episode.

        Args:
            total: the number of items.
        """
        self.answer = total
        self.finish()
        return "submitted"

    async def reward(self, messages: list[agentrl.Message]) -> float:
        """1.0 for the right total, else 0.0 (a dict with a ``reward`` key and extra metrics also works)."""
        want = sum(self.table[shop][self.task["item"]] for shop in self.task["shops"])
        return float(self.answer == want)

    @classmethod
    def reference_solution(cls, task: agentrl.Task) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls of a perfect agent; ``agentrl eval --policy oracle`` replays them."""
        table = _stock(task["seed"])
        calls: list[tuple[str, dict[str, Any]]] = [("stock", {"item": task["item"], "shop": s}) for s in task["shops"]]
        return [*calls, ("submit", {"total": sum(table[s][task["item"]] for s in task["shops"])})]
