"""The graph type."""


class Graph:
    """Nodes and weighted edges; undirected graphs store each edge in both directions."""

    def __init__(self, directed=True):
        self.directed = directed
        self._adj = {}

    def add_node(self, node):
        self._adj.setdefault(node, {})

    def add_edge(self, src, dst, weight=1):
        """Add (or re-weight) the edge ``src -> dst``."""
        if weight < 0:
            raise ValueError("negative weights are not supported")
        self.add_node(src)
        self.add_node(dst)
        self._adj[src][dst] = weight
        if not self.directed:
            self._adj[dst][src] = weight

    def remove_edge(self, src, dst):
        """Remove the edge ``src -> dst`` (KeyError if absent)."""
        del self._adj[src][dst]
        if not self.directed:
            del self._adj[dst][src]

    def nodes(self):
        """All nodes, in insertion order."""
        return list(self._adj)

    def neighbors(self, node):
        """Successors of ``node``, in insertion order."""
        return list(self._adj.get(node, {}))

    def weight(self, src, dst):
        return self._adj[src][dst]

    def edges(self):
        """``(src, dst, weight)`` triples; an undirected edge is listed once."""
        out = []
        seen = set()
        for src, targets in self._adj.items():
            for dst, weight in targets.items():
                if not self.directed and (dst, src) in seen:
                    continue
                seen.add((src, dst))
                out.append((src, dst, weight))
        return out

    def in_degree(self, node):
        return sum(1 for targets in self._adj.values() if node in targets)

    def __contains__(self, node):
        return node in self._adj

    def __len__(self):
        return len(self._adj)
