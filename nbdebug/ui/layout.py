"""Scope-collapsed, left-to-right layout of the executed graph (pure Python, no plotly).

Only the visible part of the scope tree is laid out: a scope that is not expanded is one box,
however many nodes it holds. Scopes are keyed per graph section, so the forward ``fc1`` and the
backward ``fc1`` are separate boxes (``"forward:fc1"``, ``"backward:fc1"``).

* ``x`` is the rank of an item in execution order (``node.order``; a box takes the first order of
  its members) among the visible items, so the picture reads left to right as the step ran;
* ``y`` is a lane: inside every expanded scope its children are packed into the lowest free lanes
  (a child never overlaps another child whose x-range it shares), below a header row that carries
  the scope's label. Nested scopes are packed recursively, so every expanded scope is a rectangle
  that contains exactly its visible descendants.

>>> from nbdebug.session.graph import Graph
>>> g = Graph()
>>> for i, (name, scope) in enumerate([("a", "enc"), ("b", "enc/l1"), ("c", "enc/l1"), ("d", "")]):
...     g.add_node(name, kind="op", op_type="op", scope=scope).order = i
>>> g.add_edge("a", "b"); g.add_edge("c", "d")
>>> lay = compute_layout(g)                         # everything collapsed
>>> [(it.key, it.kind, it.count) for it in lay.items]
[('forward:enc', 'scope', 3), ('d', 'node', 1)]
>>> lay.edges
[(0, 1)]
>>> lay = compute_layout(g, {"forward:enc"})        # one level open
>>> [(it.key, it.x) for it in lay.items]
[('a', 0), ('forward:enc/l1', 1), ('d', 2)]
>>> [b.key for b in lay.boxes]
['forward:enc']
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Colour classes of graph items (what the legend shows).
NODE_CLASSES: tuple[str, ...] = ("op", "module", "parameter", "gradient", "optimizer", "input", "scope")


def node_class(node: Any) -> str:
    """Colour class of a graph node: optimizer and backward sections first, then its kind.

    >>> from nbdebug.session.graph import Node
    >>> node_class(Node("Module.fc.Linear.backward.0", "module", "Linear", section="backward"))
    'gradient'
    """
    section = getattr(node, "section", "forward")
    if section == "optimizer":
        return "optimizer"
    if section == "backward":
        return "gradient"
    kind = getattr(node, "kind", "op")
    if kind in ("parameter", "module", "op"):
        return kind
    return "input"  # input and constant


def scope_key(section: str, scope: str) -> str:
    """Key of a scope box: ``"section:a/b"``."""
    return f"{section}:{scope}"


def split_scope_key(key: str) -> tuple[str, str]:
    section, _, scope = key.partition(":")
    return section, scope


def short_label(node: Any) -> str:
    """A short label for a node in the picture (its full name is in the hover text).

    >>> from nbdebug.session.graph import Node
    >>> short_label(Node("Parameter.fc1.weight", "parameter", "Parameter")), short_label(
    ...     Node("Module.fc1.Linear.forward.0", "module", "Linear"))
    ('weight', 'fc1.Linear')
    """
    name = node.name
    if node.kind == "parameter" and name.startswith("Parameter."):
        return name.rsplit(".", 1)[-1]
    if name.startswith("Module."):
        parts = name.split(".")
        # Module.<path...>.<Class>.<forward|backward|parameters_grad>.<n>
        body = parts[1:-2] if len(parts) >= 4 else parts[1:]
        label = ".".join(body[-2:]) if body else node.op_type
        return label + (" grad" if "parameters_grad" in parts else "")
    return node.op_type or name


@dataclass
class Item:
    """A visible thing in the picture: a node, or a collapsed scope holding ``count`` nodes."""

    key: str
    kind: str  # "node" or "scope"
    label: str
    cls: str
    order: int
    section: str
    parent: str | None  # key of the expanded scope box it sits in (None: the section's root)
    count: int = 1
    x: int = 0
    y: int = 0


@dataclass
class Box:
    """An expanded scope: a rectangle around its visible descendants, label row at ``y0``."""

    key: str
    label: str
    depth: int
    x0: int = 0
    x1: int = 0
    y0: int = 0
    y1: int = 0  # last row (inclusive)
    count: int = 0


@dataclass
class Layout:
    """The visible items (``x``/``y`` set), expanded scope boxes, and item-level edges."""

    items: list[Item]
    boxes: list[Box]
    edges: list[tuple[int, int]]
    #: item key -> index in ``items``
    index: dict[str, int]
    #: node name -> index of the item that shows it (the node or its collapsed scope)
    of_node: dict[str, int] = field(default_factory=dict)

    @property
    def width(self) -> int:
        return max((it.x for it in self.items), default=0) + 1

    @property
    def height(self) -> int:
        return max([it.y for it in self.items] + [b.y1 for b in self.boxes], default=0) + 1


def scope_chain(section: str, scope: str) -> list[str]:
    """Keys of every scope box from the outermost down to ``scope`` itself.

    >>> scope_chain("forward", "a/b/c")
    ['forward:a', 'forward:a/b', 'forward:a/b/c']
    """
    parts = [p for p in scope.split("/") if p]
    return [scope_key(section, "/".join(parts[: i + 1])) for i in range(len(parts))]


def _container(section: str, scope: str, expanded: set[str]) -> tuple[str | None, str | None]:
    """(collapsed box key or None, deepest expanded ancestor key or None) for a node in ``scope``."""
    parent = None
    for key in scope_chain(section, scope):
        if key not in expanded:
            return key, parent
        parent = key
    return None, parent


def compute_layout(graph: Any, expanded: Iterable[str] = (), nodes: Iterable[Any] | None = None) -> Layout:
    """Lay out ``graph`` (or only ``nodes`` of it) with the scope boxes in ``expanded`` open."""
    exp = set(expanded)
    cache: dict[tuple[str, str], tuple[str | None, str | None]] = {}
    items: list[Item] = []
    index: dict[str, int] = {}
    of_node: dict[str, int] = {}
    # snapshots: the training thread may add nodes and edges while a view lays them out
    src = list(graph.nodes.values()) if nodes is None else list(nodes)
    big = 1 << 60
    for node in src:
        sec = node.section
        ck = (sec, node.scope)
        hit = cache.get(ck)
        if hit is None:
            hit = cache[ck] = _container(sec, node.scope, exp)
        box, parent = hit
        order = node.order if node.order >= 0 else big
        if box is None:
            i = index[node.name] = len(items)
            items.append(Item(node.name, "node", short_label(node), node_class(node), order, sec, parent))
        else:
            i = index.get(box, -1)
            if i < 0:
                i = index[box] = len(items)
                label = box.rsplit("/", 1)[-1].split(":", 1)[-1]
                items.append(Item(box, "scope", label, "scope", order, sec, parent, 0))
            it = items[i]
            it.count += 1
            if order < it.order:
                it.order = order
        of_node[node.name] = i

    ranked = sorted(range(len(items)), key=lambda i: (items[i].order, items[i].key))
    for x, i in enumerate(ranked):
        items[i].x = x

    # item-level edges (deduplicated, no self loops)
    seen: set[tuple[int, int]] = set()
    for (s, d) in list(graph.edges):
        a = of_node.get(s)
        b = of_node.get(d)
        if a is None or b is None or a == b:
            continue
        seen.add((a, b))
    edges = sorted(seen)

    boxes = _pack(items, exp)
    return Layout(items, boxes, edges, index, of_node)


class _Block:
    __slots__ = ("key", "children", "blocks", "x0", "x1", "h", "offsets", "depth", "count")

    def __init__(self, key: str, depth: int) -> None:
        self.key = key
        self.depth = depth
        self.children: list[int] = []  # item indices
        self.blocks: list[_Block] = []
        self.x0 = self.x1 = 0
        self.h = 1
        self.offsets: list[tuple[Any, int]] = []
        self.count = 0


def _section_rank(section: str) -> int:
    order = ("forward", "backward", "optimizer")
    return order.index(section) if section in order else len(order)


def _pack(items: list[Item], expanded: set[str]) -> list[Box]:
    """Assign lanes (``y``) to items and return the expanded scope boxes."""
    roots: dict[str, _Block] = {}
    blocks: dict[str, _Block] = {}

    def block(key: str | None, section: str) -> _Block:
        if key is None:
            b = roots.get(section)
            if b is None:
                b = roots[section] = _Block("", 0)
            return b
        b = blocks.get(key)
        if b is None:
            sec, scope = split_scope_key(key)
            chain = scope_chain(sec, scope)
            b = blocks[key] = _Block(key, len(chain))
            parent = chain[-2] if len(chain) > 1 else None
            block(parent, sec).blocks.append(b)
        return b

    for i, it in enumerate(items):
        block(it.parent, it.section).children.append(i)

    def measure(b: _Block) -> None:
        for c in b.blocks:
            measure(c)
        kids: list[tuple[int, int, int, Any]] = [(items[i].x, items[i].x, 1, i) for i in b.children]
        kids += [(c.x0, c.x1, c.h, c) for c in b.blocks]
        kids.sort(key=lambda k: (k[0], k[1]))
        top = 0 if b.key == "" else 1  # header row for a scope box
        active: list[tuple[int, int, int]] = []  # (x1, y0, y1 exclusive)
        offsets = []
        lo = hi = None
        height = top
        count = len(b.children)
        for x0, x1, h, ref in kids:
            active = [a for a in active if a[0] >= x0]
            y = top
            for _, a0, a1 in sorted(active, key=lambda a: a[1]):
                if y + h <= a0:
                    break
                y = max(y, a1)
            active.append((x1, y, y + h))
            offsets.append((ref, y))
            height = max(height, y + h)
            lo = x0 if lo is None else min(lo, x0)
            hi = x1 if hi is None else max(hi, x1)
            if isinstance(ref, _Block):
                count += ref.count
        b.offsets = offsets
        b.h = height
        b.x0 = lo if lo is not None else 0
        b.x1 = hi if hi is not None else 0
        b.count = count

    out: list[Box] = []

    def place(b: _Block, y0: int) -> None:
        if b.key:
            label = b.key.rsplit("/", 1)[-1].split(":", 1)[-1]
            out.append(Box(b.key, label, b.depth, b.x0, b.x1, y0, y0 + b.h - 1, b.count))
        for ref, dy in b.offsets:
            if isinstance(ref, _Block):
                place(ref, y0 + dy)
            else:
                items[ref].y = y0 + dy

    # the section roots are packed like the children of one more block (they rarely share x-ranges)
    top = _Block("", 0)
    top.blocks = [roots[s] for s in sorted(roots, key=_section_rank)]
    measure(top)
    place(top, 0)
    out.sort(key=lambda b: (b.depth, b.x0, b.key))
    return out
