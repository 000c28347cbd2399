"""Topological ordering."""


class CycleError(ValueError):
    """The graph has a cycle."""

    def __init__(self, nodes):
        super().__init__(f"cycle among {sorted(nodes)}")
        self.nodes = nodes


def topological_order(graph):
    """Nodes such that every edge goes forward (Kahn's algorithm; ties broken by node order).

    Raises CycleError naming the nodes left on cycles.
    """
    if not graph.directed:
        raise ValueError("topological order needs a directed graph")
    indegree = {node: graph.in_degree(node) for node in graph.nodes()}
    ready = sorted(node for node, d in indegree.items() if d == 0)
    order = []
    while ready:
        node = ready.pop(0)
        order.append(node)
        for nxt in graph.neighbors(node):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
                ready.sort()
    if len(order) != len(graph):
        raise CycleError({node for node, d in indegree.items() if d > 0})
    return order
