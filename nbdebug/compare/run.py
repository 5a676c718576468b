"""``nbdebug.compare(target, golden)``: compare two runs tensor by tensor, down to the first divergence.

Each side is a dump path, an :class:`~nbdebug.offline.OfflineSession`, a live
:class:`~nbdebug.Debugger` or a :class:`~nbdebug.session.session.Session`. Nodes are matched (see
:mod:`nbdebug.compare.mapping`), then their tensors by slot. A matched pair is compared

* in **tensor** mode when both values are available (dump files, retained values): msProbe's Cosine,
  EucDist, MaxAbsErr, MaxRelativeErr and the One/Five Thousandths Err Ratios;
* in **statistics** mode otherwise: differences of Max/Min/Mean/Norm and their relative differences
  ``|stat(N) − stat(B)| / |stat(B)| · 100%``.

Flags (REFERENCE §4). **Error**: the target's Max or Min is NaN/±Inf where the golden's are finite; dtype or
shape differ; a node whose inputs agree (One Thousandth Err Ratio > 0.9 on every input) has an output with a
ratio < 0.6; a node whose inputs' Norm relative difference is < 10% has an output above 50%.
**Warning**: an output's Norm relative difference is at least 10× its inputs' largest one (and above the
``noise`` floor, 0.1%, which keeps float rounding from firing it); in tensor mode, inputs with Cosine > 0.9
and an output whose Cosine is more than 0.1 lower. A tensor also gets a warning when it **diverges**:
Cosine ≤ ``cosine_min`` (0.99) or MaxAbsErr > ``atol`` · max(1, max |golden|) (0.001, msProbe's guidance)
in tensor mode; a Max/Min/Mean/Norm difference above ``rtol`` (0.1%) of the golden tensor's magnitude in
statistics mode.

``first_divergence``: the earliest target node in execution order with a flagged output while none of
its data inputs (``input.*`` slots; parameters do not count) is flagged.
Example (with dumps on disk)::

    import nbdebug
    res = nbdebug.compare("ms_dump/step0", "pt_dump/step0")
    res.first_divergence, res.to_csv("compare.csv")
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..dump.names import parse_name
from ..frameworks.registry import find_backend
from ..session.stats import COL
from ..session.store import NotRetainedError
from .fusion import bias_fusions, fuse
from .mapping import NodeDesc, canonical_slot, framework_of_names, match_nodes
from .metrics import TensorMetrics, stats_diff, tensor_metrics
from .result import CompareResult, CompareRow, Divergence

_STAT_COLS = [COL["max"], COL["min"], COL["mean"], COL["norm"]]
_INPUT_RATIO_MIN, _OUTPUT_RATIO_MAX = 0.9, 0.6
_IN_NORM_MAX, _OUT_NORM_MIN = 0.1, 0.5
_WARN_FACTOR = 10.0


def _as_session(x: Any) -> tuple[Any, Any]:
    """(session, owner) for a path, OfflineSession, Debugger or Session."""
    if isinstance(x, (str, os.PathLike)):
        from ..dump.load import load

        off = load(x)
        return off.session, off
    sess = getattr(x, "session", None)
    if sess is not None and hasattr(sess, "steps"):
        return sess, x
    if hasattr(x, "steps") and hasattr(x, "graph") and hasattr(x, "table"):
        return x, x
    raise TypeError(f"compare() takes dump paths, nbdebug.load() results, Debuggers or Sessions, got "
                    f"{type(x).__name__}")


def _steps_of(sess: Any) -> list[int]:
    steps = sorted(sess.steps)
    rec = getattr(sess, "recorder", None)
    if rec is not None and len(rec) and getattr(sess, "live", False):
        steps.append(sess.step_index)
    return steps


def _pick_steps(t: Any, g: Any, step: int | None, golden_step: int | None) -> tuple[int, int]:
    ts, gs = _steps_of(t), _steps_of(g)
    if not ts:
        raise ValueError("the target run has no step with statistics")
    if not gs:
        raise ValueError("the golden run has no step with statistics")
    if step is None and golden_step is None:
        common = sorted(set(ts) & set(gs))
        return (common[0], common[0]) if common else (ts[0], gs[0])
    if step is None:
        step = golden_step if golden_step in ts else ts[0]
    if golden_step is None:
        golden_step = step if step in gs else gs[0]
    if step not in ts:
        raise ValueError(f"the target run has no step {step}; it has {ts}")
    if golden_step not in gs:
        raise ValueError(f"the golden run has no step {golden_step}; it has {gs}")
    return int(step), int(golden_step)


def _framework(sess: Any, names: list[str]) -> str:
    found = find_backend(str(getattr(sess, "framework", "") or ""))
    return found.name if found is not None else framework_of_names(names)


def _rows_by_node(table: Any) -> tuple[list[str], dict[str, list[tuple[str, int]]]]:
    order: list[str] = []
    by: dict[str, list[tuple[str, int]]] = {}
    for i, (node, slot) in enumerate(table.keys):
        lst = by.get(node)
        if lst is None:
            lst = by[node] = []
            order.append(node)
        lst.append((slot, i))
    return order, by


def _descs(sess: Any, table: Any, order: list[str], by: dict[str, list[tuple[str, int]]],
           fused: dict[str, tuple[str, str]]) -> list[NodeDesc]:
    out = []
    nodes = sess.graph.nodes
    for name in order:
        node = nodes.get(name)
        info = parse_name(name)
        kind = node.kind if node is not None else info.kind
        section = node.section if node is not None else ("backward" if info.direction != "forward" else "forward")
        op_type = node.op_type if node is not None else info.op_type
        outs = tuple(table.shapes[i] for s, i in by[name] if not s.startswith(("input", "parameters")))
        desc = NodeDesc(name, kind, section, op_type, outs, node.scope if node is not None else None)
        if name in fused:
            desc.api = fused[name][1]
        out.append(desc)
    return out


def _value(sess: Any, step: int, node: str, slot: str) -> np.ndarray | None:
    files = getattr(sess, "files", None)
    if files is not None and (node, slot) not in files.get(step, {}):
        return None
    try:
        return np.asarray(sess.tensor(node, slot, step))
    except (NotRetainedError, KeyError, ValueError):
        return None


def compare(target: Any, golden: Any, match: str = "exact",
            mapping: Mapping[str, str] | Callable[[str], str | None] | None = None, *,
            step: int | None = None, golden_step: int | None = None, mode: str = "auto",
            cosine_min: float = 0.99, atol: float = 1e-3, rtol: float = 1e-3, noise: float = 1e-3) -> CompareResult:
    """Compare ``target`` with ``golden`` (dump paths, loaded dumps, Debuggers or Sessions).

    Parameters
    ----------
    match: ``"exact"`` names (MindSpore ↔ PyTorch names are mapped automatically), ``"fuzzy"`` (ignore call
        counts, align by order) or ``"structural"`` (align by graph position, op type and shapes).
    mapping: extra ``{target name: golden name}`` pairs (a trailing ``*`` maps a prefix), or a callable.
    step, golden_step: which steps to compare (default: the first step both runs have).
    mode: ``"auto"`` (tensor metrics where both values are available), ``"tensor"`` or ``"statistics"``.
    cosine_min, atol, rtol, noise: divergence thresholds (see the module docstring).
    """
    if mode not in ("auto", "tensor", "statistics"):
        raise ValueError(f"mode must be 'auto', 'tensor' or 'statistics', got {mode!r}")
    tsess, _ = _as_session(target)
    gsess, _ = _as_session(golden)
    ts, gs = _pick_steps(tsess, gsess, step, golden_step)
    ttab, gtab = tsess.table(ts), gsess.table(gs)
    t_order, t_by = _rows_by_node(ttab)
    g_order, g_by = _rows_by_node(gtab)
    tfw, gfw = _framework(tsess, t_order), _framework(gsess, g_order)
    cross = tfw != gfw
    t_fused = bias_fusions(tsess, tfw, t_order, t_by, ttab.shapes) if cross else {}
    g_fused = bias_fusions(gsess, gfw, g_order, g_by, gtab.shapes) if cross else {}
    t_src, g_src = fuse(t_fused, t_order, t_by), fuse(g_fused, g_order, g_by)  # (node, slot) -> where its value is
    pairs, un_t, un_g = match_nodes(_descs(tsess, ttab, t_order, t_by, t_fused),
                                    _descs(gsess, gtab, g_order, g_by, g_fused),
                                    how=match, mapping=mapping, target_framework=tfw, golden_framework=gfw,
                                    cross=cross)
    pair_of = {t: (g, how) for t, g, how in pairs}

    # -- rows ---------------------------------------------------------------------------------------
    rows: list[CompareRow] = []
    ti: list[int] = []  # target table row of each CompareRow (-1: none)
    gi: list[int] = []
    for order, node in enumerate(t_order):
        pg = pair_of.get(node)
        if pg is None:
            for slot, i in t_by[node]:
                rows.append(CompareRow(node, None, slot, None, status="unmatched", order=order))
                ti.append(i)
                gi.append(-1)
            continue
        gname, how = pg
        g_slots = {canonical_slot(s, gfw, cross): (s, i) for s, i in g_by[gname]}
        for slot, i in t_by[node]:
            hit = g_slots.pop(canonical_slot(slot, tfw, cross), None)
            if hit is None:
                rows.append(CompareRow(node, gname, slot, None, status="unmatched", order=order, matched_by=how))
                ti.append(i)
                gi.append(-1)
            else:
                row = CompareRow(node, gname, slot, hit[0], order=order, matched_by=how)
                for side, fw, key in (("target", tfw, (node, slot)), ("golden", gfw, (gname, hit[0]))):
                    src = (t_src if side == "target" else g_src).get(key)
                    if src is not None:
                        row.messages.append(f"{side} value: {src[1]} of {src[0]} ({fw} adds the bias in an op "
                                            f"of its own)")
                rows.append(row)
                ti.append(i)
                gi.append(hit[1])
        for s, i in g_slots.values():  # golden slots with no target counterpart
            rows.append(CompareRow(None, gname, s, s, status="unmatched", order=order, matched_by=how))
            ti.append(-1)
            gi.append(i)
    end = len(t_order)
    for node in un_g:
        for slot, i in g_by[node]:
            rows.append(CompareRow(None, node, slot, slot, status="unmatched", order=end))
            ti.append(-1)
            gi.append(i)

    tia = np.asarray(ti, dtype=np.intp)
    gia = np.asarray(gi, dtype=np.intp)
    has_t, has_g = tia >= 0, gia >= 0
    both = has_t & has_g
    nan4 = np.full((len(rows), 4), np.nan)
    T = nan4.copy()
    G = nan4.copy()
    if len(ttab):
        T[has_t] = ttab.values[tia[has_t]][:, _STAT_COLS]
    if len(gtab):
        G[has_g] = gtab.values[gia[has_g]][:, _STAT_COLS]
    diff, rel = stats_diff(T, G)
    rel_frac = rel / 100.0

    t_dtypes, g_dtypes, t_shapes, g_shapes = ttab.dtypes, gtab.dtypes, ttab.shapes, gtab.shapes
    t_list, g_list, d_list, r_list = T.tolist(), G.tolist(), diff.tolist(), rel.tolist()
    for k, r in enumerate(rows):
        if has_t[k]:
            r.target_dtype, r.target_shape, r.target_stats = t_dtypes[ti[k]], t_shapes[ti[k]], tuple(t_list[k])
        if has_g[k]:
            r.golden_dtype, r.golden_shape, r.golden_stats = g_dtypes[gi[k]], g_shapes[gi[k]], tuple(g_list[k])
        if both[k]:
            r.stat_diff, r.stat_rel_pct = tuple(d_list[k]), tuple(r_list[k])

    # -- tensor metrics -------------------------------------------------------------------------------
    tensor_rows = np.zeros(len(rows), dtype=bool)
    if mode != "statistics":
        for k in np.flatnonzero(both).tolist():
            r = rows[k]
            a = _value(tsess, ts, *t_src.get((r.target, r.slot), (r.target, r.slot)))
            b = _value(gsess, gs, *g_src.get((r.golden, r.golden_slot), (r.golden, r.golden_slot))) \
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
            tensor_rows[k] = True
    for k, r in enumerate(rows):
        if both[k]:
            r.mode = "tensor" if tensor_rows[k] else "statistics"

    # -- flags --------------------------------------------------------------------------------------
    errors: list[list[str]] = [[] for _ in rows]
    warns: list[list[str]] = [[] for _ in rows]
    t_bad = ~np.isfinite(T[:, 0]) | ~np.isfinite(T[:, 1])
    g_fin = np.isfinite(G[:, 0]) & np.isfinite(G[:, 1])
    naninf = both & t_bad & g_fin & ~np.isnan(G[:, 0])
    for k in np.flatnonzero(naninf).tolist():
        errors[k].append(f"target Max/Min is NaN/Inf ({_g(T[k, 0])}, {_g(T[k, 1])}) where the golden's are finite")
    for k in np.flatnonzero(both).tolist():
        r = rows[k]
        if r.target_dtype != r.golden_dtype:
            errors[k].append(f"dtype differs: {r.target_dtype} vs golden {r.golden_dtype}")
        if r.target_shape != r.golden_shape:
            errors[k].append(f"shape differs: {list(r.target_shape or ())} vs golden {list(r.golden_shape or ())}")

    # divergence of single tensors
    scale = np.maximum(np.abs(G[:, 0]), np.abs(G[:, 1]))
    with np.errstate(invalid="ignore"):
        cos = np.array([r.cosine for r in rows])
        mae = np.array([r.max_abs_err for r in rows])
        tdiv = tensor_rows & ((cos <= cosine_min) | (mae > atol * np.maximum(1.0, np.nan_to_num(scale))))
        tol = rtol * np.stack([scale, scale, scale, np.abs(G[:, 3])], axis=1) + 1e-12
        sdiv = both & ~tensor_rows & np.any(np.abs(diff) > tol, axis=1)
        sdiv |= both & ~tensor_rows & np.any(np.isnan(diff) & ~(np.isnan(T) & np.isnan(G)), axis=1)
    for k in np.flatnonzero(tdiv | sdiv).tolist():
        r = rows[k]
        r.diverged = True
        if tensor_rows[k]:
            warns[k].append(f"differs from golden: Cosine {_g(r.cosine)}, MaxAbsErr {_g(r.max_abs_err)}")
        else:
            worst = int(np.nanargmax(np.where(np.isnan(rel[k]), -1, rel[k]))) if np.any(~np.isnan(rel[k])) else 3
            names = ("Max", "Min", "Mean", "Norm")
            warns[k].append(f"differs from golden: {names[worst]} {_g(T[k, worst])} vs {_g(G[k, worst])} "
                            f"({_g(rel[k, worst])}%)")

    # node-level rules: inputs agree, outputs do not
    is_in = [r.slot.startswith(("input", "parameters")) for r in rows]
    by_node: dict[str, list[int]] = {}
    for k in np.flatnonzero(both).tolist():
        by_node.setdefault(rows[k].target, []).append(k)
    for _node, ks in by_node.items():
        ins = [k for k in ks if is_in[k]]
        outs = [k for k in ks if not is_in[k]]
        if not ins or not outs:
            continue
        in_ratio = [rows[k].one_thousandth for k in ins if tensor_rows[k] and not math.isnan(rows[k].one_thousandth)]
        if in_ratio and min(in_ratio) > _INPUT_RATIO_MIN:
            for k in outs:
                v = rows[k].one_thousandth
                if tensor_rows[k] and not math.isnan(v) and v < _OUTPUT_RATIO_MAX:
                    errors[k].append(f"inputs agree (One Thousandth Err Ratio > {_INPUT_RATIO_MIN}) but this output's "
                                     f"is {_g(v)} < {_OUTPUT_RATIO_MAX}")
        in_norm = [rel_frac[k, 3] for k in ins if not math.isnan(rel_frac[k, 3])]
        if in_norm:
            in_max = max(in_norm)
            for k in outs:
                v = rel_frac[k, 3]
                if math.isnan(v):
                    continue
                if in_max < _IN_NORM_MAX and v > _OUT_NORM_MIN:
                    errors[k].append(f"inputs' Norm relative difference {_pct(in_max)} < 10% but this output's "
                                     f"is {_pct(v)} > 50%")
                elif v > noise and (v > _WARN_FACTOR * in_max):
                    warns[k].append(f"Norm relative difference {_pct(v)} is over 10x the inputs' ({_pct(in_max)})")
        in_cos = [rows[k].cosine for k in ins if tensor_rows[k] and not math.isnan(rows[k].cosine)]
        if in_cos and min(in_cos) > 0.9:
            for k in outs:
                v = rows[k].cosine
                if tensor_rows[k] and not math.isnan(v) and min(in_cos) - v > 0.1:
                    warns[k].append(f"inputs' Cosine > 0.9 but this output's is {_g(v)} (more than 0.1 lower)")

    for k, r in enumerate(rows):
        if r.status == "unmatched":
            if r.target is None:
                r.messages.append("no target tensor matches this golden tensor")
            elif r.golden is None:
                r.messages.append("no golden node matches this node")
            else:
                r.messages.append(f"golden node {r.golden} has no slot {r.slot}")
            continue
        e, w = errors[k], warns[k]
        if e:
            r.status = "error"
        elif w:
            r.status = "warning"
        if e or w:
            r.messages = e + w + r.messages

    first = _first_divergence(rows, t_order, tsess, ts)
    return CompareResult(rows, target=tsess, golden=gsess, target_step=ts, golden_step=gs, match=match, mode=mode,
                         unmatched_target=un_t, unmatched_golden=un_g, pairs=pairs, first_divergence=first,
                         target_framework=tfw, golden_framework=gfw)


def _first_divergence(rows: list[CompareRow], order: list[str], sess: Any, step: int) -> Divergence | None:
    flagged = ("error", "warning")
    by_node: dict[str, list[CompareRow]] = {}
    for r in rows:
        if r.target is not None:
            by_node.setdefault(r.target, []).append(r)
    for pos, node in enumerate(order):
        rs = by_node.get(node, [])
        outs = [r for r in rs if not r.is_input and r.status in flagged]
        if not outs:
            continue
        if any(r.slot.startswith("input") and r.status in flagged for r in rs):
            continue
        info = parse_name(node)
        gnode = sess.graph.nodes.get(node)
        layer = info.path if info.path else (gnode.scope.replace("/", ".") if gnode is not None else "")
        reasons = tuple(m for r in outs for m in r.messages)
        return Divergence(node, outs[0].golden, step, pos, tuple(r.slot for r in outs), reasons, layer)
    return None


def _g(x: float) -> str:
    return "N/A" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.6g}"


def _pct(frac: float) -> str:
    return f"{frac * 100:.4g}%"
