"""The panel's last state as plain HTML, for a saved notebook opened without a kernel (nbviewer, GitHub).

A live panel is a widget: without its kernel it cannot draw. Next to it the panel displays this
snapshot — header facts, a static SVG of the graph as the panel showed it (:mod:`nbdebug.ui.graph_svg`),
watchpoints, hits summarised by node and condition (at most :data:`MAX_HIT_GROUPS` groups, the
"could not check" notices apart) and the statistics of the nodes that matter — as a second output that it
keeps up to date (throttled). While the live widget is on the page, a style rule that only the widget
carries hides the snapshot, so a user sees it only where the widget is missing; the snapshot's own rule
hides the output before it when that holds no panel (JupyterLab's "Error displaying widget: model not
found" of a notebook reopened without its kernel). Tables are left-aligned inline (JupyterLab right-aligns
rendered tables). No script, no external resource: static HTML only.

>>> from nbdebug.session.session import Session
>>> from nbdebug.ui.source import SourceView
>>> html = snapshot_html(SourceView(Session(framework="pytorch", live=False)))
>>> 'class="nbdebug-snapshot"' in html and "<script" not in html
True
"""

from __future__ import annotations

import html as _html
from typing import Any

from .graph_svg import graph_svg
from .hits import group_hits, steps_text, summary_text
from .source import last_step
from .tensor_math import node_stats, stat_texts

#: nodes listed with statistics (the ones with hits first, then the latest in execution order)
MAX_NODES = 40
#: style the live widget puts on the page: hides the snapshot output right after a drawn panel
HIDE_RULE = (".jp-OutputArea-child:has(.nbdebug-panel) + .jp-OutputArea-child:has(.nbdebug-snapshot),"
             " .jp-OutputArea-child:has(.nbdebug-panel) ~ .jp-OutputArea-child:has(.nbdebug-snapshot)"
             " {display: none;}")

#: style the snapshot carries: the output right before it, when it holds no drawn panel (a widget whose
#: model is gone: "Error displaying widget: model not found", or still loading), is not shown
ERROR_RULE = (".jp-OutputArea-child:not(:has(.nbdebug-panel, .nbdebug-job-panel))"
              ":has(+ .jp-OutputArea-child .nbdebug-snapshot)"
              " {display: none;}")
#: style the live widget puts on the page: the output area holding a panel is never a short scrolling box
#: (Notebook 7 turns on output scrolling, 24em, when the outputs grow tall: the snapshot before the panel is)
UNSCROLL_RULE = (".jp-CodeCell.jp-mod-outputsScrolled .jp-Cell-outputArea:has(.nbdebug-panel)"
                 " {max-height: none; overflow-y: visible;}")
#: hit groups (node and condition) listed; the title counts them all
MAX_HIT_GROUPS = 30

#: statistics columns, NaN-aware like node details and the tensor view
SHOWN = ("max", "min", "mean", "nan_count", "pos_inf_count", "neg_inf_count")
_TABLE = "border-collapse:collapse;font-family:monospace;font-size:12px"


def _e(x: Any) -> str:
    return _html.escape(str(x))


_LEFT = "text-align:left;vertical-align:top"


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th align='left' style='{_LEFT}'>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td style='{_LEFT}'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return (f"<table cellpadding='3' style='{_TABLE}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")


def _header(src: Any) -> str:
    s = src.session
    step = last_step(s)
    fw = f"{getattr(s, 'framework', '?')} {getattr(s, 'framework_version', '')}".strip()
    where = getattr(s, "source_path", None) or (f"PID {getattr(s, 'pid', '?')}" if getattr(s, "live", False) else "")
    facts = [("Framework", fw), ("State", src.state), ("Step", step if step >= 0 else "–"),
             ("Nodes", len(src.graph)), ("Hits", sum(1 for h in src.hits if not h.error and h.hits))]
    if where:
        facts.insert(1, ("Source", where))
    return " &nbsp; ".join(f"<b>{_e(k)}</b> {_e(v)}" for k, v in facts)


def _hits(src: Any) -> tuple[str, list[str]]:
    hits, notices = [], []
    for h in src.hits:
        (hits if (h.hits and not h.error) else notices).append(h)
    groups = group_hits(hits)
    rows = []
    for (node, cond), hs in groups[:MAX_HIT_GROUPS]:
        detail = "; ".join(h.describe().split(" — ", 1)[-1] for h in hs[:2])
        rows.append([_e(node), _e(cond), _e(len(hs)), _e(steps_text([h.step for h in hs])), _e(detail)])
    out = f"<h4 style='margin:8px 0 4px'>Hits ({len(hits)})</h4>"
    if len(groups) > 1:
        out += f"<div style='color:#57606a'>{_e(summary_text(hits))}</div>"
    out += _table(["node", "condition", "hits", "steps", "what fired"], rows) if rows else "<i>no hits</i>"
    if len(groups) > MAX_HIT_GROUPS:
        out += f"<div style='color:#57606a'>… {len(groups) - MAX_HIT_GROUPS} more nodes with hits</div>"
    if notices:
        out += (f"<details><summary>{len(notices)} could not be checked</summary>"
                + _table(["node", "slot", "step", "why"],
                         [[_e(h.node), _e(h.slot), _e(h.step), _e(h.error or ", ".join(h.unchecked))]
                          for h in notices[:20]]) + "</details>")
    return out, list(dict.fromkeys(node for (node, _c), _hs in groups))  # execution order


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


def _graph(graph: Any) -> str:
    if graph is None:
        return ""
    try:
        svg = graph_svg(graph)
    except Exception as e:  # noqa: BLE001 - the rest of the snapshot is still worth saving
        return f"<div style='color:#cf222e'>graph not drawn: {_e(e)}</div>"
    return ("<h4 style='margin:8px 0 4px'>Graph (as the panel showed it)</h4>"
            f"<div style='overflow:auto;max-height:520px;border:1px solid #d0d7de'>{svg}</div>")


def snapshot_html(src: Any, graph: Any = None) -> str:
    """Static HTML of what the panel over ``src`` (a :class:`~nbdebug.ui.source.SourceView`) shows now;
    ``graph``: the panel's :class:`~nbdebug.ui.graph_view.GraphView`, drawn as a static SVG."""
    hits, hit_nodes = _hits(src)
    parts = [
        f"<style>{ERROR_RULE}</style>",
        "<div class=\"nbdebug-snapshot\" style='border:1px solid #d0d7de;padding:6px;font-size:13px;"
        "text-align:left'>",
        "<div style='color:#57606a;font-size:11px'>nbdebug panel — saved state (the live panel needs its "
        "kernel)</div>",
        f"<div>{_header(src)}</div>", _graph(graph), _watchpoints(src), hits, _nodes(src, hit_nodes), "</div>",
    ]
    return "".join(parts)
