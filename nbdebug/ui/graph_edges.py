"""The edges the graph view is sent and the node details list: the graph's recorded edges plus the *output
edges* of module calls, one data set for both, so a node's *Consumers* are the edges the graph has out of it.

At ``mix`` a module call (``Module.fc.Linear.forward.0``) and the ops it ran are both recorded. The call gets
the edges into it (its inputs' producers), but its outputs are tensors that its ops made, so the graph
records their consumers as consumers of those ops, not of the call. The graph view draws the call as its
scope's box, and every edge that leaves the box starts at the box: an edge from a node inside a scope to a
node outside it (same section) is also an edge out of the scope's call, ``(call, consumer)``, and out of the
call of every enclosing scope it leaves. When a module ran several times in a step, the call is the first
one recorded after the node (a call is recorded when it returns). The call's slot on such an edge is its
only output slot; with several outputs it is left empty (which output carried the tensor is not recorded).

>>> from nbdebug.session.graph import Graph
>>> from nbdebug.ui.graph_data import ScopeIndex
>>> g = Graph()
>>> for i, (name, kind, scope) in enumerate([("Functional.linear.0.forward", "op", "fc"),
...         ("Module.fc.Linear.forward.0", "module", ""), ("Functional.relu.0.forward", "op", "")]):
...     g.add_node(name, kind=kind, op_type=name.split(".")[1], scope=scope).order = i
>>> g["Module.fc.Linear.forward.0"].shapes["output.0"] = (4, 2)
>>> g.add_edge("Functional.linear.0.forward", "Functional.relu.0.forward", "output.0", "input.0")
>>> edges = DrawnEdges(g, ScopeIndex(g))
>>> edges.extra
{('Module.fc.Linear.forward.0', 'Functional.relu.0.forward'): [('output.0', 'input.0')]}
>>> edges.consumers("Module.fc.Linear.forward.0")
{'Functional.relu.0.forward': [('output.0', 'input.0')]}
>>> sorted(edges.producers("Functional.relu.0.forward"))
['Functional.linear.0.forward', 'Module.fc.Linear.forward.0']
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any

Slots = list[tuple[str, str]]


def _parent(key: str) -> str | None:
    section, _, path = key.partition(":")
    return f"{section}:{path.rpartition('/')[0]}" if path else None


def _inside(key: str, scope: str) -> bool:
    """Whether scope key ``key`` is ``scope`` or a scope inside it (same section)."""
    if scope.endswith(":"):
        return key.startswith(scope)
    return key == scope or key.startswith(scope + "/")


def _call_slot(call: Any) -> str:
    outs = [s for s in call.shapes if s.startswith("output")]
    return outs[0] if len(outs) == 1 else ""


def output_edges(graph: Any, idx: Any) -> dict[tuple[str, str], Slots]:
    """``(call, consumer) -> [(call slot, consumer slot)]`` for the edges leaving a module call's box that
    the graph records from a node inside it; ``idx`` is the graph's ``ScopeIndex`` (``key_of``, ``calls``)."""
    calls: dict[str, list[str]] = idx.calls
    out: dict[tuple[str, str], Slots] = {}
    if not calls:
        return out
    nodes = graph.nodes
    orders = {k: [nodes[c].order for c in names] for k, names in calls.items()}
    for (u, v), slots in list(graph.edges.items()):
        ku, kv = idx.key_of.get(u), idx.key_of.get(v)
        if ku is None or kv is None or ku.partition(":")[0] != kv.partition(":")[0]:
            continue  # edges between sections are not drawn
        k: str | None = ku
        while k is not None and not _inside(kv, k):
            names = calls.get(k)
            if names and u not in names:
                o = nodes[u].order
                i = bisect_right(orders[k], o) if o >= 0 else len(names)
                call = names[min(i, len(names) - 1)]
                got = out.setdefault((call, v), [])
                for _src_slot, dst_slot in slots:
                    pair = (_call_slot(nodes[call]), dst_slot)
                    if pair not in got:
                        got.append(pair)
            k = _parent(k)
    return out


class DrawnEdges:
    """One graph state's edges as the graph view is sent them: recorded edges plus :func:`output_edges`
    (``extra``), with each node's producers and consumers (``name -> [(src slot, dst slot)]``)."""

    def __init__(self, graph: Any, idx: Any) -> None:
        self.graph = graph
        self.extra = output_edges(graph, idx)
        self._out: dict[str, dict[str, Slots]] = {}
        self._in: dict[str, dict[str, Slots]] = {}
        for (a, b), slots in self.extra.items():
            self._out.setdefault(a, {})[b] = slots
            self._in.setdefault(b, {})[a] = slots

    def pairs(self) -> list[tuple[str, str]]:
        """Every edge ``(src, dst)``: the recorded ones, then the output edges that are not recorded."""
        recorded = list(self.graph.edges)
        seen = set(recorded)
        return recorded + [e for e in self.extra if e not in seen]

    def consumers(self, name: str) -> dict[str, Slots]:
        g = self.graph
        out = {c: list(g.edges.get((name, c), ())) for c in g.successors(name)}
        for c, slots in self._out.get(name, {}).items():
            out.setdefault(c, []).extend(s for s in slots if s not in out[c])
        return out

    def producers(self, name: str) -> dict[str, Slots]:
        g = self.graph
        out = {p: list(g.edges.get((p, name), ())) for p in g.predecessors(name)}
        for p, slots in self._in.get(name, {}).items():
            out.setdefault(p, []).extend(s for s in slots if s not in out[p])
        return out
