"""The panel's last state as plain HTML, for a saved notebook opened without a kernel (nbviewer, GitHub).

A live panel is a widget: without its kernel it cannot draw. Next to it the panel displays this
snapshot — header facts, watchpoints, hits grouped by node (with the "could not check" notices apart)
and the statistics of the nodes that matter — as a second output that it keeps up to date (throttled).
While the live widget is on the page, a style rule that only the widget carries hides the snapshot, so
a user sees it only where the widget is missing. No script, no external resource: static HTML only.

>>> from nbdebug.session.session import Session
>>> from nbdebug.ui.source import SourceView
>>> html = snapshot_html(SourceView(Session(framework="pytorch", live=False)))
>>> 'class="nbdebug-snapshot"' in html and "<script" not in html
True
"""

from __future__ import annotations

import html as _html
from collections import defaultdict
from typing import Any

from .source import last_step
from .tensor_math import node_stats, stat_texts

#: nodes listed with statistics (the ones with hits first, then the latest in execution order)
MAX_NODES = 40
#: style the live widget puts on the page: hides the snapshot output right after a drawn panel
HIDE_RULE = (".jp-OutputArea-child:has(.nbdebug-panel) + .jp-OutputArea-child:has(.nbdebug-snapshot),"
             " .jp-OutputArea-child:has(.nbdebug-panel) ~ .jp-OutputArea-child:has(.nbdebug-snapshot)"
             " {display: none;}")

#: statistics columns, NaN-aware like node details and the tensor view
SHOWN = ("max", "min", "mean", "nan_count", "pos_inf_count", "neg_inf_count")
_TABLE = "border-collapse:collapse;font-family:monospace;font-size:12px"


def _e(x: Any) -> str:
    return _html.escape(str(x))


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th align='left'>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<table cellpadding='3' style='{_TABLE}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")


def _header(src: Any) -> str:
    s = src.session
    step = last_step(s)
    fw = f"{getattr(s, 'framework', '?')} {getattr(s, 'framework_version', '')}".strip()
    where = getattr(s, "source_path", None) or (f"PID {getattr(s, 'pid', '?')}" if getattr(s, "live", False) else "")
    facts = [("Framework", fw), ("State", src.state), ("Step", step if step >= 0 else "—"),
             ("Nodes", len(src.graph)), ("Hits", sum(1 for h in src.hits if not h.error and h.hits))]
    if where:
        facts.insert(1, ("Source", where))
    return " &nbsp; ".join(f"<b>{_e(k)}</b> {_e(v)}" for k, v in facts)


def _hits(src: Any) -> tuple[str, list[str]]:
    by_node: dict[str, list[Any]] = defaultdict(list)
    notices = []
    for h in src.hits:
        (by_node[h.node] if (h.hits and not h.error) else notices).append(h)
    rows = []
    for node, hs in by_node.items():
        conds = " ".join(sorted({h.condition for h in hs}))
        steps = sorted({h.step for h in hs})
        detail = "; ".join(h.describe().split(" — ", 1)[-1] for h in hs[:3])
        rows.append([_e(node), _e(conds), _e(", ".join(map(str, steps[:8]))), _e(detail)])
    out = f"<h4 style='margin:8px 0 4px'>Hits ({sum(len(v) for v in by_node.values())})</h4>"
    out += _table(["node", "conditions", "steps", "what fired"], rows) if rows else "<i>no hits</i>"
    if notices:
        out += (f"<details><summary>{len(notices)} could not be checked</summary>"
                + _table(["node", "slot", "step", "why"],
                         [[_e(h.node), _e(h.slot), _e(h.step), _e(h.error or ", ".join(h.unchecked))]
                          for h in notices[:50]]) + "</details>")
    return out, list(by_node)  # execution order (hits are sorted by step, then order)


def _watchpoints(src: Any) -> str:
    wps = list(src.watchpoints.watchpoints.values())
    if not wps:
        return ""
    rows = [[_e(wp.id), _e(f"{wp.condition} ({wp.name})"),
             _e(", ".join(f"{k}={v}" for k, v in wp.params.items())),
             _e(", ".join(wp.nodes) if wp.nodes is not None else f"all {wp.category}"),
             _e("on" if wp.enabled else "off")] for wp in wps]
    return "<h4 style='margin:8px 0 4px'>Watchpoints</h4>" + _table(["#", "condition", "parameters", "nodes", ""],
                                                                     rows)


def _nodes(src: Any, first: list[str]) -> str:
    names = [n for n in first if n in src.graph.nodes][:MAX_NODES // 2]
    seen = set(names)
    for node in reversed(src.graph.in_order()):
        if len(names) >= MAX_NODES:
            break
        if node.name not in seen:
            names.append(node.name)
    rows = []
    for name in names[:MAX_NODES]:
        node = src.graph.nodes[name]
        for slot in list(node.shapes)[:2] or ["output.0"]:
            st = node_stats(src, name, slot)  # what node details and the tensor view show
            if "error" in st:
                continue
            txt = stat_texts(st, SHOWN)
            rows.append([_e(name), _e(slot), _e(node.dtypes.get(slot, "")), _e(node.shapes.get(slot, ""))]
                        + [_e(txt[f]) for f in SHOWN])
    if not rows:
        return ""
    return ("<h4 style='margin:8px 0 4px'>Node statistics (current step)</h4>"
            + _table(["node", "slot", "dtype", "shape", "max (finite)", "min (finite)", "mean (finite)", "NaN",
                      "+Inf", "−Inf"], rows))


def snapshot_html(src: Any) -> str:
    """Static HTML of what the panel over ``src`` (a :class:`~nbdebug.ui.source.SourceView`) shows now."""
    hits, hit_nodes = _hits(src)
    parts = [
        "<div class=\"nbdebug-snapshot\" style='border:1px solid #d0d7de;padding:6px;font-size:13px'>",
        "<div style='color:#57606a;font-size:11px'>nbdebug panel — saved state (the live panel needs its "
        "kernel)</div>",
        f"<div>{_header(src)}</div>", _watchpoints(src), hits, _nodes(src, hit_nodes), "</div>",
    ]
    return "".join(parts)
