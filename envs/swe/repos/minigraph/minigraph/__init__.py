"""minigraph: small graph algorithms."""

from minigraph.graph import Graph
from minigraph.order import CycleError, topological_order
from minigraph.paths import dijkstra, path_weight
from minigraph.search import bfs_order, components, has_path, shortest_path

__all__ = [
    "CycleError",
    "Graph",
    "bfs_order",
    "components",
    "dijkstra",
    "has_path",
    "path_weight",
    "shortest_path",
    "topological_order",
]
