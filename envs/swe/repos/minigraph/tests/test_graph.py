import pytest

from minigraph import Graph


def test_directed_edges_one_way():
    """A directed edge only goes one way."""
    g = Graph()
    g.add_edge("a", "b")
    assert (g.neighbors("a"), g.neighbors("b")) == (["b"], [])


def test_undirected_edges_both_ways():
    """An undirected edge goes both ways."""
    g = Graph(directed=False)
    g.add_edge("a", "b", weight=3)
    assert (g.neighbors("b"), g.weight("b", "a")) == (["a"], 3)


def test_negative_weight_rejected():
    """Negative weights are rejected."""
    with pytest.raises(ValueError):
        Graph().add_edge("a", "b", weight=-1)


def test_remove_undirected_edge():
    """Removing an undirected edge removes both directions."""
    g = Graph(directed=False)
    g.add_edge("a", "b")
    g.remove_edge("b", "a")
    assert (g.neighbors("a"), g.neighbors("b")) == ([], [])


def test_edges_listed_once_when_undirected():
    """Undirected edges are listed once."""
    g = Graph(directed=False)
    g.add_edge("a", "b", weight=2)
    g.add_edge("b", "c", weight=5)
    assert g.edges() == [("a", "b", 2), ("b", "c", 5)]


def test_in_degree():
    """in_degree counts incoming edges."""
    g = Graph()
    g.add_edge("a", "c")
    g.add_edge("b", "c")
    assert (g.in_degree("c"), g.in_degree("a")) == (2, 0)


def test_len_and_contains():
    """Nodes are counted once and can be tested for membership."""
    g = Graph()
    g.add_edge("a", "b")
    g.add_node("a")
    assert len(g) == 2 and "b" in g and "z" not in g
