"""The computational graph as a plotly ``FigureWidget``: scope boxes, nodes coloured by kind, hits, the
paused-at node, selection, and export.

Scopes start collapsed (one square per scope, labelled with its node count). Clicking a scope square
expands it; clicking the ▾ header (triangle and name) of an open scope collapses it; clicking a node
selects it.
Nodes with watchpoint hits carry the condition abbreviations above them (a collapsed scope carries
those of its members); the node training is paused at has a red ring; the selected node a black one.

The figure's toolbar has plotly's "download plot" button (SVG); :meth:`GraphView.export` writes the
visible graph to ``.svg``/``.png``/``.pdf`` (needs the ``kaleido`` package) or ``.html``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go

from .autosize import fit_width
from .layout import NODE_CLASSES, Layout, compute_layout, scope_chain, scope_key, split_scope_key
from .source import SourceView

COLOURS = {
    "op": "#4c78a8", "module": "#72b7b2", "parameter": "#54a24b", "gradient": "#e45756",
    "optimizer": "#b279a2", "input": "#9d755d", "scope": "#bab0ac",
}
SYMBOLS = {"scope": "square", "module": "diamond", "parameter": "triangle-up"}
SECTION_FILL = {"backward": "rgba(228,87,86,0.05)", "optimizer": "rgba(178,121,162,0.07)"}
#: above this many visible items, labels are left to the hover text
MAX_LABELS = 400
#: columns shown at first when the graph is wider
VIEW_COLUMNS = 80

# trace indices
T_BOXES, T_HEADERS, T_EDGES = 0, 1, 2
T_CLASS0 = 3
T_HITS = T_CLASS0 + len(NODE_CLASSES)
T_CURRENT = T_HITS + 1
T_SELECTED = T_CURRENT + 1


class GraphView:
    """The executed graph of ``source`` with collapsible scopes.

    ``on_select(name)`` is called when the user clicks a node.
    """

    def __init__(self, source: SourceView, on_select: Callable[[str], Any] = lambda name: None,
                 height: int = 420) -> None:
        self.source = source
        self.on_select = on_select
        self.expanded: set[str] = set()
        self.selected: str | None = None
        self.layout: Layout = Layout([], [], [], {})
        self._version = None
        self._class_items: list[list[int]] = [[] for _ in NODE_CLASSES]
        self._marks: tuple = ()
        self.relayouts = 0
        self.fig = go.FigureWidget(layout=self._base_layout(height))
        self.fig._config = {"displaylogo": False, "scrollZoom": True,
                            "toImageButtonOptions": {"format": "svg", "filename": "nbdebug-graph"}}
        self.fig.add_scatter(name="scopes", mode="lines", fill="toself", fillcolor="rgba(120,120,200,0.06)",
                             line={"color": "#8c8cb4", "width": 1}, hoverinfo="skip", showlegend=False)
        self.fig.add_scatter(name="scope headers", mode="markers+text", textposition="middle right",
                             textfont={"size": 11, "color": "#44447a"}, hoverinfo="text", showlegend=False,
                             marker={"symbol": "triangle-down", "size": 9, "color": "#44447a"})
        self.fig.add_scatter(name="edges", mode="lines", line={"color": "#b0b0b0", "width": 1},
                             hoverinfo="skip", showlegend=False)
        for cls in NODE_CLASSES:
            self.fig.add_scatter(name=cls, mode="markers", hoverinfo="text", textposition="bottom center",
                                 textfont={"size": 9},
                                 marker={"color": COLOURS[cls], "size": 16 if cls == "scope" else 11,
                                         "symbol": SYMBOLS.get(cls, "circle"),
                                         "line": {"width": 1, "color": "#333"}})
        self.fig.add_scatter(name="hits", mode="text", textposition="top center",
                             textfont={"size": 10, "color": "#cf222e"}, hoverinfo="skip", showlegend=False)
        self.fig.add_scatter(name="paused at", mode="markers", hoverinfo="skip",
                             marker={"symbol": "circle-open", "size": 26, "color": "#cf222e",
                                     "line": {"width": 3}})
        self.fig.add_scatter(name="selected", mode="markers", hoverinfo="skip", showlegend=False,
                             marker={"symbol": "circle-open", "size": 22, "color": "#000", "line": {"width": 2}})
        self.fig.data[T_HEADERS].on_click(self._click_header)
        for k in range(len(NODE_CLASSES)):
            self.fig.data[T_CLASS0 + k].on_click(self._click_items)
        self.fig.add_class("nbdebug-graph")
        fit_width(self.fig)
        self.widget = self.fig
        self.refresh()

    @staticmethod
    def _base_layout(height: int) -> dict[str, Any]:
        return {
            "height": height, "margin": {"l": 10, "r": 10, "t": 30, "b": 10}, "dragmode": "pan",
            "plot_bgcolor": "white", "hovermode": "closest", "clickmode": "event",
            "legend": {"orientation": "h", "y": 1.02, "x": 0, "yanchor": "bottom", "font": {"size": 10}},
            "xaxis": {"visible": False, "zeroline": False},
            "yaxis": {"visible": False, "zeroline": False, "autorange": "reversed"},
            "uirevision": "nbdebug",
        }

    # -- user actions -----------------------------------------------------------------------------
    def expand(self, key: str) -> None:
        """Open a scope box (``"forward:fc1"``) and its ancestors."""
        section, scope = split_scope_key(key)
        self.expanded.update(scope_chain(section, scope))
        self.refresh(force=True)
        box = next((b for b in self.layout.boxes if b.key == key), None)
        if box is not None:
            self._set_x_range(center=(box.x0 + box.x1) / 2)

    def collapse(self, key: str) -> None:
        """Close a scope box and everything opened inside it."""
        prefix = key + "/"
        self.expanded = {k for k in self.expanded if k != key and not k.startswith(prefix)}
        self.refresh(force=True)

    def toggle(self, key: str) -> None:
        if key in self.expanded:
            self.collapse(key)
        else:
            self.expand(key)

    def reveal(self, name: str) -> None:
        """Open the scopes around node ``name``, select it and scroll it into view."""
        node = self.source.graph.nodes.get(name)
        if node is None:
            raise KeyError(f"no node named {name!r} in the graph")
        chain = scope_chain(node.section, node.scope)
        changed = not set(chain) <= self.expanded
        self.expanded.update(chain)
        self.selected = name
        self.refresh(force=changed)
        self._center(name)

    def select(self, name: str | None) -> None:
        """Mark ``name`` as selected (its collapsed scope when hidden)."""
        self.selected = name
        self._draw_marks(force=True)

    def click_item(self, key: str) -> None:
        """What a click on an item does: expand a collapsed scope, or select a node."""
        i = self.layout.index.get(key)
        if i is None:
            raise KeyError(f"{key!r} is not visible in the graph")
        item = self.layout.items[i]
        if item.kind == "scope":
            self.expand(item.key)
        else:
            self.selected = item.key
            self._draw_marks(force=True)
            self.on_select(item.key)

    def _click_items(self, trace: Any, points: Any, state: Any) -> None:
        if not points.point_inds:
            return
        k = trace_index(self.fig, trace) - T_CLASS0
        idx = self._class_items[k][points.point_inds[0]]
        self.click_item(self.layout.items[idx].key)

    def _click_header(self, trace: Any, points: Any, state: Any) -> None:
        if points.point_inds:
            self.collapse(self.layout.boxes[points.point_inds[0]].key)

    # -- drawing ----------------------------------------------------------------------------------
    def visible_keys(self) -> list[str]:
        return [it.key for it in self.layout.items]

    def refresh(self, force: bool = False) -> None:
        """Re-lay out when the graph or the open scopes changed; redraw hits and marks when they did."""
        graph = self.source.graph
        version = (graph.version, len(graph))
        if force or version != self._version:
            self._version = version
            self.layout = compute_layout(graph, self.expanded)
            self.relayouts += 1
            self._draw_layout()
        self._draw_marks()

    def _draw_layout(self) -> None:
        lay = self.layout
        items = lay.items
        nodes = self.source.graph.nodes
        n = len(items)
        xs = np.fromiter((it.x for it in items), dtype=np.float64, count=n)
        ys = np.fromiter((it.y for it in items), dtype=np.float64, count=n)
        per_class: list[list[int]] = [[] for _ in NODE_CLASSES]
        cls_index = {c: k for k, c in enumerate(NODE_CLASSES)}
        for i, it in enumerate(items):
            per_class[cls_index[it.cls]].append(i)
        self._class_items = per_class
        show_text = n <= MAX_LABELS
        bx, by, hx, hy, htext, hhover = [], [], [], [], [], []
        for b in lay.boxes:
            pad = max(0.12, 0.45 - 0.04 * b.depth)
            x0, x1 = b.x0 - pad, b.x1 + pad
            y0, y1 = b.y0 - 0.4 + 0.03 * b.depth, b.y1 + 0.4 - 0.03 * b.depth
            bx += [x0, x1, x1, x0, x0, math.nan]
            by += [y0, y0, y1, y1, y0, math.nan]
            hx.append(x0)
            hy.append(b.y0)
            htext.append(b.label)
            hhover.append(f"scope {b.key} ({b.count} visible) — click to collapse")
        ex = np.empty(3 * len(lay.edges))
        ey = np.empty(3 * len(lay.edges))
        if lay.edges:
            e = np.asarray(lay.edges, dtype=np.intp)
            ex[0::3], ex[1::3], ex[2::3] = xs[e[:, 0]], xs[e[:, 1]], math.nan
            ey[0::3], ey[1::3], ey[2::3] = ys[e[:, 0]], ys[e[:, 1]], math.nan
        with self.fig.batch_update():
            self.fig.data[T_BOXES].update(x=np.asarray(bx), y=np.asarray(by))
            self.fig.data[T_HEADERS].update(x=np.asarray(hx), y=np.asarray(hy), text=htext, hovertext=hhover)
            self.fig.data[T_EDGES].update(x=ex, y=ey)
            for k, idx in enumerate(per_class):
                ii = np.asarray(idx, dtype=np.intp)
                hover = []
                labels = []
                for i in idx:
                    it = items[i]
                    if it.kind == "scope":
                        hover.append(f"scope {it.key}: {it.count} nodes — click to expand")
                        labels.append(f"{it.label} ({it.count})")
                    else:
                        node = nodes.get(it.key)
                        extra = f"<br>{node.op_type} · {node.kind} · {node.section} · order {node.order}" \
                            if node is not None else ""
                        hover.append(f"{it.key}{extra}")
                        labels.append(it.label)
                self.fig.data[T_CLASS0 + k].update(
                    x=xs[ii], y=ys[ii], hovertext=hover, text=labels if show_text else None,
                    mode="markers+text" if show_text else "markers", visible=True if idx else "legendonly")
            self.fig.layout.shapes = self._section_shapes(lay)
            self._set_x_range()
            # autorange off: plotly.js ignores a range while autorange is on (the base layout's "reversed")
            self.fig.layout.yaxis.update(autorange=False, range=[lay.height + 0.5, -1.2])
        self._marks = ()

    def _section_shapes(self, lay: Layout) -> list[dict[str, Any]]:
        spans: dict[str, list[int]] = {}
        for it in lay.items:
            s = spans.setdefault(it.section, [it.x, it.x])
            s[0] = min(s[0], it.x)
            s[1] = max(s[1], it.x)
        shapes = []
        for sec, (a, b) in spans.items():
            if sec in SECTION_FILL:
                shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": a - 0.5, "x1": b + 0.5,
                               "y0": 0, "y1": 1, "fillcolor": SECTION_FILL[sec], "line": {"width": 0},
                               "layer": "below"})
        return shapes

    def hit_marks(self) -> dict[int, list[str]]:
        """Item index -> condition abbreviations of the hits of the nodes it shows."""
        out: dict[int, list[str]] = {}
        of_node = self.layout.of_node
        for h in self.source.hits:
            if not h.hits:
                continue
            i = of_node.get(h.node)
            if i is None:
                continue
            lst = out.setdefault(i, [])
            if h.condition not in lst:
                lst.append(h.condition)
        return out

    def _draw_marks(self, force: bool = False) -> None:
        lay = self.layout
        marks = self.hit_marks()
        cur = self.source.current_node if self.source.state == "paused" else None
        cur_i = lay.of_node.get(cur) if cur else None
        sel_i = lay.of_node.get(self.selected) if self.selected else None
        sig = (tuple(sorted((k, tuple(v)) for k, v in marks.items())), cur_i, sel_i, id(lay))
        if sig == self._marks and not force:
            return
        self._marks = sig
        items = lay.items
        keys = sorted(marks)
        with self.fig.batch_update():
            self.fig.data[T_HITS].update(x=[items[i].x for i in keys], y=[items[i].y - 0.32 for i in keys],
                                         text=[",".join(marks[i]) for i in keys])
            self.fig.data[T_CURRENT].update(x=[items[cur_i].x] if cur_i is not None else [],
                                            y=[items[cur_i].y] if cur_i is not None else [])
            self.fig.data[T_SELECTED].update(x=[items[sel_i].x] if sel_i is not None else [],
                                             y=[items[sel_i].y] if sel_i is not None else [])

    def _set_x_range(self, center: float | None = None) -> None:
        """Show the whole width when it fits, else ``VIEW_COLUMNS`` columns around ``center`` (or keep the
        columns shown now)."""
        width = self.layout.width
        if width <= VIEW_COLUMNS:
            rng = [-1.0, float(width)]
        else:
            cur = self.fig.layout.xaxis.range
            lo = float(cur[0]) if center is None and cur is not None else (center or 0) - VIEW_COLUMNS / 2
            lo = max(-1.0, min(lo, width - VIEW_COLUMNS))
            rng = [lo, lo + VIEW_COLUMNS + 1]
        if self.fig.layout.xaxis.range is None or list(self.fig.layout.xaxis.range) != rng:
            self.fig.layout.xaxis.range = rng

    def _center(self, name: str) -> None:
        i = self.layout.of_node.get(name)
        if i is not None:
            self._set_x_range(center=self.layout.items[i].x)

    # -- export -----------------------------------------------------------------------------------
    def figure(self) -> go.Figure:
        """A static copy of the visible graph (whole width, not just the scrolled-to part)."""
        fig = go.Figure(self.fig.to_dict())
        lay = self.layout
        fig.update_layout(xaxis_range=[-1, lay.width], width=max(700, min(12000, 40 * lay.width + 100)))
        return fig

    def export(self, path: str | Path, scale: float = 1.0) -> Path:
        """Write the visible graph to ``path``: ``.svg``, ``.png``, ``.pdf``, ``.jpeg``/``.webp`` (static
        export through plotly, which needs the ``kaleido`` package and a Chromium) or ``.html``."""
        p = Path(path)
        fmt = p.suffix.lower().lstrip(".")
        fig = self.figure()
        if fmt in ("html", "htm"):
            fig.write_html(str(p), include_plotlyjs="cdn")
            return p
        if fmt not in ("svg", "png", "pdf", "jpeg", "jpg", "webp"):
            raise ValueError(f"export: unknown format {p.suffix!r}; use .svg, .png, .pdf, .jpeg, .webp or .html")
        try:
            import kaleido  # noqa: F401
        except ImportError:
            raise RuntimeError(
                "export to SVG/PNG goes through plotly's static image export, which needs the 'kaleido' package "
                "(pip install kaleido) and a Chromium browser; meanwhile use the camera button in the graph's "
                "toolbar, or export(...) to a .html file") from None
        fig.write_image(str(p), format="jpeg" if fmt == "jpg" else fmt, scale=scale)
        return p


def trace_index(fig: Any, trace: Any) -> int:
    for i, t in enumerate(fig.data):
        if t is trace:
            return i
    raise ValueError("trace not in figure")


def simulate_click(fig: Any, trace: int, point: int) -> None:
    """Deliver a click on point ``point`` of trace ``trace`` the way the browser frontend does."""
    t = fig.data[trace]
    x = t.x[point] if t.x is not None and len(t.x) > point else 0
    y = t.y[point] if t.y is not None and len(t.y) > point else 0
    fig._js2py_pointsCallback = {
        "event_type": "plotly_click",
        "points": {"trace_indexes": [trace], "point_indexes": [point], "xs": [float(x)], "ys": [float(y)]},
        "device_state": None, "selector": None,
    }


__all__ = ["GraphView", "simulate_click", "scope_key"]
