"""A step's hits in data-flow order, led by where a NaN/Inf was born.

Execution (completion) order puts a consumer before its producer whenever the producer is a module call
that is still open when the consumer completes: a NaN born inside ``Attention`` shows up first at its child
``attn.wo`` (which completes first) although ``first_nonfinite`` rightly names ``Attention``. So a step's
hits are ranked by the graph's data flow instead: a topological order of the graph (ties, and the nodes of
a cycle, by execution order), with the hits on the step's non-finite origin first and marked
(``HitRecord.origin``). Pausing on the first hit then pauses at the origin.

>>> from nbdebug.session.graph import Graph
>>> g = Graph()
>>> for i, n in enumerate(("Input.0", "wo", "Attention", "loss")):
...     g.add_node(n, kind="op", op_type=n).order = i
>>> g.nodes["Attention"].order, g.nodes["wo"].order = 1, 2   # the child completes before its parent...
>>> g.add_edge("Input.0", "Attention"); g.add_edge("Attention", "wo"); g.add_edge("wo", "loss")
>>> rank = flow_rank(g)                                        # ...but the data flows parent -> child
>>> sorted(["loss", "wo", "Attention"], key=rank.__getitem__)
['Attention', 'wo', 'loss']
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable
from typing import Any

_CACHE: dict[int, tuple[Any, int, dict[str, int]]] = {}


def flow_rank(graph: Any) -> dict[str, int]:
    """Node name -> position in a topological order of ``graph`` (Kahn's algorithm; among the nodes ready
    at once, the one that executed first; a cycle is broken at its earliest-executed node). Cached per
    graph version."""
    cached = _CACHE.get(id(graph))
    if cached is not None and cached[0] is graph and cached[1] == graph.version:
        return cached[2]
    nodes = graph.nodes

    def key(name: str) -> tuple:
        order = nodes[name].order
        return (order < 0, order, name)

    indeg = {name: 0 for name in nodes}
    succ: dict[str, list[str]] = {name: [] for name in nodes}
    for src, dst in graph.edges:
        if src in indeg and dst in indeg:
            succ[src].append(dst)
            indeg[dst] += 1
    ready = [key(n) for n, d in indeg.items() if d == 0]
    heapq.heapify(ready)
    rank: dict[str, int] = {}
    left = sorted(nodes, key=key)  # for breaking cycles: earliest-executed node not ranked yet
    cursor = 0
    while len(rank) < len(indeg):
        if not ready:
            while left[cursor] in rank:
                cursor += 1
            indeg[left[cursor]] = 0
            ready.append(key(left[cursor]))
        name = heapq.heappop(ready)[2]
        if name in rank:
            continue
        rank[name] = len(rank)
        for dst in succ[name]:
            if dst in rank:
                continue
            indeg[dst] -= 1
            if indeg[dst] == 0:
                heapq.heappush(ready, key(dst))
    _CACHE.clear()
    _CACHE[id(graph)] = (graph, graph.version, rank)
    return rank


def in_flow_order(graph: Any, records: Iterable[Any], origin: str | None) -> list[Any]:
    """``records`` (hit records of one step) ranked by data flow: ``order`` becomes the record's position
    (the origin's records first, with ``origin=True``), so every reader sorting by ``order`` agrees."""
    records = list(records)
    if not records:
        return records
    rank = flow_rank(graph) if len({r.node for r in records}) > 1 else {}
    big = len(rank) + 1

    def key(r: Any) -> tuple:
        return (r.node != origin, rank.get(r.node, big), r.order, r.node, r.slot, r.watchpoint)

    ranked = sorted(records, key=key)
    return [dataclasses.replace(r, order=i, origin=r.node == origin and bool(r.hits)) for i, r in enumerate(ranked)]
