"""A static SVG of what a graph view shows (its open scopes, its sections), for places with no script: the
panel's saved-notebook snapshot (:mod:`nbdebug.ui.snapshot`).

The browser lays the live graph out with elkjs; here a small layered layout is enough: the items the view
shows (:meth:`~nbdebug.ui.graph_view.GraphView.visible_keys`: nodes, and collapsed scopes as one box), one
band per section, each item one column right of the items it reads, edges as lines, hit badges in red.
At most :data:`MAX_ITEMS` items (in execution order), so a snapshot stays small whatever the graph.

>>> from nbdebug.session.session import Session
>>> from nbdebug.ui.graph_view import GraphView
>>> s = Session(framework="pytorch", live=False)
>>> _ = s.graph.add_node("Input.0", kind="input", op_type="input")
>>> svg = graph_svg(GraphView(s))
>>> svg.startswith("<svg") and "Input.0" in svg and "<script" not in svg
True
"""

from __future__ import annotations

import html
from typing import Any

from .graph_data import ROOTS, key_chain

MAX_ITEMS = 160
BOX_W, BOX_H, GAP_X, GAP_Y, BAND_GAP = 150, 26, 36, 10, 28
COLOURS = {"op": "#ddf4ff", "module": "#dafbe1", "parameter": "#fff8c5", "gradient": "#fbefff",
           "optimizer": "#ffebe9", "input": "#eaeef2", "scope": "#f6f8fa"}


def _items(gv: Any) -> tuple[list[str], dict[int, str]]:
    """The shown items in execution order, and the item each node id is drawn in."""
    shown = gv.visible_keys()[:MAX_ITEMS]
    keep = set(shown)
    exp = gv.expanded
    item_of: dict[int, str] = {}
    for i, row in enumerate(gv.feed.rows):
        name, key = row[0], row[3]
        item = name
        for k in key_chain(key)[1:]:
            if k not in exp:
                item = k
                break
        if item in keep:
            item_of[i] = item
    return shown, item_of


def _layers(items: list[str], edges: set[tuple[str, str]]) -> dict[str, int]:
    pos = {k: i for i, k in enumerate(items)}
    layer = dict.fromkeys(items, 0)
    preds: dict[str, list[str]] = {}
    for a, b in edges:
        if pos[a] < pos[b]:  # execution order breaks cycles
            preds.setdefault(b, []).append(a)
    for k in items:
        for a in preds.get(k, ()):
            layer[k] = max(layer[k], layer[a] + 1)
    return layer


def _label(text: str, n: int = 22) -> str:
    return text if len(text) <= n else "…" + text[-(n - 1):]


def graph_svg(gv: Any) -> str:
    """The SVG (a string) of graph view ``gv`` as it is now: what its browser view shows, statically."""
    gv.refresh()
    items, item_of = _items(gv)
    rows = {r[0]: r for r in gv.feed.rows}
    scopes = gv.feed.scopes
    badges: dict[str, set[str]] = {}
    for i, text in (gv.marks().get("badges") or {}).items():
        item = item_of.get(int(i))
        if item is not None:
            badges.setdefault(item, set()).update(str(text).split())
    edges: set[tuple[str, str]] = set()
    e = gv.feed.edges
    for j in range(0, len(e) - 1, 2):
        a, b = item_of.get(e[j]), item_of.get(e[j + 1])
        if a is not None and b is not None and a != b:
            edges.add((a, b))

    def section(item: str) -> str:
        return (item if item in scopes else rows[item][3]).split(":", 1)[0]

    layer = _layers(items, edges)
    xy: dict[str, tuple[int, int]] = {}
    parts: list[str] = []
    top, width = 0, 0
    for sec in [r.rstrip(":") for r in ROOTS]:
        mine = [k for k in items if section(k) == sec]
        if not mine:
            continue
        base = min(layer[k] for k in mine)
        fill: dict[int, int] = {}
        parts.append(f"<text x='4' y='{top + 14}' font-weight='bold' fill='#57606a'>{sec}</text>")
        top += 20
        for k in mine:
            col = layer[k] - base
            row = fill.get(col, 0)
            fill[col] = row + 1
            xy[k] = (8 + col * (BOX_W + GAP_X), top + row * (BOX_H + GAP_Y))
        height = max(fill.values()) * (BOX_H + GAP_Y)
        width = max(width, 8 + (max(fill) + 1) * (BOX_W + GAP_X))
        top += height + BAND_GAP
    lines = [f"<line x1='{xy[a][0] + BOX_W}' y1='{xy[a][1] + BOX_H // 2}' x2='{xy[b][0]}' "
             f"y2='{xy[b][1] + BOX_H // 2}'/>" for a, b in sorted(edges) if section(a) == section(b)]
    boxes = []
    for k in items:
        x, y = xy[k]
        if k in scopes:
            label, cls, extra = f"{scopes[k][2]} (+{scopes[k][5]})", "scope", " stroke-dasharray='4 2'"
        else:
            label, cls, extra = rows[k][1], rows[k][2], ""
        bad = k in badges
        stroke = "#cf222e" if bad else "#8c959f"
        boxes.append(f"<g><title>{html.escape(k)}</title><rect x='{x}' y='{y}' width='{BOX_W}' height='{BOX_H}' "
                     f"rx='4' fill='{COLOURS.get(cls, '#ffffff')}' stroke='{stroke}' stroke-width='{2 if bad else 1}'"
                     f"{extra}/><text x='{x + 5}' y='{y + 17}'>{html.escape(_label(str(label)))}</text>")
        if bad:
            text = " ".join(sorted(badges[k]))
            boxes.append(f"<text x='{x + BOX_W - 4}' y='{y - 2}' text-anchor='end' fill='#cf222e' "
                         f"font-weight='bold'>{html.escape(text)}</text>")
        boxes.append("</g>")
    more = len(gv.visible_keys()) - len(items)
    if more > 0:
        parts.append(f"<text x='4' y='{top + 4}' fill='#57606a'>… {more} more items not drawn</text>")
        top += 16
    return (f"<svg class='nbdebug-snapshot-graph' xmlns='http://www.w3.org/2000/svg' width='{max(width, 200)}' "
            f"height='{max(top, 40)}' font-family='monospace' font-size='11'>"
            + "".join(parts) + "<g stroke='#8c959f' stroke-width='1'>" + "".join(lines) + "</g>"
            + "".join(boxes) + "</svg>")
