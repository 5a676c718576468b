"""The node list: the scope tree with filters by graph section (or graph file) and node type, and search.

One ``Select`` widget shows the rows (a tree of scopes, collapsed by default, or the search results),
so a 50k-node graph costs one widget and at most :data:`MAX_ROWS` rows. Choosing a scope row opens or
closes it; choosing a node row selects the node (and the panel reveals it in the graph).

The tree is the graph view's: section roots (``forward``, ``backward``, ``optimizer``; open at first), module
scopes inside them, optimizer ops grouped per parameter, and each scope's count computed by the same
:func:`~nbdebug.ui.graph_data.scope_counts` over the listed nodes — with no type filter, the numbers
the graph shows (see :mod:`nbdebug.ui.graph_data` for what a count counts).

Filters: ``section`` is ``"all"``, ``"forward"``, ``"backward"``, ``"optimizer"`` or ``"graph:<name>"``
(for nodes with a ``graph`` attribute, e.g. MindSpore graph files); ``node_type`` is ``"all"``,
``"kind:<kind>"`` or ``"op:<op_type>"``. Search is a case-insensitive substring, or a regular expression
when the "regex" box is ticked (an invalid one shows the ``re`` error and keeps the list as it was).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..session.graph import KINDS, SECTIONS
from .graph_data import ROOTS, ScopeIndex, key_chain, parent_key, scope_counts, scope_label
from .source import SourceView

MAX_ROWS = 1000
INDENT = "\u00a0\u00a0\u00a0"


class NodeList:
    """Scope tree + filters + search; ``on_select(name)`` is called when a node row is chosen."""

    def __init__(self, source: SourceView, on_select: Callable[[str], Any] = lambda name: None) -> None:
        self.source = source
        self.on_select = on_select
        self.expanded: set[str] = set(ROOTS)  # open scope keys ("forward:a/b"); the section roots start open
        self._index: ScopeIndex | None = None
        self._index_version: Any = None
        self._version: Any = None
        self._rows: list[tuple[str, str]] = []
        self._quiet = False
        self.section = w.Dropdown(options=[("All sections", "all")], value="all", description="Section",
                                  layout=w.Layout(width="auto"), _dom_classes=("nbdebug-node-section",))
        self.node_type = w.Dropdown(options=[("All types", "all")], value="all", description="Type",
                                    layout=w.Layout(width="auto"), _dom_classes=("nbdebug-node-type",))
        self.search = w.Text(placeholder="search node names", continuous_update=False,
                             layout=w.Layout(width="auto"), _dom_classes=("nbdebug-node-search",))
        self.regex = w.Checkbox(value=False, description="regex", indent=False, layout=w.Layout(width="70px"),
                                _dom_classes=("nbdebug-node-regex",))
        self.message = w.HTML("", _dom_classes=("nbdebug-node-message",))
        self.rows = w.Select(options=[], rows=14, layout=w.Layout(width="100%"), _dom_classes=("nbdebug-node-list",))
        for wid in (self.section, self.node_type, self.search, self.regex):
            wid.observe(lambda ch: self.refresh(force=True), names="value")
        self.rows.observe(self._chosen, names="value")
        self.widget = w.VBox([w.HTML("<b>Nodes</b>"), self.section, self.node_type,
                              w.HBox([self.search, self.regex]), self.message, self.rows],
                              _dom_classes=("nbdebug-nodes",))
        self.refresh()

    # -- filters ----------------------------------------------------------------------------------
    def _filter_options(self) -> None:
        nodes = list(self.source.graph.nodes.values())  # snapshot: training may add nodes meanwhile
        graphs = sorted({str(g) for g in (getattr(n, "graph", None) for n in nodes) if g is not None})
        present = {n.section for n in nodes}
        secs = [("All sections", "all")] + [(s, s) for s in SECTIONS if s in present]
        secs += [(f"graph {g}", f"graph:{g}") for g in graphs]
        kinds = sorted({n.kind for n in nodes}, key=lambda k: KINDS.index(k) if k in KINDS else 99)
        ops = sorted({n.op_type for n in nodes if n.op_type})
        types = [("All types", "all")] + [(f"kind: {k}", f"kind:{k}") for k in kinds]
        types += [(f"type: {o}", f"op:{o}") for o in ops]
        self._quiet = True
        try:
            _set_options(self.section, secs)
            _set_options(self.node_type, types)
        finally:
            self._quiet = False

    def matches(self) -> Callable[[Any], bool]:
        """The filter predicate built from the section and type dropdowns."""
        sec = self.section.value
        typ = self.node_type.value
        tests: list[Callable[[Any], bool]] = []
        if sec.startswith("graph:"):
            g = sec[6:]
            tests.append(lambda n: str(getattr(n, "graph", None)) == g)
        elif sec != "all":
            tests.append(lambda n: n.section == sec)
        if typ.startswith("kind:"):
            k = typ[5:]
            tests.append(lambda n: n.kind == k)
        elif typ.startswith("op:"):
            o = typ[3:]
            tests.append(lambda n: n.op_type == o)
        return lambda n: all(t(n) for t in tests)

    # -- rows -------------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        graph = self.source.graph
        version = (graph.version, len(graph))
        if version == self._version and not force:
            return
        if self._quiet:
            return
        if version != self._version:
            self._filter_options()
        self._version = version
        keep = self.rows.value
        rows, note = self._search_rows() if self.search.value.strip() else self._tree_rows()
        self._rows = rows
        self.message.value = note
        self._quiet = True
        try:
            self.rows.options = [(label, value) for label, value in rows]
            values = {v for _, v in rows}
            self.rows.value = keep if keep in values else None
        finally:
            self._quiet = False

    def _search_rows(self) -> tuple[list[tuple[str, str]], str]:
        text = self.search.value.strip()
        if self.regex.value:
            try:
                pat = re.compile(text, re.IGNORECASE)
            except re.error as e:
                return self._rows, f"<span class='nbdebug-error' style='color:#cf222e'>invalid regex: {e}</span>"
            test = pat.search
        else:
            low = text.lower()
            test = lambda s: low in s.lower()  # noqa: E731
        keep = self.matches()
        found = [n for n in list(self.source.graph.nodes.values()) if test(n.name) and keep(n)]
        found.sort(key=lambda n: (n.order < 0, n.order, n.name))
        rows = [(f"{n.name}  [{n.op_type}]", f"n:{n.name}") for n in found[:MAX_ROWS]]
        note = f"{len(found)} match{'es' if len(found) != 1 else ''}"
        if len(found) > MAX_ROWS:
            note += f", first {MAX_ROWS} shown"
        return rows, note

    def scope_index(self) -> ScopeIndex:
        """Scope keys of the nodes (the graph view's: per section, optimizer ops grouped per parameter)."""
        graph = self.source.graph
        if self._index is None or self._index_version != (id(graph), graph.version, len(graph)):
            self._index = ScopeIndex(graph)
            self._index_version = (id(graph), graph.version, len(graph))
        return self._index

    def _tree_rows(self) -> tuple[list[tuple[str, str]], str]:
        keep = self.matches()
        key_of = self.scope_index().key_of
        nodes = [n for n in list(self.source.graph.nodes.values()) if keep(n) and n.name in key_of]
        counts = scope_counts(key_of[n.name] for n in nodes)  # the graph's counts, over the nodes listed
        first: dict[str, int] = {}
        children: dict[str, list[str]] = {}
        leaves: dict[str, list[Any]] = {}
        big = 1 << 60
        for n in nodes:
            k = key_of[n.name]
            leaves.setdefault(k, []).append(n)
            order = n.order if n.order >= 0 else big
            for c in key_chain(k):
                if order < first.get(c, big + 1):
                    first[c] = order
        for k in counts:
            p = parent_key(k)
            if p is not None:
                children.setdefault(p, []).append(k)
        rows: list[tuple[str, str]] = []
        truncated = [False]

        def walk(key: str, depth: int) -> None:
            items: list[tuple[int, str, Any]] = [(first.get(c, big), "s", c) for c in children.get(key, [])]
            items += [(n.order if n.order >= 0 else big, "n", n) for n in leaves.get(key, [])]
            items.sort(key=lambda it: (it[0], it[1], it[2] if it[1] == "s" else it[2].name))
            for _, kind, ref in items:
                if len(rows) >= MAX_ROWS:
                    truncated[0] = True
                    return
                pad = INDENT * depth
                if kind == "s":
                    is_open = ref in self.expanded
                    rows.append((f"{pad}{'▾' if is_open else '▸'} {scope_label(ref)} ({counts[ref]})", f"s:{ref}"))
                    if is_open:
                        walk(ref, depth + 1)
                else:
                    rows.append((f"{pad}• {ref.name}", f"n:{ref.name}"))

        for root in ROOTS:
            if root in counts:
                is_open = root in self.expanded
                rows.append((f"{'▾' if is_open else '▸'} {scope_label(root)} ({counts[root]})", f"s:{root}"))
                if is_open:
                    walk(root, 1)
        total = len(nodes)
        note = f"{total} node{'s' if total != 1 else ''}"
        if truncated[0]:
            note += f"; first {MAX_ROWS} rows shown — close scopes or search"
        return rows, note

    # -- choosing ---------------------------------------------------------------------------------
    def _chosen(self, change: dict[str, Any]) -> None:
        if self._quiet or change["new"] is None:
            return
        value = change["new"]
        if value.startswith("s:"):
            self.toggle(value[2:])
        else:
            self.on_select(value[2:])

    def toggle(self, scope: str) -> None:
        """Open or close scope ``scope`` (``"forward:block/lin"``) in the list."""
        if scope in self.expanded:
            inner = scope if scope.endswith(":") else scope + "/"
            self.expanded = {s for s in self.expanded if s != scope and not s.startswith(inner)}
        else:
            self.expanded.update(key_chain(scope))
        self.refresh(force=True)
        self._quiet = True
        try:
            self.rows.value = None  # so that choosing the same scope row again closes it
        finally:
            self._quiet = False

    def choose(self, value: str) -> None:
        """Choose a row as a click does: ``"n:<node name>"`` or ``"s:<scope key>"``."""
        if value not in {v for _, v in self._rows}:
            raise KeyError(f"{value!r} is not a row of the node list now")
        self.rows.value = value

    def show(self, name: str) -> None:
        """Open the scopes of node ``name`` and highlight its row (without calling ``on_select``)."""
        if name not in self.source.graph.nodes:
            return
        key = self.scope_index().key_of.get(name)
        if key is not None:
            self.expanded.update(key_chain(key))
        self.refresh(force=True)
        self._quiet = True
        try:
            self.rows.value = f"n:{name}" if f"n:{name}" in {v for _, v in self._rows} else None
        finally:
            self._quiet = False

    @property
    def row_values(self) -> list[str]:
        return [v for _, v in self._rows]


def _set_options(dd: w.Dropdown, options: list[tuple[str, str]]) -> None:
    if list(dd.options) == options:
        return
    keep = dd.value
    dd.options = options
    dd.value = keep if keep in {v for _, v in options} else options[0][1]
