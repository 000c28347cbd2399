"""The ``lookup`` environment: multi-hop questions over a generated knowledge base, with ``search`` and ``open``."""

from agentrl.envs.lookup.env import LookupEnv
from agentrl.envs.lookup.tasks import LookupTaskError, make_tasks, normalize
from agentrl.envs.lookup.world import World, world

__all__ = ["LookupEnv", "LookupTaskError", "World", "make_tasks", "normalize", "world"]
