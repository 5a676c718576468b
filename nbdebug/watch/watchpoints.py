"""Watchpoints and hits: which condition watches which nodes, and what fired where.

Hits and notices: a :class:`HitRecord` whose ``hits`` is non-empty is a *hit* (a watchpoint fired); one
with ``hits == ()`` is a *notice* (the tensor could not be checked: ``error`` says why). Only hits count
as hits (panel header, hit list, status item: :func:`count_hits`). A change condition (WCL/WCS/WNC) on the
first step it sees has nothing to compare with and records nothing (no notice).

A :class:`Watchpoint` pairs a condition (one of the 17) and its parameters with a node selection:
explicit names or glob patterns, or — when none are given — the condition's category (all weights,
all gradients, all activations, all nodes), which follows the graph as it grows. The
:class:`WatchManager` evaluates the enabled watchpoints on a step's statistics (columns at once) and,
for the few conditions that need them, on retained values of the watched tensors only.

>>> from nbdebug.session.session import Session
>>> wm = WatchManager(Session(framework="none"))
>>> wp = wm.watch("GL", max_gt=1e3)
>>> wp.condition, wp.params["max_gt"], wp.category
('GL', 1000.0, 'gradient')
"""

from __future__ import annotations

import fnmatch
import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..session.session import Session
from ..session.stats import COL, StatsTable
from ..session.store import NotRetainedError
from .conditions import (
    NO_PREVIOUS_STEP,
    TOO_LARGE_TO_KEEP,
    VALUE_NOT_RETAINED,
    Firing,
    Hit,
    evaluate_stats,
    evaluate_values,
    get_condition,
    split_params,
    validate,
)
from .flow import in_flow_order
from .guide import advice
from .monitor_check import monitor_nonfinite
from .nonfinite import first_nonfinite
from .recommend import Target, activation_kind, recommended, recommended_temporal
from .registry import is_temporal
from .temporal import TemporalEngine

ACTIVATIONS = frozenset({
    "relu", "relu_", "relu6", "gelu", "sigmoid", "tanh", "softmax", "log_softmax", "silu", "elu", "leaky_relu",
    "selu", "celu", "softplus", "mish", "hardtanh", "hardswish", "hardsigmoid", "prelu", "glu", "logsigmoid",
    "softsign", "tanhshrink", "threshold", "rrelu", "swish", "fastgelu", "softmin",
})


def node_category(node: Any) -> set[str]:
    """Categories of a graph node: tensor always; weight, gradient, activation by what it is."""
    cats = {"tensor"}
    if node.kind == "parameter" and node.section == "forward":
        cats.add("weight")
    elif node.section == "backward":
        cats.add("gradient")
    elif node.section == "forward" and node.kind in ("op", "module") and node.op_type.lower() in ACTIVATIONS:
        cats.add("activation")
    return cats


@dataclass
class Watchpoint:
    """A condition with parameters over a node selection."""

    id: int
    condition: str
    params: dict[str, Any]
    nodes: list[str] | None = None  # names or glob patterns; None: the condition's category
    target: Target | None = None
    added: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)
    enabled: bool = True
    version: int = 0

    @property
    def category(self) -> str:
        return get_condition(self.condition).category

    @property
    def name(self) -> str:
        return get_condition(self.condition).name

    def selects(self, node: Any) -> bool:
        name = node.name
        if name in self.removed:
            return False
        if name in self.added:
            return True
        if self.nodes is not None:
            return any(name == p or fnmatch.fnmatchcase(name, p) for p in self.nodes)
        cats = node_category(node)
        if self.target is not None:
            ndim = max((len(s) for s in node.shapes.values()), default=None)
            cat = self.target.category
            return cat in cats and self.target.matches(cat, node.op_type, ndim)
        return self.category in cats

    def describe(self) -> str:
        sel = ", ".join(self.nodes) if self.nodes is not None else f"all {self.target or self.category} nodes"
        extra = "".join([f" +{len(self.added)}" if self.added else "", f" -{len(self.removed)}" if self.removed
                         else ""])
        ps = ", ".join(f"{k}={v}" for k, v in self.params.items())
        return f"#{self.id} {self.condition} ({self.name}) {ps} on {sel}{extra}" + ("" if self.enabled else
                                                                                     " [disabled]")


@dataclass(frozen=True)
class HitRecord:
    """A watchpoint that fired (or could not be checked) on one tensor of one step."""

    watchpoint: int
    condition: str
    node: str
    slot: str
    step: int
    order: int
    hits: tuple[Hit, ...]
    error: str | None
    unchecked: tuple[str, ...]
    advice: str
    #: the hit is on the node where the step's NaN/Inf was born (``first_nonfinite``); after the step's
    #: check, ``order`` is the record's position in the step's data flow (:mod:`.flow`), origin first
    origin: bool = False

    @property
    def is_hit(self) -> bool:
        """True when a watchpoint fired; False for a notice (the tensor could not be checked)."""
        return bool(self.hits)

    def describe(self) -> str:
        f = Firing(self.condition, -1, self.hits, self.error, self.unchecked)
        return f"step {self.step} {self.node} {self.slot} — {f.describe()}"


def count_hits(records: Iterable[HitRecord]) -> int:
    """How many records are hits (notices do not count): the one count the panel and status item show."""
    return sum(1 for h in records if h.hits)


class WatchManager:
    """The watchpoints of one session, their evaluation, and the hits found."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.watchpoints: dict[int, Watchpoint] = {}
        self._ids = itertools.count(1)
        self.hits: list[HitRecord] = []
        #: node globs whose non-finite values are intended (the owner's ``benign_nonfinite``)
        self.benign: tuple[str, ...] = ()
        self._initial_done: set[int] = set()
        #: watchpoints naming nodes, made before any node was captured: checked once the first step ran
        self._unchecked_selection: set[int] = set()
        #: the watchpoints over time (SPIKE, DRIFT, STALL): rolling state per watchpoint, the bands of their hits
        self.temporal = TemporalEngine(session)
        #: one evaluation at a time: the training thread checks each step it ends while another thread (the
        #: notebook, the remote agent serving ``recheck``) may check a step again; each replaces hits in
        #: :attr:`hits` (read, then written) and feeds the temporal state
        self._lock = threading.RLock()

    # -- editing ----------------------------------------------------------------------------------
    def watch(self, condition: str, nodes: str | Iterable[str] | None = None, *, target: Target | None = None,
              **params: Any) -> Watchpoint:
        """Create a watchpoint; ``nodes`` takes names, glob patterns or a list (None: the category)."""
        cond = get_condition(condition).abbr
        _check_names(cond, params)
        checked = validate(cond, params)
        wp = Watchpoint(next(self._ids), cond, checked, _patterns(nodes), target)
        self.watchpoints[wp.id] = wp
        self.pin_values()
        self._warn_if_empty(wp)
        return wp

    def _warn_if_empty(self, wp: Watchpoint, stacklevel: int = 4) -> None:
        """A selection that names nodes but matches none of those captured so far is most often a typo.
        Before any node was captured, the check waits for the first step that ran (:meth:`check`)."""
        graph = self.session.graph
        self._unchecked_selection.discard(wp.id)
        if wp.nodes is None or is_temporal(wp.condition):  # a temporal one may name monitor series ("Run")
            return
        if not len(graph):
            self._unchecked_selection.add(wp.id)
            return
        if any(wp.selects(n) for n in graph):
            return
        import warnings

        shown = ", ".join(repr(p) for p in wp.nodes[:3]) + (" ..." if len(wp.nodes) > 3 else "")
        warnings.warn(f"watchpoint #{wp.id} ({wp.condition}): nodes={shown} matches no node yet (it matches "
                      f"nothing among the {len(graph)} nodes captured so far); it will apply to matching nodes "
                      f"that appear later", UserWarning, stacklevel=stacklevel)

    def _warn_unchecked_selections(self) -> None:
        """The selections made before the first node was captured, checked now that a step ran."""
        if not self._unchecked_selection or not len(self.session.graph):
            return
        for wid in sorted(self._unchecked_selection):
            wp = self.watchpoints.get(wid)
            if wp is not None:
                self._warn_if_empty(wp, stacklevel=2)
        self._unchecked_selection.clear()

    def get(self, wp: int | Watchpoint) -> Watchpoint:
        key = wp.id if isinstance(wp, Watchpoint) else wp
        try:
            return self.watchpoints[key]
        except KeyError:
            raise KeyError(f"no watchpoint #{key}; existing: {sorted(self.watchpoints)}") from None

    def update(self, wp: int | Watchpoint, *, add: str | Iterable[str] | None = None,
               remove: str | Iterable[str] | None = None, enabled: bool | None = None,
               nodes: Any = ..., **params: Any) -> Watchpoint:
        """Add/remove nodes, enable/disable, replace the selection or change parameters."""
        w = self.get(wp)
        if enabled is not None and not isinstance(enabled, (bool, np.bool_)):
            raise TypeError(f"enabled must be True or False, got {enabled!r}")
        if params:
            _check_names(w.condition, params)
            merged = {k: v for k, v in w.params.items() if k not in params}
            merged.update(params)
            user = {k: v for k, v in merged.items() if v is not None}
            w.params = validate(w.condition, user)
        for name in _patterns(add, "add") or []:
            w.added.add(name)
            w.removed.discard(name)
        for name in _patterns(remove, "remove") or []:
            w.removed.add(name)
            w.added.discard(name)
        if nodes is not ...:
            w.nodes = _patterns(nodes)
        if enabled is not None:
            w.enabled = bool(enabled)
        w.version += 1
        self._initial_done.discard(w.id)
        self.pin_values()
        if nodes is not ...:
            self._warn_if_empty(w)
        return w

    def delete(self, wp: int | Watchpoint) -> None:
        w = self.get(wp)
        with self._lock:
            del self.watchpoints[w.id]
            self.hits = [h for h in self.hits if h.watchpoint != w.id]

    def clear(self) -> None:
        with self._lock:
            self.watchpoints.clear()
            self.hits.clear()

    def selected_nodes(self, wp: int | Watchpoint) -> list[str]:
        w = self.get(wp)
        return [n.name for n in self.session.graph.in_order() if w.selects(n)]

    # -- recommendations --------------------------------------------------------------------------
    def recommend(self) -> list[tuple[str, dict[str, Any], Target]]:
        kinds = {activation_kind(n.op_type) for n in self.session.graph
                 if "activation" in node_category(n)}
        return recommended(kinds) + recommended_temporal()

    def watch_recommended(self) -> list[Watchpoint]:
        return [self.watch(c, target=t, **p) for c, p, t in self.recommend()]

    # -- evaluation -------------------------------------------------------------------------------
    def pin_values(self) -> frozenset[str]:
        """Tell the session which nodes' values the value-level watchpoints need (kept over budget)."""
        wps = [w for w in list(self.watchpoints.values()) if w.enabled and get_condition(w.condition).needs
               in ("values", "previous")]  # list(): the set as of now (the notebook may add one meanwhile)
        pinned = frozenset(n.name for n in self.session.graph for w in wps if w.selects(n)) if wps else frozenset()
        self.session.pin(pinned)
        return pinned

    def check(self, step: int) -> list[HitRecord]:
        """Evaluate every enabled watchpoint on ``step``; replaces that step's hits; returns them."""
        with self._lock:
            return self._check(step)

    def _check(self, step: int) -> list[HitRecord]:
        self.pin_values()
        wps = list(self.watchpoints.values())  # as of now: another thread may set or delete one meanwhile
        over_time = self.temporal.check(wps, step)
        table = self.session.table(step)
        found = self._evaluate(step, table, None)
        if found:
            origin = first_nonfinite(self.session, step, ignore=self.benign)
            found = in_flow_order(self.session.graph, found, origin[0] if origin is not None else None)
        if not len(table):  # a step that recorded no tensors (level="monitor"): TO reads the monitor series
            found += monitor_nonfinite(wps, self.session, step)
        found += over_time
        self.hits = [h for h in self.hits if h.step != step or h.condition == "ODD_RANK"] + found
        self._warn_unchecked_selections()
        return found

    def recheck_temporal(self) -> list[HitRecord]:
        """Evaluate the watchpoints over time again over the whole kept history; replaces their hits."""
        with self._lock:
            found = self.temporal.replay(list(self.watchpoints.values()))
            self.hits = [h for h in self.hits if not is_temporal(h.condition) or h.condition == "ODD_RANK"] + found
        return found

    def check_node(self, node: Any, step: int) -> list[HitRecord]:
        """Evaluate the watchpoints selecting ``node`` on its tensors only (check="node")."""
        table = self.session.node_table(node.name)
        found = self._evaluate(step, table, {node.name})
        if not found:
            return []
        with self._lock:  # only when something fired (check="node" evaluates at every node)
            known = {(h.watchpoint, h.node, h.slot, h.step) for h in self.hits}
            new = [h for h in found if (h.watchpoint, h.node, h.slot, h.step) not in known]
            self.hits.extend(new)
        return new

    def _evaluate(self, step: int, table: StatsTable, only: set[str] | None) -> list[HitRecord]:
        graph = self.session.graph
        by_node = _rows_by_node(table)
        out: list[HitRecord] = []
        for wp in list(self.watchpoints.values()):
            if not wp.enabled or is_temporal(wp.condition):
                continue
            rows: list[int] = []
            for name, slot_rows in by_node.items():
                if only is not None and name not in only:
                    continue
                node = graph.nodes.get(name)
                if node is None or not wp.selects(node):
                    continue
                rows.extend(i for s, i in slot_rows if not s.startswith(("input", "parameters")))
            if not rows:
                continue
            for f in self._fire(wp, step, table, rows, by_node):
                name, slot = table.keys[f.row]
                node = graph.nodes[name]
                out.append(HitRecord(wp.id, wp.condition, name, slot, step, node.order, f.hits, f.error,
                                     f.unchecked, advice(wp.condition, node_op_type=node.op_type,
                                                         fired_params=f.hits)))
        out.sort(key=lambda h: (h.order, h.node, h.slot, h.watchpoint))
        return out

    def _fire(self, wp: Watchpoint, step: int, table: StatsTable, rows: list[int],
              by_node: dict[str, list[tuple[str, int]]]) -> list[Firing]:
        cond = wp.condition
        stats_part, values_part = split_params(cond, wp.params)
        if cond == "OO":
            finite = []
            bad = table.values[:, COL["nan_count"]] + table.values[:, COL["pos_inf_count"]] + \
                table.values[:, COL["neg_inf_count"]]
            for r in rows:
                node = table.keys[r][0]
                ins = [i for s, i in by_node.get(node, ()) if s.startswith("input")]
                finite.append(not any(bad[i] > 0 for i in ins))
            return evaluate_stats(cond, wp.params, table, rows, inputs_finite=finite)
        if cond == "WI":
            if wp.id in self._initial_done:
                return []
            self._initial_done.add(wp.id)
            firings = []
            for r in rows:
                node, slot = table.keys[r]
                try:
                    init = self.session.tensor(node, slot, "initial")
                except (NotRetainedError, KeyError):
                    init = None
                f = evaluate_values(cond, wp.params, initial=init, row=r)
                if f is not None:
                    firings.append(f)
            return firings
        if cond in ("WCL", "WCS", "WNC"):
            firings = []
            for r in rows:
                node, slot = table.keys[r]
                cur, err = self._value(node, slot, step)
                prev, perr = self._value(node, slot, step - 1) if step > 0 else (None, NO_PREVIOUS_STEP)
                if cur is None:
                    firings.append(Firing(cond, r, (), err, tuple(values_part) or (cond,)))
                    continue
                if prev is None:
                    if step == 0 or perr in (NO_PREVIOUS_STEP, VALUE_NOT_RETAINED):
                        continue  # the first step this watchpoint sees: nothing to compare with, no notice
                    firings.append(Firing(cond, r, (), perr, tuple(values_part) or (cond,)))
                    continue
                f = evaluate_values(cond, wp.params, current=cur, previous=prev, row=r)
                if f is not None:
                    firings.append(f)
            return firings
        firings = evaluate_stats(cond, stats_part if stats_part else wp.params, table, rows) \
            if stats_part or not values_part else []
        if values_part:  # TR/AR range percentages: values of the watched tensors only
            fired = {f.row: f for f in firings}
            for r in rows:
                if table.values[r, COL["count"]] == 0:
                    continue
                node, slot = table.keys[r]
                cur, err = self._value(node, slot, step)
                if cur is None:
                    f = Firing(cond, r, (), err, tuple(values_part))
                else:
                    f = evaluate_values(cond, values_part, current=cur, row=r)
                if f is not None:
                    prev = fired.get(r)
                    fired[r] = f if prev is None else Firing(cond, r, prev.hits + f.hits, prev.error or f.error,
                                                            prev.unchecked + f.unchecked)
            firings = sorted(fired.values(), key=lambda f: f.row)
        return firings

    def _value(self, node: str, slot: str, step: int) -> tuple[np.ndarray | None, str]:
        try:
            return self.session.tensor(node, slot, step), ""
        except NotRetainedError as e:
            return None, TOO_LARGE_TO_KEEP if "budget" in str(e) else VALUE_NOT_RETAINED
        except KeyError:
            return None, NO_PREVIOUS_STEP


def resolve_nodes(graph: Any, nodes: str | Iterable[str]) -> frozenset[str]:
    """Node names for ``nodes`` (names or glob patterns): a glob expands over the nodes captured so far; a
    plain name is taken as is (it may be captured later). A glob matching nothing is a ``ValueError``."""
    patterns = _patterns(nodes)
    if patterns is None:
        raise TypeError("nodes must be a node name, a glob pattern or a list of them, not None")
    out: set[str] = set()
    for p in patterns:
        if not any(c in p for c in "*?["):
            out.add(p)
            continue
        found = {n for n in list(graph.nodes) if fnmatch.fnmatchcase(n, p)}  # the graph as of now
        if not found:
            raise ValueError(f"{p!r} matches none of the {len(graph.nodes)} nodes captured so far")
        out |= found
    return frozenset(out)


def _patterns(nodes: str | Iterable[str] | None, arg: str = "nodes") -> list[str] | None:
    """``nodes`` as a list of names/globs (None stays None); errors name the argument ``arg``."""
    if nodes is None:
        return None
    if isinstance(nodes, str):
        nodes = [nodes]
    elif isinstance(nodes, (bytes, dict)) or not isinstance(nodes, Iterable):
        whole = " (None: the condition's category)" if arg == "nodes" else ""
        raise TypeError(f"{arg} must be a node name, a glob pattern or a list of them{whole}, got the "
                        f"{type(nodes).__name__} {nodes!r}")
    out = list(nodes)
    for n in out:
        if not isinstance(n, str):
            raise TypeError(f"{arg} must be names or glob patterns (str), got the {type(n).__name__} {n!r}")
        if not n.strip():
            tail = ", or None for the condition's category" if arg == "nodes" else ""
            raise ValueError(f"{arg} holds an empty name, which matches nothing: give node names or glob "
                             f"patterns (e.g. 'Functional.*'){tail}")
    return out


def _check_names(cond: str, params: dict[str, Any]) -> None:
    """Parameter names must be identifiers (``watch("TO", **{"": 1})`` names the bad one)."""
    for k in params:
        if not isinstance(k, str) or not k.isidentifier():
            raise ValueError(f"{cond}: {k!r} is not a parameter name (parameters are keyword arguments such as "
                             f"max_gt=1e3)")


def _rows_by_node(table: StatsTable) -> dict[str, list[tuple[str, int]]]:
    cache = getattr(table, "_by_node", None)
    if cache is not None:
        return cache
    out: dict[str, list[tuple[str, int]]] = {}
    for i, (node, slot) in enumerate(table.keys):
        out.setdefault(node, []).append((slot, i))
    try:
        table._by_node = out  # type: ignore[attr-defined]
    except AttributeError:
        pass
    return out
