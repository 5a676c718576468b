"""The graph view's data: the ``graph`` / ``delta`` / ``marks`` / ``card`` messages of ``frontend/PROTOCOL.md``
built from a source's Graph, hits and state (pure Python, no widgets).

**Scopes.** Every node sits in one scope key ``"section:a/b"``: its section and its module scope as the
graph recorded it (backward nodes keep their module scopes: ``"backward:fc1"``). Optimizer ops are grouped
per parameter instead (``"optimizer:fc1.weight"``, see :func:`optimizer_params` for the rule); ops tied to
no single parameter (``Optimizer.SGD.step.0``, a ``_foreach`` op over every parameter) stay at the top of
the optimizer section (``"optimizer:"``). A module call node (``Module.fc1.Linear.forward.0``) sits where the
graph puts it, in the scope *around* its module (here ``"forward:"``); the scope row of ``"forward:fc1"``
points at it as its module node.

**Edges.** The graph's edges and module calls' output edges (:mod:`.graph_edges`): the node details list the
same producers and consumers.

**Counts.** A scope's count is the number of nodes whose scope key is that scope or a scope inside it (all
depths, one section). :func:`scope_counts` computes it; the graph view and the node list both call it,
so the two always show the same number for the same scope and the same nodes.

>>> from nbdebug.session.graph import Graph
>>> g = Graph()
>>> for i, (name, kind, scope, section) in enumerate([
...         ("Parameter.fc.weight", "parameter", "fc", "forward"),
...         ("Functional.linear.0.forward", "op", "fc", "forward"),
...         ("Module.fc.Linear.forward.0", "module", "", "forward"),
...         ("Module.fc.Linear.parameters_grad.0", "parameter", "", "backward"),
...         ("Tensor.add_.0.forward", "op", "optimizer", "optimizer")]):
...     g.add_node(name, kind=kind, op_type=name.split(".")[1], scope=scope, section=section).order = i
>>> g.add_edge("Parameter.fc.weight", "Functional.linear.0.forward", "output.0", "input.1")
>>> g.add_edge("Module.fc.Linear.parameters_grad.0", "Tensor.add_.0.forward", "weight", "input.1")
>>> idx = ScopeIndex(g)
>>> idx.key_of["Tensor.add_.0.forward"], idx.counts["forward:fc"], idx.counts["forward:"]
('optimizer:fc.weight', 3, 3)
>>> feed = GraphFeed()
>>> msg = feed.full(g)
>>> [row[0] for row in msg["scopes"]]
['forward:', 'backward:', 'optimizer:', 'forward:fc', 'optimizer:fc.weight']
>>> msg["scopes"][3]      # key, parent, label, section, module node id, count (the call is in its box)
['forward:fc', 'forward:', 'fc', 'forward', 2, 3]
>>> msg["nodes"][1]       # name, label, cls, scope, op_type, order, shape, dtype
['Functional.linear.0.forward', 'linear', 'op', 'forward:fc', 'linear', 1, '', '']
>>> msg["edges"]
[0, 1, 3, 4]
>>> _ = g.add_node("Functional.relu.0.forward", kind="op", op_type="relu", scope="fc")
>>> g.add_edge("Functional.linear.0.forward", "Functional.relu.0.forward")
>>> d = feed.update(g)
>>> d["type"], d["base"], [r[0] for r in d["nodes"]], d["edges"], [s[0] for s in d["scopes"]]
('delta', 1, ['Functional.relu.0.forward'], [1, 5], ['forward:', 'forward:fc'])
>>> feed.update(g) is None       # nothing new
True
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from ..frameworks.registry import module_prefixes
from ..watch.nonfinite import nonfinite_path
from .graph_edges import DrawnEdges
from .layout import node_class, short_label
from .tensor_math import fmt

SECTIONS = ("forward", "backward", "optimizer")
ROOTS = tuple(f"{s}:" for s in SECTIONS)


# -- scope keys --------------------------------------------------------------------------------------

def parent_key(key: str) -> str | None:
    """The enclosing scope key (None for a section root).

    >>> parent_key("forward:a/b"), parent_key("forward:a"), parent_key("forward:")
    ('forward:a', 'forward:', None)
    """
    section, _, scope = key.partition(":")
    if not scope:
        return None
    head, sep, _ = scope.rpartition("/")
    return f"{section}:{head}" if sep else f"{section}:"


def key_chain(key: str) -> list[str]:
    """Every scope key from the section root down to ``key``.

    >>> key_chain("backward:a/b")
    ['backward:', 'backward:a', 'backward:a/b']
    """
    out = [key]
    p = parent_key(key)
    while p is not None:
        out.append(p)
        p = parent_key(p)
    return out[::-1]


def scope_counts(keys: Iterable[str]) -> dict[str, int]:
    """Count of nodes under each scope (all depths), from the scope keys of the nodes; section roots too.

    The one place a scope count is computed: the graph's scope rows and the node list's scope rows.

    >>> scope_counts(["forward:fc1", "forward:fc1", "forward:", "forward:blk/lin", "backward:fc1"])
    {'forward:': 4, 'forward:fc1': 2, 'forward:blk': 1, 'forward:blk/lin': 1, 'backward:': 1, 'backward:fc1': 1}
    """
    direct: dict[str, int] = {}
    for k in keys:
        direct[k] = direct.get(k, 0) + 1
    out: dict[str, int] = {}
    for k, n in direct.items():
        for c in key_chain(k):
            out[c] = out.get(c, 0) + n
    return out


# -- optimizer grouping ------------------------------------------------------------------------------

def _param_of_anchor(name: str, slot: str) -> str | None:
    """The parameter a neighbour stands for: ``Parameter.<p>`` is ``p``; the ``<s>`` slot of
    ``Module.<path>.<Class>.parameters_grad.<n>`` (``Cell.…``) is ``<path>.<s>``."""
    if name.startswith("Parameter."):
        return name[len("Parameter."):]
    parts = name.split(".")
    if parts[0] in module_prefixes() and len(parts) >= 5 and parts[-2] == "parameters_grad" and slot:
        return ".".join(parts[1:-3] + [slot])
    return None


def optimizer_params(graph: Any) -> dict[str, str]:
    """Optimizer node name -> the parameter it updates (``""``: none, or several).

    The rule, in order:

    1. *direct*: the parameters of the node's neighbours outside the optimizer (``Parameter.<p>`` nodes
       and the ``<slot>`` of ``Module.<path>.<Class>.parameters_grad.<n>`` edges) — one parameter gives the
       group; several (a ``_foreach`` op over a list) leave the node at the top (``""``);
    2. *nearest*: other optimizer nodes take the parameter of the nearest grouped node along the edges
       (either direction, through optimizer nodes; breadth first, earliest execution order first);
    3. *order*: a node with no path to a parameter (AdamW's ``step`` counters) takes the group of the next
       grouped node in execution order (else the previous one); ``Optimizer.*`` wrapper nodes stay at the top.

    >>> from nbdebug.session.graph import Graph
    >>> g = Graph()
    >>> for i, n in enumerate(["Parameter.w", "Torch.tensor.0.forward", "Tensor.__iadd__.0.forward",
    ...                        "Tensor.mul_.0.forward", "Tensor.add_.0.forward"]):
    ...     g.add_node(n, kind="parameter" if i == 0 else "op", op_type="x",
    ...                section="forward" if i == 0 else "optimizer").order = i
    >>> g.add_edge("Parameter.w", "Tensor.mul_.0.forward", "output.0", "input.0")
    >>> g.add_edge("Tensor.mul_.0.forward", "Tensor.add_.0.forward")
    >>> g.add_edge("Torch.tensor.0.forward", "Tensor.__iadd__.0.forward")
    >>> groups = optimizer_params(g)
    >>> [groups[n] for n in ("Tensor.mul_.0.forward", "Tensor.add_.0.forward", "Tensor.__iadd__.0.forward")]
    ['w', 'w', 'w']
    """
    nodes = graph.nodes
    opt = [n for n in list(nodes.values()) if n.section == "optimizer"]
    if not opt:
        return {}
    names = {n.name for n in opt}
    adj, direct = _optimizer_links(graph, names)
    by_order = sorted(opt, key=lambda n: (n.order < 0, n.order, n.name))
    out = _groups_direct_and_nearest(nodes, by_order, adj, direct)
    _groups_by_order(nodes, by_order, adj, out)
    return {n.name: out.get(n.name, "") for n in opt}


def _optimizer_links(graph: Any, names: set[str]) -> tuple[dict[str, list[str]], dict[str, set[str]]]:
    """The edges between optimizer nodes (both directions), and each optimizer node's *direct* parameters
    (rule 1 of :func:`optimizer_params`)."""
    adj: dict[str, list[str]] = {n: [] for n in names}
    direct: dict[str, set[str]] = {}
    for (s, d), slots in list(graph.edges.items()):
        s_in, d_in = s in names, d in names
        if s_in and d_in:
            adj[s].append(d)
            adj[d].append(s)
        elif d_in or s_in:
            inside, other = (d, s) if d_in else (s, d)
            for src_slot, dst_slot in slots or [("", "")]:
                p = _param_of_anchor(other, src_slot if d_in else dst_slot)
                if p is not None:
                    direct.setdefault(inside, set()).add(p)
    return adj, direct


def _groups_direct_and_nearest(nodes: Any, by_order: list[Any], adj: dict[str, list[str]],
                               direct: dict[str, set[str]]) -> dict[str, str]:
    """Rules 1 and 2 of :func:`optimizer_params`: one direct parameter gives the group (several, or an
    ``Optimizer.*`` wrapper: ``""``), then breadth first along the edges, earliest execution order first."""
    out: dict[str, str] = {}
    wrapper = {n.name for n in by_order if n.name.startswith("Optimizer.")}
    ambiguous = {n for n, ps in direct.items() if len(ps) > 1} | wrapper
    queue: deque[str] = deque()
    for n in by_order:
        ps = direct.get(n.name)
        if n.name in ambiguous:
            out[n.name] = ""
        elif ps:
            out[n.name] = next(iter(ps))
            queue.append(n.name)
    while queue:
        cur = queue.popleft()
        for nb in sorted(adj[cur], key=lambda m: (nodes[m].order < 0, nodes[m].order, m)):
            if nb not in out:
                out[nb] = out[cur]
                queue.append(nb)
    return out


def _groups_by_order(nodes: Any, by_order: list[Any], adj: dict[str, list[str]], out: dict[str, str]) -> None:
    """Rule 3 of :func:`optimizer_params`, into ``out``: each connected part with no parameter takes the group
    of the next (else the previous) grouped node in execution order."""
    grouped = [(n.order, out[n.name]) for n in by_order if out.get(n.name)]
    rest = [n for n in by_order if n.name not in out]
    comp_of: dict[str, list[str]] = {}
    for n in rest:
        if n.name in comp_of:
            continue
        comp, stack = [], [n.name]
        seen = {n.name}
        while stack:
            c = stack.pop()
            comp.append(c)
            for nb in adj[c]:
                if nb not in seen and nb not in out:
                    seen.add(nb)
                    stack.append(nb)
        for c in comp:
            comp_of[c] = comp
        first = min(nodes[c].order for c in comp)
        param = next((p for o, p in grouped if o > first), None)
        if param is None:
            param = next((p for o, p in reversed(grouped) if o < first), "")
        for c in comp:
            out[c] = param


def optimizer_scope(param: str) -> str:
    """The optimizer-section scope of a parameter's ops: nested like the model's modules, the parameter's
    own group last (labelled ``module.param``), so a large model's optimizer reads like its forward.

    >>> optimizer_scope("transformer.h.0.attn.c_attn.weight"), optimizer_scope("fc1.weight"), optimizer_scope("")
    ('transformer/h/0/attn/c_attn.weight', 'fc1.weight', '')
    """
    parts = param.replace("/", "∕").split(".")
    return "/".join(parts[:-2] + [".".join(parts[-2:])]) if len(parts) > 2 else ".".join(parts)


def _module_scope_key(node: Any) -> str | None:
    """``Module.a.b.Linear.forward.0`` (``Cell.a.b.Dense.forward.0``) → ``"forward:a/b"`` (the scope its module's
    ops sit in).

    >>> from nbdebug.session.graph import Node
    >>> [_module_scope_key(Node(n, "module", "Dense")) for n in ("Cell.a.b.Dense.forward.0", "Cell.a.Dense")]
    ['forward:a/b', None]
    """
    parts = node.name.split(".")
    if (node.kind != "module" or parts[0] not in module_prefixes() or len(parts) < 5
            or parts[-2] not in ("forward", "backward")):
        return None
    return f"{node.section}:{'/'.join(parts[1:-3])}"


class ScopeIndex:
    """Scope key of every node, scope counts and the module node of each scope, for one graph state."""

    def __init__(self, graph: Any) -> None:
        nodes = list(graph.nodes.values())
        opt = optimizer_params(graph)
        self.key_of: dict[str, str] = {}
        for n in nodes:
            if n.section == "optimizer":
                self.key_of[n.name] = f"optimizer:{optimizer_scope(opt.get(n.name, ''))}"
            else:
                scope = "/".join(n.scope_path)
                self.key_of[n.name] = f"{n.section}:{scope}"
        # A module call sits inside its own scope when that scope holds its ops (mix): the box stands for
        # the call, instead of the call drawn beside the box. At L0 (no ops) it stays a node of its parent.
        has_ops = set(self.key_of.values())
        #: scope key -> the module calls standing for its box, in execution order (graph_edges.output_edges)
        self.calls: dict[str, list[str]] = {}
        for n in sorted(nodes, key=lambda n: (n.order < 0, n.order, n.name)):
            k = _module_scope_key(n)
            if k is not None and k in has_ops:
                self.key_of[n.name] = k
                self.calls.setdefault(k, []).append(n.name)
        self.counts = scope_counts(self.key_of.values())
        for r in ROOTS:
            self.counts.setdefault(r, 0)
        self.module_of: dict[str, str] = {}
        for n in sorted(nodes, key=lambda n: (n.order < 0, n.order, n.name)):
            k = _module_scope_key(n)
            if k is not None and k in self.counts and k not in self.module_of:
                self.module_of[k] = n.name

    def ordered_keys(self) -> list[str]:
        """Scope keys, parents before children: the three roots, then by depth and name."""
        rest = [k for k in self.counts if k not in ROOTS]
        rest.sort(key=lambda k: (k.count("/"), SECTIONS.index(k.split(":", 1)[0]) if k.split(":", 1)[0] in SECTIONS
                                 else 9, k))
        return list(ROOTS) + rest


# -- rows --------------------------------------------------------------------------------------------

def format_shape(shape: Any) -> str:
    """``(4, 8)`` → ``"4×8"``; ``()`` → ``"scalar"``; None → ``""``.

    >>> format_shape((4, 8)), format_shape(()), format_shape(None)
    ('4×8', 'scalar', '')
    """
    if shape is None:
        return ""
    shape = tuple(shape)
    return "×".join(str(int(s)) for s in shape) if shape else "scalar"


def node_row(node: Any, key: str) -> list[Any]:
    """``[name, label, cls, scope, op_type, order, shape, dtype]`` (shape/dtype of output 0)."""
    shape = node.shapes.get("output.0")
    dtype = node.dtypes.get("output.0", "")
    return [node.name, short_label(node), node_class(node), key, node.op_type, int(node.order),
            format_shape(shape), str(dtype or "")]


def scope_label(key: str) -> str:
    section, _, scope = key.partition(":")
    return scope.rsplit("/", 1)[-1] if scope else section


class GraphFeed:
    """Per-widget bookkeeping of what was sent: node ids, node rows, scope rows, edges and the revision.

    :meth:`full` builds a ``graph`` message; :meth:`update` a ``delta`` with what was added or changed
    since (None when nothing was), or a full ``graph`` when something disappeared (a different graph).
    """

    def __init__(self) -> None:
        self.rev = 0
        self.ids: dict[str, int] = {}
        self.rows: list[list[Any]] = []
        self.scopes: dict[str, list[Any]] = {}
        self.edges: list[int] = []
        self._edge_set: set[tuple[int, int]] = set()
        self.index: ScopeIndex | None = None
        self._graph_id: int | None = None
        self._version: Any = None

    def _scope_rows(self, idx: ScopeIndex) -> dict[str, list[Any]]:
        rows = {}
        for k in idx.ordered_keys():
            mod = idx.module_of.get(k)
            rows[k] = [k, parent_key(k), scope_label(k), k.split(":", 1)[0],
                       self.ids.get(mod, -1) if mod is not None else -1, idx.counts.get(k, 0)]
        return rows

    def _snapshot(self, graph: Any) -> tuple[list[Any], list[tuple[str, str]], ScopeIndex]:
        """Nodes (in execution order), edges and scopes, consistent with each other and with ``_version``
        even while the training thread adds nodes (those added meanwhile come with the next update)."""
        self._version = (graph.version, len(graph))
        idx = ScopeIndex(graph)
        nodes = [n for n in list(graph.nodes.values()) if n.name in idx.key_of]
        nodes.sort(key=lambda n: (n.order < 0, n.order, n.name))
        return nodes, DrawnEdges(graph, idx).pairs(), idx

    def full(self, graph: Any) -> dict[str, Any]:
        """The whole graph (resets the bookkeeping)."""
        nodes, edges, idx = self._snapshot(graph)
        self.index = idx
        self._graph_id = id(graph)
        self.ids = {n.name: i for i, n in enumerate(nodes)}
        self.rows = [node_row(n, idx.key_of[n.name]) for n in nodes]
        self.scopes = self._scope_rows(idx)
        self._edge_set = set()
        self.edges = []
        for s, d in edges:
            a, b = self.ids.get(s), self.ids.get(d)
            if a is not None and b is not None and (a, b) not in self._edge_set:
                self._edge_set.add((a, b))
                self.edges += [a, b]
        self.rev += 1
        return self.message()

    def message(self) -> dict[str, Any]:
        """The ``graph`` message of what was sent so far (for a late view or a snapshot)."""
        return {"type": "graph", "rev": self.rev, "nodes": list(self.rows), "scopes": list(self.scopes.values()),
                "edges": list(self.edges)}

    def stale(self, graph: Any) -> bool:
        return self._graph_id != id(graph) or self._version != (graph.version, len(graph))

    def update(self, graph: Any, *, force: bool = False) -> dict[str, Any] | None:
        """A ``delta`` (or a ``graph`` when a delta cannot say it); None when nothing changed."""
        if self._graph_id != id(graph) or self.index is None:
            return self.full(graph)
        if not force and not self.stale(graph):
            return None
        nodes, edges, idx = self._snapshot(graph)
        names = {n.name for n in nodes}
        if any(name not in names for name in self.ids):
            return self.full(graph)
        self.index = idx
        new_rows, changed = [], []
        for n in nodes:
            row = node_row(n, idx.key_of[n.name])
            i = self.ids.get(n.name)
            if i is None:
                self.ids[n.name] = len(self.rows)
                self.rows.append(row)
                new_rows.append(row)
            elif self.rows[i] != row:
                self.rows[i] = row
                changed.append([i, row])
        scopes = self._scope_rows(idx)
        if any(k not in scopes for k in self.scopes):
            return self.full(graph)
        scope_out = [row for k, row in scopes.items() if self.scopes.get(k) != row]
        self.scopes = scopes
        new_edges: list[int] = []
        for s, d in edges:
            a, b = self.ids.get(s), self.ids.get(d)
            if a is not None and b is not None and (a, b) not in self._edge_set:
                self._edge_set.add((a, b))
                new_edges += [a, b]
        self.edges += new_edges
        if not (new_rows or changed or scope_out or new_edges):
            return None
        base = self.rev
        self.rev += 1
        return {"type": "delta", "rev": self.rev, "base": base, "nodes": new_rows, "changed": changed,
                "scopes": scope_out, "edges": new_edges}


# -- marks -------------------------------------------------------------------------------------------

def error_node(source: Any) -> str | None:
    """The node a failed training run was at: the source's ``error_node`` when it has one, else (state
    ``failed``) the op that ran last (:attr:`SourceView.failed_node`, the one the header names too)."""
    explicit = getattr(getattr(source, "obj", source), "error_node", None)
    if isinstance(explicit, str):
        return explicit
    if str(getattr(source, "state", "")) not in ("failed", "State.FAILED"):
        return None
    return getattr(source, "failed_node", None)


def paths_from(graph: Any, src: str, limit: int = 200_000) -> dict[str, str]:
    """Breadth-first producer → consumer search from ``src``: reached node -> the node it was reached from."""
    prev: dict[str, str] = {src: src}
    q = deque([src])
    while q and len(prev) < limit:
        cur = q.popleft()
        for nb in sorted(graph.successors(cur)):
            if nb not in prev:
                prev[nb] = cur
                q.append(nb)
    return prev


def path_to(prev: Mapping[str, str], dst: str) -> list[str]:
    path = [dst]
    while prev[path[-1]] != path[-1]:
        path.append(prev[path[-1]])
    return path[::-1]


def marks(source: Any, ids: Mapping[str, int]) -> dict[str, Any]:
    """The ``marks`` message: hit badges (condition abbreviations per node), the paused node, the failed
    node, and the path from ``first_nonfinite()`` (when the source offers it) along the data flow to the node
    paused at, else to the latest hit it reaches (just the origin when it reaches none)."""
    badges: dict[str, list[str]] = {}
    last_hit = None
    for h in source.hits:
        if not h.hits:
            continue
        i = ids.get(h.node)
        if i is None:
            continue
        lst = badges.setdefault(str(i), [])
        if h.condition not in lst:
            lst.append(h.condition)
        last_hit = h
    paused = -1
    if source.state == "paused" and source.current_node:
        paused = ids.get(source.current_node, -1)
    err = error_node(source)
    path: list[int] = []
    finder = getattr(source.obj, "first_nonfinite", None)
    if finder is not None and (last_hit is not None or err is not None):
        try:
            origin = finder(last_hit.step) if last_hit is not None else finder()
        except Exception:  # noqa: BLE001 - no path when the origin cannot be computed
            origin = None
        if origin is not None and origin[0] in ids:
            # to the node paused at, else the latest hit (else the failed node) the origin reaches, the way
            # the non-finite values went (through the forward ops a NaN weight poisoned, not its gradient)
            session = getattr(source.obj, "session", None)
            prev = nonfinite_path(session, origin[2], origin[0]) if session is not None else {}
            if len(prev) < 2:
                prev = paths_from(source.graph, origin[0])
            targets = [source.current_node if paused >= 0 else None]
            targets += [h.node for h in reversed(source.hits) if h.hits] + [err]
            target = next((t for t in targets if t in prev and t in ids), origin[0])
            path = [ids[n] for n in path_to(prev, target) if n in ids]
    return {"type": "marks", "badges": {k: " ".join(v) for k, v in badges.items()}, "paused": paused,
            "error": ids.get(err, -1) if err else -1, "path": path, "step": f"step {source.step}"}


# -- hover card --------------------------------------------------------------------------------------

def fmt_number(v: Any) -> str:
    """Statistics as the card shows them: the tables' one formatter (:func:`~nbdebug.ui.tensor_math.fmt`:
    6 significant digits; ``None`` for an empty tensor is ``–``).

    >>> fmt_number(0.38968712), fmt_number(None), fmt_number(float("nan")), fmt_number(3)
    ('0.389687', '–', 'nan', '3')
    """
    return fmt(v)


def card(source: Any, name: str, key: str | None = None) -> dict[str, Any]:
    """The ``card`` message for node ``name``: op type, full name, scope, section, each slot's shape and
    dtype, and the current step's statistics of its outputs (finite max / min / mean, NaN / +Inf / −Inf
    counts; see :func:`finite_extrema`)."""
    node = source.graph[name]
    rows: list[list[str]] = [["op type", node.op_type], ["name", node.name],
                             ["scope", key if key is not None else f"{node.section}:{node.scope}"],
                             ["section", node.section]]
    slots = sorted(set(node.shapes) | set(node.dtypes), key=_slot_order)
    for slot in slots:
        rows.append([slot, " ".join(x for x in (format_shape(node.shapes.get(slot)),
                                                str(node.dtypes.get(slot, ""))) if x)])
    rows.append(["statistics of", f"step {source.step}"])
    for slot in slots:
        if slot.startswith(("input.", "parameters.")):
            continue
        try:
            st = source.stats(name, slot)
        except Exception:  # noqa: BLE001 - not captured this step
            continue
        finite = finite_extrema(source, name, slot, st)
        rows.append([f"{slot} max / min / mean", " / ".join(fmt_number(v) for v in finite)])
        rows.append([f"{slot} NaN / +Inf / −Inf",
                     " / ".join(fmt_number(st.get(k, 0)) for k in ("nan_count", "pos_inf_count", "neg_inf_count"))])
    return {"type": "card", "name": name, "rows": rows}


def finite_extrema(source: Any, name: str, slot: str, st: Mapping[str, Any]) -> list[Any]:
    """max, min, mean over the *finite* elements: the recorded statistics when they are finite, else (a
    tensor with NaN/Inf) computed from the retained value (``None`` each when it is not retained)."""
    vals = [st.get(k) for k in ("max", "min", "mean")]
    bad = sum(int(st.get(k) or 0) for k in ("nan_count", "pos_inf_count", "neg_inf_count"))
    if not bad or all(v is None or math.isfinite(float(v)) for v in vals):
        return vals
    try:
        import numpy as np

        from .tensor_math import tensor_stats

        ts = tensor_stats(np.asarray(source.tensor(name, slot)))
    except Exception:  # noqa: BLE001 - not retained: say nothing rather than nan
        return [None, None, None]
    return [ts.get(k) for k in ("max", "min", "mean")]


def _slot_order(slot: str) -> tuple[int, str]:
    head = slot.split(".", 1)[0]
    rank = {"input": 0, "parameters": 1, "output": 2}.get(head, 3)
    tail = slot.split(".", 1)[-1]
    return rank, tail.zfill(4) if tail.isdigit() else tail
