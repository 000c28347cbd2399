import pytest

from minigraph import CycleError, Graph, dijkstra, path_weight, topological_order
from minigraph.paths import cheapest_path


def test_topological_order():
    """Every edge goes forward; ties are broken alphabetically."""
    g = Graph()
    for a, b in [("shirt", "tie"), ("tie", "jacket"), ("pants", "shoes"), ("pants", "belt"), ("belt", "jacket")]:
        g.add_edge(a, b)
    assert topological_order(g) == ["pants", "belt", "shirt", "shoes", "tie", "jacket"]


def test_topological_order_cycle():
    """A cycle is reported with the nodes on it."""
    g = Graph()
    g.add_edge("a", "b")
    g.add_edge("b", "c")
    g.add_edge("c", "b")
    with pytest.raises(CycleError) as info:
        topological_order(g)
    assert info.value.nodes == {"b", "c"}


def test_topological_order_undirected_rejected():
    """Undirected graphs have no topological order."""
    with pytest.raises(ValueError):
        topological_order(Graph(directed=False))


def _roads():
    g = Graph(directed=False)
    for a, b, w in [("a", "b", 4), ("a", "c", 1), ("c", "b", 2), ("b", "d", 5), ("c", "d", 8)]:
        g.add_edge(a, b, weight=w)
    return g


def test_dijkstra_distances():
    """Distances follow the cheapest routes."""
    dist, _ = dijkstra(_roads(), "a")
    assert dist == {"a": 0, "b": 3, "c": 1, "d": 8}


def test_cheapest_path():
    """The cheapest path may have more edges than the shortest one."""
    assert cheapest_path(_roads(), "a", "d") == ["a", "c", "b", "d"]


def test_cheapest_path_unreachable():
    """Unreachable goals give None."""
    g = _roads()
    g.add_node("z")
    assert cheapest_path(g, "a", "z") is None


def test_path_weight():
    """path_weight sums the edges of a path."""
    assert path_weight(_roads(), ["a", "c", "b", "d"]) == 8
