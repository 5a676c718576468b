"""The executed computational graph: nodes with stable names, data-flow edges and a scope tree.

Nodes are keyed by their msProbe-style name (``Module.fc1.Linear.forward.0``,
``Functional.linear.0.forward``, ``Parameter.fc1.weight`` ...). The same op executed in step k and
k+1 has the same name, so a node here stands for "that op, in every step"; ``order`` is its
position in the most recent step it ran in. Edges follow tensor identity from producer to consumer.

>>> g = Graph()
>>> _ = g.add_node("Parameter.fc.weight", kind="parameter", op_type="Parameter", scope="fc")
>>> _ = g.add_node("Functional.linear.0.forward", kind="op", op_type="linear", scope="fc")
>>> g.add_edge("Parameter.fc.weight", "Functional.linear.0.forward", "output.0", "input.1")
>>> sorted(g.to_networkx().nodes)
['Functional.linear.0.forward', 'Parameter.fc.weight']
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

SECTIONS = ("forward", "backward", "optimizer")
KINDS = ("op", "module", "parameter", "input", "constant")


@dataclass
class Node:
    """One executed op, module call, parameter, input or constant."""

    name: str
    kind: str
    op_type: str
    scope: str = ""
    section: str = "forward"
    order: int = -1
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)
    stack: list[str] = field(default_factory=list)
    #: name of the forward node a backward node mirrors (and vice versa)
    pair: str | None = None
    #: the graph file a kernel node comes from (MindSpore GRAPH mode), for the panel's filter
    graph: str | None = None
    #: the call site an op name last stood for (adapter-defined key: scope + code location); when the
    #: same name later stands for another call site (an op that runs in some steps only shifts the
    #: counters), the node's scope and stack follow it and ``moved`` lists the steps where that happened
    site: Any = field(default=None, repr=False, compare=False)
    moved: list[int] = field(default_factory=list, repr=False, compare=False)

    @property
    def scope_path(self) -> tuple[str, ...]:
        return tuple(p for p in self.scope.split("/") if p)


class Graph:
    """Union of everything executed so far, with the latest execution order."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        #: (src, dst) -> list of (src_slot, dst_slot)
        self.edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
        self._succ: dict[str, set[str]] = {}
        self._pred: dict[str, set[str]] = {}
        self.version = 0  # bumped on every structural change; views use it to skip relayouts

    def __contains__(self, name: object) -> bool:
        return name in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        """The nodes as of now: a snapshot, so a loop over the graph on another thread (the remote agent's, the
        notebook's) is not broken by the training thread adding a node meanwhile."""
        return iter(list(self.nodes.values()))

    def __getitem__(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in the graph ({len(self.nodes)} nodes)") from None

    def add_node(self, name: str, *, kind: str, op_type: str, scope: str = "", section: str = "forward",
                 stack: list[str] | None = None, pair: str | None = None) -> Node:
        """Add a node (or return the existing one with that name)."""
        node = self.nodes.get(name)
        if node is None:
            if kind not in KINDS:
                raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
            if section not in SECTIONS:
                raise ValueError(f"section must be one of {SECTIONS}, got {section!r}")
            node = Node(name, kind, op_type, scope, section, stack=stack or [], pair=pair)
            self.nodes[name] = node
            self.version += 1
        return node

    def add_edge(self, src: str, dst: str, src_slot: str = "", dst_slot: str = "") -> None:
        if src == dst:
            return
        key = (src, dst)
        slots = self.edges.get(key)
        if slots is None:
            self.edges[key] = [(src_slot, dst_slot)]
            self._succ.setdefault(src, set()).add(dst)
            self._pred.setdefault(dst, set()).add(src)
            self.version += 1
        elif (src_slot, dst_slot) not in slots:
            slots.append((src_slot, dst_slot))

    def successors(self, name: str) -> set[str]:
        return set(self._succ.get(name, ()))

    def predecessors(self, name: str) -> set[str]:
        return set(self._pred.get(name, ()))

    def in_order(self, names: Iterable[str] | None = None) -> list[Node]:
        """Nodes sorted by execution order (forward, backward, optimizer of the latest step)."""
        nodes = self.nodes.values() if names is None else (self.nodes[n] for n in names)
        return sorted(nodes, key=lambda n: (n.order < 0, n.order, n.name))

    def neighbourhood(self, name: str, hops: int = 1) -> tuple[set[str], set[str]]:
        """Names of the nodes up to ``hops`` edges upstream and downstream of ``name``."""
        up: set[str] = set()
        down: set[str] = set()
        for seen, step in ((up, self._pred), (down, self._succ)):
            frontier = {name}
            for _ in range(hops):
                frontier = {m for n in frontier for m in tuple(step.get(n, ()))} - seen - {name}
                seen |= frontier
        return up, down

    def scope_tree(self) -> dict[str, Any]:
        """Nested dict: scope part -> subtree; leaves under the key ``"__nodes__"`` (names)."""
        root: dict[str, Any] = {"__nodes__": []}
        for node in self.nodes.values():
            d = root
            for part in node.scope_path:
                d = d.setdefault(part, {"__nodes__": []})
            d["__nodes__"].append(node.name)
        return root

    def to_networkx(self):
        """Export as ``networkx.DiGraph`` keyed by node name.

        Node attributes: ``op_type``, ``scope``, ``section``, ``kind``, ``shapes``, ``order``.
        Edge attribute ``slots``: list of (producer slot, consumer slot).
        """
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes.values():
            g.add_node(n.name, op_type=n.op_type, scope=n.scope, section=n.section, kind=n.kind,
                       shapes=dict(n.shapes), order=n.order)
        for (src, dst), slots in self.edges.items():
            g.add_edge(src, dst, slots=list(slots))
        return g
