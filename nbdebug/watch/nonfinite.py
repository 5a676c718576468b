"""Where NaN/Inf starts in a step: the first node whose inputs are finite and whose output is not, and
whose non-finite values *propagate*.

Some models compute ±Inf on purpose: an attention mask of ``-inf`` added to scores before a softmax, or
T5's ``log(0) = -inf`` in its relative-position buckets, cast to an integer right after. Such a value is
*benign*: following the data-flow edges of the step from the node, every path of non-finite outputs ends
at a consumer whose outputs are all finite (the softmax, the cast). A non-finite value matters when some
path reaches a node with no consumer in the step (the loss, a model output, a gradient the optimizer
reads), or a consumer with no recorded output. Sessions without edges (most loaded dumps) treat every
origin as mattering. ``ignore`` names
nodes (glob patterns) whose non-finite outputs are intended; they are skipped as origins.

A value no recorded node made can be non-finite too: a weight set to NaN between steps, a NaN in the batch.
A live session has its ``Parameter`` / ``Input`` node, whose output is the origin; a dump at L1 has no such
node, and the value first shows as an input of the first op reading it. That input slot is then the origin
(``(op, "input.2", step)``): the first non-finite input that no edge brings from a recorded node, and whose
kind (NaN, +Inf, -Inf) no earlier node output (a dump's edges are inferred from identical statistics, so an
edge between non-finite tensors can be missing; such an input is taken as made earlier).
The op's finite outputs absorb it (benign) like any consumer's.

>>> from nbdebug.session.session import Session
>>> from nbdebug.session.stats import StatsTable
>>> s = Session(framework="numpy", live=False)
>>> for i, n in enumerate(("mask", "add", "softmax")):
...     s.graph.add_node(n, kind="op", op_type=n).order = i
>>> s.graph.add_edge("mask", "add", "output.0", "input.1"); s.graph.add_edge("add", "softmax", "output.0", "input.0")
>>> inf = [0, 0, 0, 0, 0, 0, 0, 0, 1, 4]  # one -inf
>>> fin = [1, 0, 0, 0, 0, 0, 0, 0, 0, 4]
>>> keys = [("mask", "output.0"), ("add", "input.1"), ("add", "output.0"), ("softmax", "input.0"),
...         ("softmax", "output.0")]
>>> s.steps[0] = StatsTable.from_rows(keys, ["float32"] * 5, [(4,)] * 5, np.array([inf, inf, inf, inf, fin]))
>>> first_nonfinite(s, 0) is None, first_nonfinite(s, 0, benign=False)
(True, ('mask', 'output.0', 0))
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase
from typing import Any

import numpy as np

_IN_PREFIXES = ("input", "parameters")


def _bad_rows(table: Any) -> np.ndarray:
    cols = [np.nan_to_num(table.column(c)) for c in ("nan_count", "pos_inf_count", "neg_inf_count")]
    return (cols[0] + cols[1] + cols[2]) > 0


def first_nonfinite(session: Any, idx: int, *, ignore: Iterable[str] = (), benign: bool = True
                    ) -> tuple[str, str, int] | None:
    """``(node, slot, idx)`` of the first non-finite origin in step ``idx`` of ``session`` that matters
    (``benign=False``: the first origin at all), None when there is none. A live session's nodes are taken
    in execution order, a loaded one's in the order of its rows. ``slot`` is an output of ``node``, or one of
    its inputs when no recorded node made the value (a parameter or batch input of a dump without their
    nodes)."""
    try:
        table = session.table(idx)
    except KeyError:
        return None
    if not len(table):
        return None
    bad = _bad_rows(table)
    if not bad.any():
        return None
    by_node: dict[str, list[int]] = {}
    for i, (node, _slot) in enumerate(table.keys):
        by_node.setdefault(node, []).append(i)
    nodes = session.graph.nodes
    names = list(by_node)
    if getattr(session, "live", False):
        orders = getattr(table, "orders", None)  # a finished step's own order; the step in progress: the nodes'
        if orders is not None:
            names.sort(key=lambda n: orders.get(n, 1 << 60))
        else:
            names.sort(key=lambda n: nodes[n].order if n in nodes else 1 << 60)
    patterns = [ignore] if isinstance(ignore, str) else list(ignore)
    kinds = _kinds(table, bad)
    seen: set[int] = set()  # the kinds of non-finite value (NaN, +Inf, -Inf) some earlier node output
    for name in names:
        rows = by_node[name]
        outs = [i for i in rows if not table.keys[i][1].startswith(_IN_PREFIXES)]
        bad_outs = [i for i in outs if bad[i]]
        bad_ins = [i for i in rows if bad[i] and i not in outs]
        earlier, seen = seen, seen.union(*(kinds[i] for i in bad_outs))
        if patterns and any(fnmatchcase(name, p) for p in patterns):
            continue
        if bad_ins:  # an origin only if no recorded node made the value: a parameter or batch input read here
            born = next((i for i in bad_ins if not kinds[i] & earlier
                         and not _produced(session.graph, name, table.keys[i][1])), None)
            if born is None or (benign and outs and not bad_outs):
                continue  # made by an earlier node, or absorbed by this one (its outputs are finite)
            if benign and bad_outs and not _propagates(session.graph, name, table, by_node, bad):
                continue
            return name, table.keys[born][1], int(idx)
        if not bad_outs or (benign and not _propagates(session.graph, name, table, by_node, bad)):
            continue
        return name, table.keys[bad_outs[0]][1], int(idx)
    return None


def _kinds(table: Any, bad: np.ndarray) -> dict[int, frozenset[int]]:
    """For each non-finite row, which kinds of value it holds: 0 NaN, 1 +Inf, 2 -Inf."""
    rows = np.flatnonzero(bad)
    cols = np.stack([np.nan_to_num(table.column(c)[rows]) > 0
                     for c in ("nan_count", "pos_inf_count", "neg_inf_count")])
    return {int(r): frozenset(np.flatnonzero(cols[:, j]).tolist()) for j, r in enumerate(rows)}


def _produced(graph: Any, name: str, slot: str) -> bool:
    """Whether an edge brings input ``slot`` of ``name`` from a recorded node (a module's ``internal`` value
    has an edge but no row; a dump infers its edges from identical statistics)."""
    return any(d == slot for src in graph.predecessors(name) for _, d in graph.edges[(src, name)])


def _bad_outputs(table: Any, rows: list[int], bad: np.ndarray) -> set[str]:
    return {table.keys[i][1] for i in rows if bad[i] and not table.keys[i][1].startswith(_IN_PREFIXES)}


def _propagates(graph: Any, origin: str, table: Any, by_node: dict[str, list[int]], bad: np.ndarray) -> bool:
    """Whether a path of non-finite outputs from ``origin`` reaches a node without consumers in the step."""
    if not graph.edges:
        return True  # no data flow known: nothing says the value is absorbed
    unsupported = getattr(table, "unsupported", None) or {}  # rows without statistics (a kernel's unwritten output)
    seen = {origin}
    frontier = [origin]
    while frontier:
        name = frontier.pop()
        slots = _bad_outputs(table, by_node[name], bad)
        node = graph.nodes.get(name)
        own_backward = node.pair if node is not None and node.section == "forward" else None
        # a forward node's edge into its own backward (the loss's, when nothing else feeds it) carries no value
        # the backward computes with: d(loss)/d(loss) = 1 whatever the loss is, so it absorbs nothing
        consumers = [dst for dst in graph.successors(name) if dst in by_node and dst != own_backward and any(
            s in slots or not s for s, _ in graph.edges[(name, dst)])]
        if not consumers:
            return True
        for c in consumers:  # grows by the readers of an in-place write's target
            if not any(not table.keys[i][1].startswith(_IN_PREFIXES) and i not in unsupported for i in by_node[c]):
                readers = _readers_after_write(graph, c, table, by_node)
                if readers is None:
                    return True  # a consumer without measured outputs cannot show that it absorbed the value
                consumers += [r for r in readers if r not in consumers]
                continue
            if c not in seen and _bad_outputs(table, by_node[c], bad):
                seen.add(c)
                frontier.append(c)
    return False


def _readers_after_write(graph: Any, name: str, table: Any, by_node: dict[str, list[int]]) -> list[str] | None:
    """The nodes that read what in-place write ``name`` wrote (``x[i] = v``: ``Tensor.__setitem__``, which has
    no output slot): the consumers of its target's producer that run after it — a later reader's edge comes
    from the target's producer. None when ``name`` is no such write, or nothing reads the target after it.

    Longformer writes ``where(mask, full_like(x, -inf), x)`` into its scores with ``x[...] = …`` before the
    softmax absorbs the ``-inf``."""
    node = graph.nodes.get(name)
    if node is None or not (node.op_type == "__setitem__" or node.op_type.endswith("_")):
        return None
    target = [src for src in graph.predecessors(name) if any(d == "input.0" for _, d in graph.edges[(src, name)])]
    if len(target) != 1:
        return None
    src = target[0]
    slots = {s for s, d in graph.edges[(src, name)] if d == "input.0"}
    orders = getattr(table, "orders", None) or {}
    at = orders.get(name, node.order)
    readers = [dst for dst in graph.successors(src) if dst != name and dst in by_node
               and orders.get(dst, graph.nodes[dst].order) > at
               and graph.nodes[dst].section == node.section
               and any(s in slots for s, _ in graph.edges[(src, dst)])]
    return readers or None


def nonfinite_path(session: Any, idx: int, origin: str) -> dict[str, str]:
    """The way a NaN/Inf born at ``origin`` travelled through step ``idx``: reached node -> the node it was
    reached from (``origin`` -> itself), along data-flow edges between nodes whose outputs are non-finite
    (the last node of a path may be any node of the step), in the step's data-flow order, each node reached
    by the *longest* such path. A forward node also leads to its own backward node (``pair``), which
    computes with the tensors the forward one saved: that is how a NaN activation reaches the gradients.
    A NaN weight thus reaches its gradient and the optimizer through the forward ops, the loss and the
    backward ops it poisoned, not along the shortcut from a parameter to its gradient node. Empty when the
    step has no statistics or ``origin`` is not in it."""
    from .flow import flow_rank

    try:
        table = session.table(idx)
    except KeyError:
        return {}
    bad = _bad_rows(table)
    by_node: dict[str, list[int]] = {}
    for i, (node, _slot) in enumerate(table.keys):
        by_node.setdefault(node, []).append(i)
    if origin not in by_node:
        return {}
    graph = session.graph
    rank = flow_rank(graph)
    if origin not in rank:
        return {origin: origin}
    start = rank[origin]
    names = sorted((n for n in by_node if rank.get(n, -1) >= start), key=rank.__getitem__)
    length = {origin: 0}
    prev = {origin: origin}
    for u in names:
        if u not in length or not _bad_outputs(table, by_node[u], bad):
            continue
        pair = graph.nodes[u].pair if u in graph.nodes else None
        for v in (*graph.successors(u), *((pair,) if pair in by_node and graph.nodes[u].section == "forward"
                                          else ())):
            if v in by_node and rank.get(v, -1) > rank[u] and length[u] + 1 > length.get(v, -1):
                length[v] = length[u] + 1
                prev[v] = u
    return prev

