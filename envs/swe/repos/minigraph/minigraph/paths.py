"""Weighted shortest paths."""

import heapq


def dijkstra(graph, start):
    """``(distances, parents)`` from ``start`` to every reachable node."""
    dist = {start: 0}
    parent = {start: None}
    heap = [(0, 0, start)]
    counter = 1
    done = set()
    while heap:
        d, _, node = heapq.heappop(heap)
        if node in done:
            continue
        done.add(node)
        for nxt in graph.neighbors(node):
            nd = d + graph.weight(node, nxt)
            if nxt not in dist or nd < dist[nxt]:
                dist[nxt] = nd
                parent[nxt] = node
                heapq.heappush(heap, (nd, counter, nxt))
                counter += 1
    return dist, parent


def cheapest_path(graph, start, goal):
    """The lowest-weight path from ``start`` to ``goal`` as a list of nodes, or None."""
    if start not in graph or goal not in graph:
        return None
    dist, parent = dijkstra(graph, start)
    if goal not in dist:
        return None
    path = [goal]
    while path[-1] != start:
        path.append(parent[path[-1]])
    path.reverse()
    return path


def path_weight(graph, path):
    """Total weight along ``path``; KeyError if an edge is missing."""
    total = 0
    for a, b in zip(path, path[1:]):
        total += graph.weight(a, b)
    return total
