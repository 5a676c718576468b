"""``nbdebug.compare(target, golden)``: compare two runs tensor by tensor, down to the first divergence.

Each side is a dump path, an :class:`~nbdebug.offline.OfflineSession`, a live
:class:`~nbdebug.Debugger` or a :class:`~nbdebug.session.session.Session`. Nodes are matched (see
:mod:`nbdebug.compare.mapping`), then their tensors by slot. A matched pair is compared

* in **tensor** mode when both values are available (dump files, retained values): msProbe's Cosine,
  EucDist, MaxAbsErr, MaxRelativeErr and the One/Five Thousandths Err Ratios;
* in **statistics** mode otherwise: differences of Max/Min/Mean/Norm and their relative differences
  ``|stat(N) − stat(B)| / |stat(B)| · 100%``.

Flags (msProbe's compare rules). **Error**: the target's Max or Min is NaN/±Inf where the golden's are finite; dtype or
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

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ..dump.names import parse_name
from ..session.store import NotRetainedError
from .passes import _Side, fill_stats, flag_tensors, messages, node_rules, pair_nodes, pair_rows, tensor_pass
from .result import CompareResult, CompareRow, Divergence


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

    The work is a sequence of numbered passes over one :class:`~nbdebug.compare.passes.CompareState`
    (:mod:`nbdebug.compare.passes`): pair the nodes, pair their rows, fill the statistics, tensor metrics,
    per-tensor flags, node rules, messages.
    """
    if mode not in ("auto", "tensor", "statistics"):
        raise ValueError(f"mode must be 'auto', 'tensor' or 'statistics', got {mode!r}")
    tsess, _ = _as_session(target)
    gsess, _ = _as_session(golden)
    ts, gs = _pick_steps(tsess, gsess, step, golden_step)
    st = pair_nodes(_Side(tsess, ts), _Side(gsess, gs), match, mapping)   # 1
    pair_rows(st)                                                         # 2
    fill_stats(st)                                                        # 3
    if mode != "statistics":
        tensor_pass(st, mode, _value)                                     # 4
    flag_tensors(st, cosine_min, atol, rtol)                              # 5
    node_rules(st, noise)                                                 # 6
    messages(st)                                                          # 7
    rows = st.rows
    first = _first_divergence(rows, st.t.order, tsess, ts)
    return CompareResult(rows, target=tsess, golden=gsess, target_step=ts, golden_step=gs, match=match, mode=mode,
                         unmatched_target=st.unmatched_t, unmatched_golden=st.unmatched_g, pairs=st.pairs,
                         first_divergence=first, target_framework=st.t.framework, golden_framework=st.g.framework)


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
