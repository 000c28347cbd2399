"""Unweighted searches."""

from collections import deque


def bfs_order(graph, start):
    """Nodes reachable from ``start`` in breadth-first order (neighbors in insertion order)."""
    if start not in graph:
        return []
    seen = {start}
    order = []
    queue = deque([start])
    while queue:
        node = queue.popleft()
        order.append(node)
        for nxt in graph.neighbors(node):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return order


def shortest_path(graph, start, goal):
    """A path with the fewest edges from ``start`` to ``goal`` (a list of nodes), or None."""
    if start not in graph or goal not in graph:
        return None
    if start == goal:
        return [start]
    parent = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in graph.neighbors(node):
            if nxt in parent:
                continue
            parent[nxt] = node
            if nxt == goal:
                path = [goal]
                while parent[path[-1]] is not None:
                    path.append(parent[path[-1]])
                return path[::-1]
            queue.append(nxt)
    return None


def has_path(graph, start, goal):
    return shortest_path(graph, start, goal) is not None


def components(graph):
    """Connected components of an undirected graph, each a sorted list, ordered by their first node."""
    if graph.directed:
        raise ValueError("components() needs an undirected graph")
    seen = set()
    out = []
    for node in graph.nodes():
        if node in seen:
            continue
        comp = bfs_order(graph, node)
        seen.update(comp)
        out.append(sorted(comp))
    return sorted(out, key=lambda comp: comp[0])
