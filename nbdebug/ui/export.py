"""Self-contained HTML snapshots: the graph (interactive, drawn by nbdebug's front end with no kernel), the
hits and the statistics of every captured tensor, in one file that opens in a browser with no server.

The front end (``bundle_source()``) is inlined base64-encoded and imported from a ``blob:`` URL, so the file
fetches nothing; the data travel as JSON in ``<script type="application/json">`` blocks and
``nbdebugUI.renderStatic(el, snapshot)`` draws the graph from them. ``dbg.export_html(path)`` and an offline
session's ``export_html(path)`` call :func:`export_html`.

>>> page = page_html("t", "<p>hi</p>", [])
>>> page.startswith("<!DOCTYPE html>") and "http" not in page
True
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
from pathlib import Path
from typing import Any

from .frontend import bundle_source
from .graph_data import finite_extrema, fmt_number, format_shape
from .source import SourceView

STYLE = """
body { font: 13px system-ui, sans-serif; margin: 16px; color: #1f2328; }
h1 { font-size: 18px; } h2 { font-size: 15px; margin-top: 24px; }
table { border-collapse: collapse; font-size: 12px; }
th, td { border: 1px solid #d0d7de; padding: 2px 6px; text-align: left; }
th { background: #f6f8fa; position: sticky; top: 0; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.bad td { background: #ffebe9; }
.nbdebug-export-graph { border: 1px solid #d0d7de; min-height: 200px; }
.note { color: #57606a; }
"""

#: Loads the inlined front end and draws every ``[data-nbdebug-snapshot]`` element with renderStatic.
LOADER = """
const b64 = document.getElementById("nbdebug-ui-src").textContent.trim();
const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
const url = URL.createObjectURL(new Blob([bytes], { type: "text/javascript" }));
const ui = await import(url);
globalThis.nbdebugUI = ui;
window.nbdebugRendered = [];
for (const el of document.querySelectorAll("[data-nbdebug-snapshot]")) {
  const data = JSON.parse(document.getElementById(el.dataset.nbdebugSnapshot).textContent);
  ui.renderStatic(el, data);
  window.nbdebugRendered.push(el.id);
}
"""


def _json_block(id_: str, data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, default=str).replace("<", "\\u003c")
    return f'<script type="application/json" id="{id_}">{text}</script>'


def page_html(title: str, body: str, snapshots: list[tuple[str, dict[str, Any]]], bundle: str | None = None) -> str:
    """One HTML page: ``body`` plus, when ``snapshots`` (element id, widget snapshot) are given, the inlined
    front end drawing each of them into ``<div id=...>`` elements that ``body`` contains."""
    parts = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
             f"<style>{STYLE}</style></head><body>", body]
    if snapshots:
        src = bundle if bundle is not None else bundle_source()
        parts.append(f'<script type="text/plain" id="nbdebug-ui-src">'
                     f"{base64.b64encode(src.encode('utf-8')).decode('ascii')}</script>")
        for id_, snap in snapshots:
            parts.append(_json_block(f"{id_}-data", _clean(snap)))
        parts.append(f'<script type="module">{LOADER}</script>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _clean(value: Any) -> Any:
    """JSON-safe copy (non-finite floats become strings)."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    return value


def graph_div(id_: str, height: int = 520) -> str:
    return (f'<div id="{id_}" class="nbdebug-export-graph" data-nbdebug-snapshot="{id_}-data" '
            f'style="height:{height}px"></div>')


def graph_html(snapshot: dict[str, Any], title: str = "nbdebug graph") -> str:
    """A page with just the graph of one widget ``snapshot`` (``GraphView.export``)."""
    body = f"<h1>{html.escape(title)}</h1>" + graph_div("nbdebug-graph")
    return page_html(title, body, [("nbdebug-graph", snapshot)])


# -- tables ------------------------------------------------------------------------------------------

def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None,
           numeric: set[int] = frozenset()) -> str:
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in header) + "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        cls = f' class="{classes[i]}"' if classes and classes[i] else ""
        cells = "".join(f'<td{" class=num" if j in numeric else ""}>{html.escape(str(c))}</td>'
                        for j, c in enumerate(row))
        out.append(f"<tr{cls}>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


#: hit groups (node and condition) and notices listed in an export; the titles count them all
MAX_EXPORT_GROUPS = 200


def hits_html(src: SourceView) -> str:
    """The hits grouped by node and condition (execution order of their first hit: how many, which steps,
    what fired first) with a summary per condition, and apart the conditions that could not be checked; at
    most :data:`MAX_EXPORT_GROUPS` rows each, so thousands of hits stay a short table."""
    from .hits import group_hits, steps_text, summary_text

    hits = [h for h in src.hits if h.hits]
    unchecked = [h for h in src.hits if not h.hits]
    groups = group_hits(hits)
    out = [f"<h2>Hits ({len(hits)})</h2>"]
    if hits:
        out.append(f"<p class='note'>{html.escape(summary_text(hits))}; grouped by node and condition</p>")
        out.append(_table(["node", "condition", "hits", "steps", "slots", "first"],
                          [[node, cond, len(hs), steps_text([h.step for h in hs]),
                            ", ".join(dict.fromkeys(h.slot for h in hs)), hs[0].describe()]
                           for (node, cond), hs in groups[:MAX_EXPORT_GROUPS]], numeric={2}))
        if len(groups) > MAX_EXPORT_GROUPS:
            out.append(f"<p class='note'>first {MAX_EXPORT_GROUPS} of {len(groups)} groups listed</p>")
    else:
        out.append("<p class='note'>no watchpoint hit</p>")
    if unchecked:
        out.append(f"<h2>Could not check ({len(unchecked)})</h2>")
        out.append(_table(["step", "node", "slot", "condition", "why"],
                          [[h.step, h.node, h.slot, h.condition, h.describe()]
                           for h in unchecked[:MAX_EXPORT_GROUPS]]))
        if len(unchecked) > MAX_EXPORT_GROUPS:
            out.append(f"<p class='note'>first {MAX_EXPORT_GROUPS} of {len(unchecked)} listed</p>")
    return "".join(out)


STAT_COLUMNS = ["node", "slot", "shape", "dtype", "max", "min", "mean", "NaN", "+Inf", "−Inf"]


def stats_rows(src: SourceView) -> list[list[str]]:
    """One row per captured tensor of the current step: shape, dtype, finite max/min/mean, NaN/Inf counts."""
    rows = []
    for node in src.graph.in_order():
        for slot in sorted(node.shapes):
            try:
                st = src.stats(node.name, slot)
            except Exception:  # noqa: BLE001 - not captured in this step
                continue
            rows.append([node.name, slot, format_shape(st.get("shape")), str(st.get("dtype", "")),
                         *(fmt_number(v) for v in finite_extrema(src, node.name, slot, st)),
                         *(fmt_number(st.get(k, 0)) for k in ("nan_count", "pos_inf_count", "neg_inf_count"))])
    return rows


def stats_html(src: SourceView) -> str:
    rows = stats_rows(src)
    bad = ["bad" if any(r[i] not in ("0", "–") for i in (7, 8, 9)) else "" for r in rows]
    return (f"<h2>Node statistics, step {src.step} ({len(rows)} tensors)</h2>"
            + (_table(STAT_COLUMNS, rows, bad, numeric={4, 5, 6, 7, 8, 9}) if rows
               else "<p class='note'>no statistics captured</p>"))


MAX_CELLS = 64


def tensors_html(tensors: list[tuple[str, Any]]) -> str:
    """Viewed tensor slices (title, 2-D array) as tables of their values (the first 64×64)."""
    import numpy as np

    out = []
    for title, arr in tensors:
        a = np.asarray(arr)
        a = a.reshape(1, -1) if a.ndim < 2 else a
        part = a[:MAX_CELLS, :MAX_CELLS]
        note = (f" (first {part.shape[0]}×{part.shape[1]} of {a.shape[0]}×{a.shape[1]})"
                if part.shape != a.shape else "")
        rows = [[str(i)] + [fmt_number(v.item()) for v in row] for i, row in enumerate(part)]
        out.append(f"<h3>{html.escape(title)}{html.escape(note)}</h3>"
                   + _table([""] + [str(j) for j in range(part.shape[1])], rows,
                            numeric=set(range(1, part.shape[1] + 1))))
    return (f"<h2>Viewed tensors ({len(tensors)})</h2>" + "".join(out)) if tensors else ""


def viewed_tensor(tv: Any) -> list[tuple[str, Any]]:
    """The slice a panel's tensor view shows now, as ``[(title, 2-D array)]`` (empty when it is closed)."""
    from .tensor_math import parse_selection, select

    if not getattr(tv, "visible", False) or getattr(tv, "node", None) is None:
        return []
    values = tv.values()
    if values is None:
        return []
    sel = tv.selection
    part = select(values, parse_selection(sel, values.shape))
    return [(f"{tv.node} {tv.slot}, step {tv.step}, {tv.mode.value}, [{', '.join(sel)}]", part)]


def export_html(source: Any, path: str | Path, *, graph: Any = None,
                tensors: list[tuple[str, Any]] | None = None) -> Path:
    """Write one self-contained HTML file for ``source`` (a Debugger or an offline session): the graph
    (interactive, no kernel needed), the hits, the statistics of every tensor of the current step, and
    ``tensors`` (viewed slices: title, 2-D array).

    ``graph``: a :class:`~nbdebug.ui.graph_view.GraphView` whose open scopes and selection to keep
    (default: a fresh one, scopes collapsed)."""
    p = Path(path)
    if p.suffix.lower() not in (".html", ".htm"):
        raise ValueError(f"export_html writes an .html file; got {p.name!r}")
    src = SourceView(source)
    if graph is None:
        from .graph_view import GraphView

        graph = GraphView(src)
        snap = graph.snapshot()
        graph.widget.close()
    else:
        snap = graph.snapshot()
    s = src.session
    what = f"{getattr(s, 'framework', '')} {getattr(s, 'framework_version', '')}".strip()
    title = f"nbdebug — {what or 'session'}, step {src.step}"
    header = (f"<h1>{html.escape(title)}</h1><p class='note'>state {html.escape(src.state)} · "
              f"{len(src.graph)} nodes · written {_dt.datetime.now().isoformat(timespec='seconds')}</p>")
    from .timeline_view import timeline_export

    timeline, timeline_snaps = timeline_export(src)  # the run's series over its steps (plotly.js inlined)
    body = (header + "<h2>Graph</h2>" + graph_div("nbdebug-graph") + timeline + hits_html(src)
            + tensors_html(tensors or []) + stats_html(src))
    p.write_text(page_html(title, body, [("nbdebug-graph", snap), *timeline_snaps]), encoding="utf-8")
    return p
