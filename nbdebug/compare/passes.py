"""The numbered passes of :func:`nbdebug.compare`, over one :class:`CompareState`.

1. :func:`pair_nodes` — each side's rows by node, MindSpore's bias fusions, node pairs (mapping.py);
2. :func:`pair_rows` — one :class:`~nbdebug.compare.result.CompareRow` per tensor slot (matched or not);
3. :func:`fill_stats` — both sides' Max/Min/Mean/Norm, their differences and relative differences;
4. :func:`tensor_pass` — msProbe's tensor metrics where both values are available;
5. :func:`flag_tensors` — per-tensor errors (NaN/Inf, dtype, shape) and divergence warnings;
6. :func:`node_rules` — inputs agree, outputs do not (msProbe's compare rule);
7. :func:`messages` — each row's status and messages.

>>> import numpy as np
>>> from nbdebug.session.stats import StatsTable
>>> from nbdebug.session.session import Session
>>> def side(mx):
...     s = Session(framework="pytorch", live=False)
...     s.graph.add_node("Functional.relu.0.forward", kind="op", op_type="relu")
...     s.steps[0] = StatsTable.from_rows([("Functional.relu.0.forward", "output.0")], ["float32"], [(4,)],
...                                       np.array([[mx, 0, .5, .5, 1, 4, 0, 0, 0, 0]]))
...     return _Side(s, 0)
>>> st = pair_nodes(side(1.0), side(2.0), "exact", None)
>>> pair_rows(st); fill_stats(st); flag_tensors(st, 0.99, 1e-3, 1e-3); node_rules(st, 1e-3); messages(st)
>>> st.rows[0].status, st.rows[0].messages[0]
('warning', 'differs from golden: Max 1 vs 2 (50%)')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..dump.names import parse_name
from ..frameworks.registry import find_backend
from ..session.dump_session import slot_aliases
from ..session.stats import COL
from .fusion import bias_fusions, fuse
from .mapping import NodeDesc, canonical_slot, framework_of_names, match_nodes
from .metrics import TensorMetrics, stats_diff, tensor_metrics
from .result import CompareRow

_STAT_COLS = [COL["max"], COL["min"], COL["mean"], COL["norm"]]
_INPUT_RATIO_MIN, _OUTPUT_RATIO_MAX = 0.9, 0.6
_IN_NORM_MAX, _OUT_NORM_MIN = 0.1, 0.5
_WARN_FACTOR = 10.0

Rows = dict[str, list[tuple[str, int]]]


class _Side:
    """One side of a comparison: its session, step, table, rows by node and framework."""

    def __init__(self, sess: Any, step: int) -> None:
        self.sess, self.step = sess, step
        self.table = sess.table(step)
        self.order, self.by = _rows_by_node(self.table)
        self.framework = _framework(sess, self.order)
        self.fused: dict[str, tuple[str, str]] = {}
        self.src: dict[tuple[str, str], tuple[str, str]] = {}  # (node, slot) -> where its value is


@dataclass
class CompareState:
    """What the passes build: node pairs, rows and, per row, both sides' table rows and statistics."""

    t: _Side
    g: _Side
    cross: bool
    pairs: list[tuple[str, str, str]]
    unmatched_t: list[str]
    unmatched_g: list[str]
    rows: list[CompareRow] = field(default_factory=list)
    ti: list[int] = field(default_factory=list)  # target table row of each CompareRow (-1: none)
    gi: list[int] = field(default_factory=list)
    T: Any = None  # rows × (Max, Min, Mean, Norm) of the target
    G: Any = None
    diff: Any = None
    rel: Any = None
    both: Any = None
    tensor_rows: Any = None
    errors: list[list[str]] = field(default_factory=list)
    warns: list[list[str]] = field(default_factory=list)


def _framework(sess: Any, names: list[str]) -> str:
    found = find_backend(str(getattr(sess, "framework", "") or ""))
    return found.name if found is not None else framework_of_names(names)


def _rows_by_node(table: Any) -> tuple[list[str], Rows]:
    order: list[str] = []
    by: Rows = {}
    for i, (node, slot) in enumerate(table.keys):
        lst = by.get(node)
        if lst is None:
            lst = by[node] = []
            order.append(node)
        lst.append((slot, i))
    return order, by


def _descs(side: _Side) -> list[NodeDesc]:
    out = []
    nodes = side.sess.graph.nodes
    for name in side.order:
        node = nodes.get(name)
        info = parse_name(name)
        kind = node.kind if node is not None else info.kind
        section = node.section if node is not None else ("backward" if info.direction != "forward" else "forward")
        op_type = node.op_type if node is not None else info.op_type
        outs = tuple(side.table.shapes[i] for s, i in side.by[name] if not s.startswith(("input", "parameters")))
        desc = NodeDesc(name, kind, section, op_type, outs, node.scope if node is not None else None)
        if name in side.fused:
            desc.api = side.fused[name][1]
        out.append(desc)
    return out


# 1 -------------------------------------------------------------------------------------------------
def pair_nodes(t: _Side, g: _Side, match: str,
               mapping: Mapping[str, str] | Callable[[str], str | None] | None) -> CompareState:
    """Pair the two sides' nodes (across frameworks, MindSpore's Conv2D/MatMul + BiasAdd fused first)."""
    cross = t.framework != g.framework
    for s in (t, g):
        s.fused = bias_fusions(s.sess, s.framework, s.order, s.by, s.table.shapes) if cross else {}
        s.src = fuse(s.fused, s.order, s.by)
    pairs, un_t, un_g = match_nodes(_descs(t), _descs(g), how=match, mapping=mapping,
                                    target_framework=t.framework, golden_framework=g.framework, cross=cross)
    return CompareState(t, g, cross, pairs, un_t, un_g)


# 2 -------------------------------------------------------------------------------------------------
def pair_rows(st: CompareState) -> None:
    """One row per tensor slot: matched slots of paired nodes, and every unmatched slot of either side."""
    t, g = st.t, st.g
    pair_of = {tn: (gn, how) for tn, gn, how in st.pairs}

    def add(row: CompareRow, i: int, j: int) -> None:
        st.rows.append(row)
        st.ti.append(i)
        st.gi.append(j)

    for order, node in enumerate(t.order):
        pg = pair_of.get(node)
        if pg is None:
            for slot, i in t.by[node]:
                add(CompareRow(node, None, slot, None, status="unmatched", order=order), i, -1)
            continue
        gname, how = pg
        g_slots = {canonical_slot(s, g.framework, st.cross): (s, i) for s, i in g.by[gname]}
        by_shape = _cross_slots(st, t.by[node], g_slots) if st.cross else {}
        for slot, i in t.by[node]:
            hit = by_shape.get(slot) or g_slots.pop(canonical_slot(slot, t.framework, st.cross), None)
            if hit is None and not st.cross:  # a live run's name of a dumped slot (``input.weight``, ``input.2``)
                hit = _alias_hit(st, node, gname, slot, g_slots)
            if slot in by_shape:
                g_slots.pop(next((k for k, v in g_slots.items() if v == hit), None), None)
            if hit is None:
                add(CompareRow(node, gname, slot, None, status="unmatched", order=order, matched_by=how), i, -1)
                continue
            row = CompareRow(node, gname, slot, hit[0], order=order, matched_by=how)
            if slot in by_shape:
                row.messages.append(f"{slot} paired with golden {hit[0]} by shape and order: the frameworks "
                                    f"number this op's arguments or gradients differently")
            for side, name, key in (("target", t, (node, slot)), ("golden", g, (gname, hit[0]))):
                src = name.src.get(key)
                if src is not None:
                    row.messages.append(f"{side} value: {src[1]} of {src[0]} ({name.framework} adds the bias in "
                                        f"an op of its own)")
            add(row, i, hit[1])
        for s, i in g_slots.values():  # golden slots with no target counterpart
            add(CompareRow(None, gname, s, s, status="unmatched", order=order, matched_by=how), -1, i)
    end = len(t.order)
    for node in st.unmatched_g:
        for slot, i in g.by[node]:
            add(CompareRow(None, node, slot, slot, status="unmatched", order=end), -1, i)


def _cross_slots(st: CompareState, t_rows: list[tuple[str, int]], g_slots: dict) -> dict[str, tuple[str, int]]:
    """Across frameworks, the slots of one op pair that their names pair wrongly or not at all, paired by shape
    in order within each kind (inputs, outputs): MindSpore's ``LayerNorm(x, gamma, beta)`` against PyTorch's
    ``layer_norm(input, normalized_shape, weight, bias)``, a Primitive's gradients (in the order they arrived)
    against PyTorch's (in argument order). Only when every such slot of a kind finds one; else none."""
    tshapes, gshapes = st.t.table.shapes, st.g.table.shapes
    left_t: list[tuple[str, int]] = []
    taken: set[str] = set()
    for slot, i in t_rows:
        hit = g_slots.get(canonical_slot(slot, st.t.framework, True))
        if hit is not None and tuple(tshapes[i]) == tuple(gshapes[hit[1]]):
            taken.add(hit[0])
        else:
            left_t.append((slot, i))
    left_g = [v for v in g_slots.values() if v[0] not in taken]
    out: dict[str, tuple[str, int]] = {}
    for kind in ("input", "output"):
        ts = [(s, i) for s, i in left_t if s.split(".")[0] == kind]
        gs = [(s, i) for s, i in left_g if s.split(".")[0] == kind]
        pairs: dict[str, tuple[str, int]] = {}
        for slot, i in ts:
            j = next((k for k, (_gs, gi) in enumerate(gs) if tuple(gshapes[gi]) == tuple(tshapes[i])), None)
            if j is None:
                break
            pairs[slot] = gs.pop(j)
        else:
            out.update(pairs)
    return out


def _alias_hit(st: CompareState, node: str, gname: str, slot: str, g_slots: dict) -> tuple[str, int] | None:
    """The golden slot that is target ``slot`` under its other name (a live session against its dump: the
    dump names slots as msProbe does, :func:`~nbdebug.session.dump_session.slot_aliases`)."""
    params = None
    for side, name in ((st.g, gname), (st.t, node)):
        api_parameters = getattr(side.sess, "api_parameters", None)
        if api_parameters is not None:
            params = api_parameters(name)
            break
    for alt in slot_aliases(slot, params):
        hit = g_slots.pop(canonical_slot(alt, st.g.framework, st.cross), None)
        if hit is not None:
            return hit
    return None


# 3 -------------------------------------------------------------------------------------------------
def fill_stats(st: CompareState) -> None:
    """Both sides' Max/Min/Mean/Norm on every row, their differences and relative differences (%)."""
    ttab, gtab, rows, ti, gi = st.t.table, st.g.table, st.rows, st.ti, st.gi
    tia, gia = np.asarray(ti, dtype=np.intp), np.asarray(gi, dtype=np.intp)
    has_t, has_g = tia >= 0, gia >= 0
    st.both = has_t & has_g
    st.T = np.full((len(rows), 4), np.nan)
    st.G = np.full((len(rows), 4), np.nan)
    if len(ttab):
        st.T[has_t] = ttab.values[tia[has_t]][:, _STAT_COLS]
    if len(gtab):
        st.G[has_g] = gtab.values[gia[has_g]][:, _STAT_COLS]
    st.diff, st.rel = stats_diff(st.T, st.G)
    t_list, g_list, d_list, r_list = st.T.tolist(), st.G.tolist(), st.diff.tolist(), st.rel.tolist()
    for k, r in enumerate(rows):
        if has_t[k]:
            r.target_dtype, r.target_shape, r.target_stats = ttab.dtypes[ti[k]], ttab.shapes[ti[k]], tuple(t_list[k])
        if has_g[k]:
            r.golden_dtype, r.golden_shape, r.golden_stats = gtab.dtypes[gi[k]], gtab.shapes[gi[k]], tuple(g_list[k])
        if st.both[k]:
            r.stat_diff, r.stat_rel_pct = tuple(d_list[k]), tuple(r_list[k])
    st.tensor_rows = np.zeros(len(rows), dtype=bool)
    st.errors = [[] for _ in rows]
    st.warns = [[] for _ in rows]


# 4 -------------------------------------------------------------------------------------------------
def tensor_pass(st: CompareState, mode: str, value: Callable[[Any, int, str, str], np.ndarray | None]) -> None:
    """msProbe's tensor metrics on every matched row whose two values are available."""
    t, g = st.t, st.g
    for k in np.flatnonzero(st.both).tolist():
        r = st.rows[k]
        a = value(t.sess, t.step, *t.src.get((r.target, r.slot), (r.target, r.slot)))
        b = value(g.sess, g.step, *g.src.get((r.golden, r.golden_slot), (r.golden, r.golden_slot))) \
            if a is not None else None
        if a is None or b is None:
            if mode == "tensor":
                r.messages.append("tensor mode: no value on the " + ("target" if a is None else "golden")
                                  + " side; compared by statistics")
            continue
        m: TensorMetrics = tensor_metrics(a, b)
        r.cosine, r.euc_dist, r.max_abs_err, r.max_rel_err, r.one_thousandth, r.five_thousandths = m.as_tuple()
        if m.message:
            r.messages.append(m.message)
        st.tensor_rows[k] = True


# 5 -------------------------------------------------------------------------------------------------
def flag_tensors(st: CompareState, cosine_min: float, atol: float, rtol: float) -> None:
    """Errors (target NaN/Inf where the golden is finite, dtype, shape) and divergence warnings per tensor."""
    rows, T, G, both, tensor_rows = st.rows, st.T, st.G, st.both, st.tensor_rows
    for k, r in enumerate(rows):
        if both[k]:
            r.mode = "tensor" if tensor_rows[k] else "statistics"
    t_bad = ~np.isfinite(T[:, 0]) | ~np.isfinite(T[:, 1])
    g_fin = np.isfinite(G[:, 0]) & np.isfinite(G[:, 1])
    for k in np.flatnonzero(both & t_bad & g_fin & ~np.isnan(G[:, 0])).tolist():
        st.errors[k].append(f"target Max/Min is NaN/Inf ({_g(T[k, 0])}, {_g(T[k, 1])}) where the golden's are "
                            f"finite")
    for k in np.flatnonzero(both).tolist():
        r = rows[k]
        if r.target_dtype != r.golden_dtype:
            st.errors[k].append(f"dtype differs: {r.target_dtype} vs golden {r.golden_dtype}")
        if r.target_shape != r.golden_shape:
            st.errors[k].append(f"shape differs: {list(r.target_shape or ())} vs golden "
                                f"{list(r.golden_shape or ())}")
    scale = np.maximum(np.abs(G[:, 0]), np.abs(G[:, 1]))
    with np.errstate(invalid="ignore"):
        cos = np.array([r.cosine for r in rows])
        mae = np.array([r.max_abs_err for r in rows])
        tdiv = tensor_rows & ((cos <= cosine_min) | (mae > atol * np.maximum(1.0, np.nan_to_num(scale))))
        tol = rtol * np.stack([scale, scale, scale, np.abs(G[:, 3])], axis=1) + 1e-12
        sdiv = both & ~tensor_rows & np.any(np.abs(st.diff) > tol, axis=1)
        sdiv |= both & ~tensor_rows & np.any(np.isnan(st.diff) & ~(np.isnan(T) & np.isnan(G)), axis=1)
    rel = st.rel
    for k in np.flatnonzero(tdiv | sdiv).tolist():
        r = rows[k]
        r.diverged = True
        if tensor_rows[k]:
            st.warns[k].append(f"differs from golden: Cosine {_g(r.cosine)}, MaxAbsErr {_g(r.max_abs_err)}")
            continue
        worst = int(np.nanargmax(np.where(np.isnan(rel[k]), -1, rel[k]))) if np.any(~np.isnan(rel[k])) else 3
        names = ("Max", "Min", "Mean", "Norm")
        st.warns[k].append(f"differs from golden: {names[worst]} {_g(T[k, worst])} vs {_g(G[k, worst])} "
                           f"({_g(rel[k, worst])}%)")


# 6 -------------------------------------------------------------------------------------------------
def node_rules(st: CompareState, noise: float) -> None:
    """Node-level rules: a node whose inputs agree and whose outputs do not."""
    rows = st.rows
    is_in = [r.slot.startswith(("input", "parameters")) for r in rows]
    by_node: dict[str, list[int]] = {}
    for k in np.flatnonzero(st.both).tolist():
        by_node.setdefault(rows[k].target, []).append(k)
    for ks in by_node.values():
        ins = [k for k in ks if is_in[k]]
        outs = [k for k in ks if not is_in[k]]
        if ins and outs:
            _ratio_rule(st, ins, outs)
            _norm_rule(st, ins, outs, noise)
            _cosine_rule(st, ins, outs)


def _ratio_rule(st: CompareState, ins: list[int], outs: list[int]) -> None:
    rows, tr = st.rows, st.tensor_rows
    in_ratio = [rows[k].one_thousandth for k in ins if tr[k] and not math.isnan(rows[k].one_thousandth)]
    if not in_ratio or min(in_ratio) <= _INPUT_RATIO_MIN:
        return
    for k in outs:
        v = rows[k].one_thousandth
        if tr[k] and not math.isnan(v) and v < _OUTPUT_RATIO_MAX:
            st.errors[k].append(f"inputs agree (One Thousandth Err Ratio > {_INPUT_RATIO_MIN}) but this output's "
                                f"is {_g(v)} < {_OUTPUT_RATIO_MAX}")


def _norm_rule(st: CompareState, ins: list[int], outs: list[int], noise: float) -> None:
    rel_frac = st.rel / 100.0
    in_norm = [rel_frac[k, 3] for k in ins if not math.isnan(rel_frac[k, 3])]
    if not in_norm:
        return
    in_max = max(in_norm)
    for k in outs:
        v = rel_frac[k, 3]
        if math.isnan(v):
            continue
        if in_max < _IN_NORM_MAX and v > _OUT_NORM_MIN:
            st.errors[k].append(f"inputs' Norm relative difference {_pct(in_max)} < 10% but this output's "
                                f"is {_pct(v)} > 50%")
        elif v > noise and (v > _WARN_FACTOR * in_max):
            st.warns[k].append(f"Norm relative difference {_pct(v)} is over 10x the inputs' ({_pct(in_max)})")


def _cosine_rule(st: CompareState, ins: list[int], outs: list[int]) -> None:
    rows, tr = st.rows, st.tensor_rows
    in_cos = [rows[k].cosine for k in ins if tr[k] and not math.isnan(rows[k].cosine)]
    if not in_cos or min(in_cos) <= 0.9:
        return
    for k in outs:
        v = rows[k].cosine
        if tr[k] and not math.isnan(v) and min(in_cos) - v > 0.1:
            st.warns[k].append(f"inputs' Cosine > 0.9 but this output's is {_g(v)} (more than 0.1 lower)")


# 7 -------------------------------------------------------------------------------------------------
def messages(st: CompareState) -> None:
    """Each row's status (error, warning, unmatched) and its messages, errors first."""
    for k, r in enumerate(st.rows):
        if r.status == "unmatched":
            if r.target is None:
                r.messages.append("no target tensor matches this golden tensor")
            elif r.golden is None:
                r.messages.append("no golden node matches this node")
            else:
                r.messages.append(f"golden node {r.golden} has no slot {r.slot}")
            continue
        e, w = st.errors[k], st.warns[k]
        if e:
            r.status = "error"
        elif w:
            r.status = "warning"
        if e or w:
            r.messages = e + w + r.messages


def _g(x: float) -> str:
    return "N/A" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"


def _pct(frac: float) -> str:
    return f"{frac * 100:.4g}%"
