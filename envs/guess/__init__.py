"""The ``guess`` environment: find a hidden number from higher/lower feedback with a ``guess`` tool."""

from agentrl.envs.guess.env import GuessEnv, GuessTaskError
from agentrl.envs.guess.tasks import binary_search, make_tasks, score

__all__ = ["GuessEnv", "GuessTaskError", "binary_search", "make_tasks", "score"]
