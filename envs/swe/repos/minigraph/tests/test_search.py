import pytest

from minigraph import Graph, bfs_order, components, has_path, shortest_path


def _chain():
    g = Graph()
    for a, b in [("a", "b"), ("b", "c"), ("c", "d"), ("a", "e"), ("e", "d")]:
        g.add_edge(a, b)
    return g


def test_bfs_order():
    """BFS visits nodes level by level."""
    assert bfs_order(_chain(), "a") == ["a", "b", "e", "c", "d"]


def test_bfs_unknown_start():
    """An unknown start node gives an empty order."""
    assert bfs_order(_chain(), "zzz") == []


def test_shortest_path_fewest_edges():
    """The path with the fewest edges is found."""
    assert shortest_path(_chain(), "a", "d") == ["a", "e", "d"]


def test_shortest_path_same_node():
    """A node reaches itself with a one-node path."""
    assert shortest_path(_chain(), "c", "c") == ["c"]


def test_shortest_path_unreachable():
    """Unreachable goals give None."""
    assert shortest_path(_chain(), "d", "a") is None


def test_has_path():
    """has_path follows edge directions."""
    g = _chain()
    assert has_path(g, "a", "c") and not has_path(g, "c", "a")


def test_components():
    """Components are sorted lists ordered by their first node."""
    g = Graph(directed=False)
    g.add_edge("x", "y")
    g.add_edge("b", "a")
    g.add_node("m")
    assert components(g) == [["a", "b"], ["m"], ["x", "y"]]


def test_components_directed_rejected():
    """Components need an undirected graph."""
    with pytest.raises(ValueError):
        components(Graph())
