"""The tensor view: one tensor's values as a heatmap and a table, for the current step, the previous step,
or their difference (tolerance rule of REFERENCE §1), with statistics of each; the hits on it with the
optimization guide; and the tensor relationship diagram (k-hop upstream and downstream nodes, with the
condition abbreviations of their hits).

Dimension selection: one box per axis (``nbdebug-slice-<axis>``) holding an index (fixes the axis) or a
slice such as ``:`` or ``2:10`` (keeps it free); at most two free axes are shown at once.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import numpy as np
import plotly.graph_objects as go

from .autosize import fit_width
from .hits import hit_text
from .layout import node_class, short_label
from .source import SourceView
from .tensor_math import (
    BOOL_FIELDS,
    STAT_FIELDS,
    compare,
    default_selection,
    fmt,
    parse_selection,
    select,
    selection_text,
    tensor_stats,
)

MAX_HEAT = 512  # rows/columns drawn in the heatmap
MAX_TABLE = 16  # rows/columns in the value table
MAX_PER_SIDE = 40  # nodes per side in the relationship diagram
_COLOURS = {"op": "#4c78a8", "module": "#72b7b2", "parameter": "#54a24b", "gradient": "#e45756",
            "optimizer": "#b279a2", "input": "#9d755d", "scope": "#bab0ac"}
_STAT_LABEL = {"max": "max", "min": "min", "mean": "mean", "count": "count", "nan_count": "NaN",
               "neg_inf_count": "−Inf", "pos_inf_count": "+Inf", "zero_count": "zero",
               "negative_zero_count": "−0", "positive_zero_count": "+0", "true_count": "true",
               "false_count": "false"}


def relationship(graph: Any, name: str, hops: int) -> dict[str, int]:
    """Node -> signed hop distance (negative upstream, positive downstream, 0 the node itself), at most
    :data:`MAX_PER_SIDE` nodes per side.

    >>> from nbdebug.session.graph import Graph
    >>> g = Graph()
    >>> for n in "abcd":
    ...     _ = g.add_node(n, kind="op", op_type="op")
    >>> g.add_edge("a", "b"); g.add_edge("b", "c"); g.add_edge("c", "d")
    >>> relationship(g, "b", 1)
    {'b': 0, 'a': -1, 'c': 1}
    """
    up_set, down_set = graph.neighbourhood(name, hops)
    out = {name: 0}
    for sign, step, allowed in ((-1, graph.predecessors, up_set), (1, graph.successors, down_set)):
        frontier = [name]
        seen = {name}
        count = 0
        for d in range(1, hops + 1):
            nxt = []
            for n in frontier:
                for m in sorted(step(n)):
                    if m in seen or m not in allowed:
                        continue
                    seen.add(m)
                    if count >= MAX_PER_SIDE:
                        continue
                    count += 1
                    out.setdefault(m, sign * d)
                    nxt.append(m)
            frontier = nxt
    return out


class TensorView:
    """Opened with :meth:`open`; ``on_select(name)`` when a node of the relationship diagram is clicked."""

    def __init__(self, source: SourceView, on_select: Callable[[str], Any] = lambda name: None,
                 on_close: Callable[[], Any] = lambda: None) -> None:
        self.source = source
        self.on_select = on_select
        self.on_close = on_close
        self.node: str | None = None
        self.slot: str | None = None
        self.step: int | str = "current"
        self.hit: Any = None
        self._cur: np.ndarray | None = None
        self._prev: np.ndarray | None = None
        self._diff: tuple[float, np.ndarray] | None = None
        self._steps: tuple[int | str, int | str] = ("current", "previous")
        self._quiet = False
        #: node -> hit abbreviations drawn in the relationship diagram
        self.marks: dict[str, str] = {}
        self.title = w.HTML("")
        self.title.add_class("nbdebug-tensor-title")
        self.mode = w.ToggleButtons(options=[("Current step", "current"), ("Previous step", "previous"),
                                             ("Comparison", "compare")], value="current")
        self.mode.add_class("nbdebug-tensor-mode")
        self.mode.observe(lambda ch: self._mode_changed(), names="value")
        self.tolerance = w.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01, description="tolerance",
                                       continuous_update=False, layout=w.Layout(display="none"))
        self.tolerance.add_class("nbdebug-tolerance")
        self.tolerance.observe(lambda ch: self.redraw(), names="value")
        self.slices = w.HBox([], layout=w.Layout(flex_flow="row wrap"))
        self.slices.add_class("nbdebug-slices")
        self.slice_error = w.HTML("")
        self.slice_error.add_class("nbdebug-slice-error")
        self.error = w.HTML("")
        self.error.add_class("nbdebug-tensor-error")
        self.heatmap = go.FigureWidget(layout={"height": 320, "margin": {"l": 40, "r": 10, "t": 10, "b": 30},
                                               "yaxis": {"autorange": "reversed"}})
        self.heatmap.add_heatmap(z=np.zeros((1, 1)), colorscale="RdBu", reversescale=True)
        self.heatmap.add_class("nbdebug-tensor-heatmap")
        fit_width(self.heatmap)
        self.table = w.HTML("")
        self.table.add_class("nbdebug-tensor-table")
        self.stats = w.HTML("")
        self.stats.add_class("nbdebug-tensor-stats")
        self.hits = w.HTML("")
        self.hits.add_class("nbdebug-tensor-hits")
        self.hops = w.BoundedIntText(value=1, min=1, max=5, description="hops", layout=w.Layout(width="120px"),
                                     style={"description_width": "40px"})
        self.hops.add_class("nbdebug-tensor-hops")
        self.hops.observe(lambda ch: self._draw_relations(), names="value")
        self.relations = go.FigureWidget(layout={
            "height": 260, "margin": {"l": 10, "r": 10, "t": 10, "b": 10}, "showlegend": False,
            "xaxis": {"visible": False}, "yaxis": {"visible": False, "autorange": "reversed"},
            "plot_bgcolor": "white", "dragmode": "pan"})
        self.relations.add_scatter(mode="lines", line={"color": "#b0b0b0", "width": 1}, hoverinfo="skip")
        self.relations.add_scatter(mode="markers+text", textposition="bottom center", hoverinfo="text",
                                   textfont={"size": 10}, marker={"size": 13, "line": {"width": 1, "color": "#333"}})
        self.relations.add_scatter(mode="text", textposition="top center", hoverinfo="skip",
                                   textfont={"size": 10, "color": "#cf222e"})
        self.relations.data[1].on_click(self._click_relation)
        self.relations.add_class("nbdebug-tensor-graph")
        fit_width(self.relations)
        self._rel_names: list[str] = []
        self.close = w.Button(description="close", layout=w.Layout(width="auto"))
        self.close.add_class("nbdebug-tensor-close")
        self.close.on_click(lambda _b: self.hide())
        left = w.VBox([self.stats, self.hits], layout=w.Layout(width="40%"))
        # The figures join the page at the first open(): plotly sizes a plot to its container when it is
        # first drawn, and inside the hidden view it would take its 700 px default width (and overflow).
        self._right = w.VBox([self.table], layout=w.Layout(width="60%"))
        self._relations_box = w.VBox([])
        self.widget = w.VBox([
            w.HBox([w.HTML("<b>Tensor view</b>&nbsp;"), self.title, self.close]),
            w.HBox([self.mode, self.tolerance], layout=w.Layout(flex_flow="row wrap")),
            self.slices, self.slice_error, self.error, w.HBox([left, self._right]),
            w.HBox([w.HTML("<b>Tensor relationships</b>&nbsp;"), self.hops]), self._relations_box,
        ], layout=w.Layout(display="none", border="1px solid #ccc", padding="4px"))
        self.widget.add_class("nbdebug-tensor-view")

    # -- opening ----------------------------------------------------------------------------------
    @property
    def visible(self) -> bool:
        return self.widget.layout.display != "none"

    def hide(self) -> None:
        self.widget.layout.display = "none"
        self.on_close()

    def open(self, node: str, slot: str, step: int | str = "current", hit: Any = None) -> None:
        """Show ``node``'s ``slot`` at ``step`` (an int, or "current"); ``hit`` adds its details."""
        if node not in self.source.graph.nodes:
            raise KeyError(f"no node named {node!r} in the graph")
        self.node, self.slot, self.step, self.hit = node, slot, step, hit
        self._diff = None
        self.error.value = ""
        self._cur, cur_err = self._load(step)
        prev_step: int | str = "previous" if step == "current" else int(step) - 1
        self._steps = (step, prev_step)
        self._prev, prev_err = self._load(prev_step) if prev_step != -1 else (None, "there is no previous step")
        errors = []
        if cur_err:
            errors.append(f"current step: {cur_err}")
        if prev_err:
            errors.append(f"previous step: {prev_err}")
        self.error.value = "<br>".join(f"<small style='color:#8c6d1f'>{html.escape(e)}</small>" for e in errors)
        shape = self._shape()
        self.slices.children = [self._slice_box(i, n, t) for i, (n, t) in
                                enumerate(zip(shape, default_selection(shape)))]  # noqa: B905
        node_obj = self.source.graph.nodes[node]
        dtype = node_obj.dtypes.get(slot, "") if self._cur is None else str(self._cur.dtype)
        step_txt = step if isinstance(step, str) else f"step {step}"
        self.title.value = (f"<code>{html.escape(node)}</code> <b>{html.escape(slot)}</b> · "
                            f"{html.escape(str(step_txt))} · {html.escape(dtype)} {tuple(shape)}")
        self.widget.layout.display = "flex"
        if self.heatmap not in self._right.children:  # first open: see __init__
            self._right.children = (self.heatmap, self.table)
            self._relations_box.children = (self.relations,)
        self.mode.value = "current"
        self.redraw()
        self._draw_hits()
        self._draw_relations()

    def _load(self, step: int | str) -> tuple[np.ndarray | None, str]:
        try:
            return np.asarray(self.source.tensor(self.node, self.slot, step)), ""
        except Exception as e:  # noqa: BLE001 - NotRetainedError/KeyError say why; shown to the user
            return None, str(e).strip("'\"")

    def _shape(self) -> tuple[int, ...]:
        if self._cur is not None:
            return tuple(self._cur.shape)
        if self._prev is not None:
            return tuple(self._prev.shape)
        node = self.source.graph.nodes[self.node]
        return tuple(node.shapes.get(self.slot, ()))

    def _slice_box(self, axis: int, size: int, text: str) -> w.Text:
        box = w.Text(value=text, description=f"dim {axis} ({size})", continuous_update=False,
                     layout=w.Layout(width="170px"), style={"description_width": "80px"})
        box.add_class(f"nbdebug-slice-{axis}")
        box.add_class("nbdebug-slice")
        box.observe(lambda ch: None if self._quiet else self.redraw(), names="value")
        return box

    @property
    def selection(self) -> list[str]:
        return [b.value for b in self.slices.children]

    def set_selection(self, texts: list[str]) -> None:
        """Set every axis' selection at once (one redraw)."""
        boxes = list(self.slices.children)
        if len(texts) != len(boxes):
            raise ValueError(f"the tensor has {len(boxes)} dimensions, got {len(texts)} selections")
        self._quiet = True
        try:
            for b, t in zip(boxes, texts):  # noqa: B905
                b.value = t
        finally:
            self._quiet = False
        self.redraw()

    # -- drawing ----------------------------------------------------------------------------------
    def _mode_changed(self) -> None:
        self.tolerance.layout.display = "flex" if self.mode.value == "compare" else "none"
        self.redraw()

    def values(self) -> np.ndarray | None:
        """The whole tensor for the current mode (the difference in comparison mode)."""
        mode = self.mode.value
        if mode == "current":
            return self._cur
        if mode == "previous":
            return self._prev
        if self._cur is None or self._prev is None or self._cur.shape != self._prev.shape:
            return None
        tol = float(self.tolerance.value)
        if self._diff is None or self._diff[0] != tol:
            self._diff = (tol, compare(self._cur, self._prev, tol))
        return self._diff[1]

    def redraw(self) -> None:
        if self.node is None:
            return
        self._draw_stats()
        values = self.values()
        if values is None:
            missing = {"current": "current step", "previous": "previous step"}.get(self.mode.value,
                                                                                  "both steps (same shape)")
            self.slice_error.value = f"<i>no values retained for the {missing}</i>"
            self.heatmap.data[0].z = np.zeros((0, 0))
            self.table.value = ""
            return
        try:
            sel = parse_selection(self.selection, values.shape)
        except ValueError as e:
            self.slice_error.value = f"<span style='color:#cf222e'>{html.escape(str(e))}</span>"
            return
        self.slice_error.value = ""
        part = select(values, sel)
        note = ""
        if part.shape[0] > MAX_HEAT or part.shape[1] > MAX_HEAT:
            note = f"showing the first {MAX_HEAT}×{MAX_HEAT} of {part.shape[0]}×{part.shape[1]}; narrow the selection"
            part = part[:MAX_HEAT, :MAX_HEAT]
        z = part.astype(np.float64) if part.dtype != np.float64 else part
        with self.heatmap.batch_update():
            self.heatmap.data[0].z = z
            self.heatmap.data[0].hovertemplate = (f"{selection_text(sel)}<br>row %{{y}}, col %{{x}}: %{{z}}"
                                                  "<extra></extra>")
            if self.mode.value == "compare":
                m = float(np.nanmax(np.abs(z[np.isfinite(z)]))) if np.isfinite(z).any() else 1.0
                self.heatmap.data[0].update(zmid=0, zmin=-m or -1, zmax=m or 1, zauto=False)
            else:
                self.heatmap.data[0].update(zauto=True, zmid=None)
        self.table.value = _value_table(part) + (f"<small>{html.escape(note)}</small>" if note else "")

    def _draw_stats(self) -> None:
        cols = [("current", self._cur), ("previous", self._prev)]
        diff = None
        if self._cur is not None and self._prev is not None and self._cur.shape == self._prev.shape:
            tol = float(self.tolerance.value)
            diff = compare(self._cur, self._prev, tol)
        cols.append(("difference", diff))
        stats = [tensor_stats(v) if v is not None else None for _, v in cols]
        for k in (0, 1):  # no values kept: the recorded statistics, where there are some
            if stats[k] is None:
                stats[k] = self._recorded_stats(self._steps[k])
        is_bool = self._cur is not None and self._cur.dtype == np.bool_
        fields = BOOL_FIELDS if is_bool else STAT_FIELDS
        head = "".join(f"<th>{c}</th>" for c, _ in cols)
        body = []
        for f in fields:
            cells = "".join(f"<td>{fmt(s.get(f)) if s is not None and f in s else '–'}</td>" for s in stats)
            body.append(f"<tr><th style='text-align:left'>{_STAT_LABEL.get(f, f)}</th>{cells}</tr>")
        self.stats.value = (f"<b>Statistics</b><table class='nbdebug-table' style='font-size:11px'>"
                            f"<tr><th></th>{head}</tr>{''.join(body)}</table>")

    def _recorded_stats(self, step: int | str) -> dict[str, Any] | None:
        if step == -1:
            return None
        try:
            st = self.source.stats(self.node, self.slot, step)
        except Exception:  # noqa: BLE001 - nothing recorded for that step
            return None
        return {k: st.get(k) for k in STAT_FIELDS if k in st}

    def _draw_hits(self) -> None:
        hits = [h for h in self.source.hits if h.node == self.node and h.slot == self.slot]
        if self.hit is not None and self.hit not in hits:
            hits.insert(0, self.hit)
        if not hits:
            self.hits.value = "<b>Watchpoint hits</b><br><i>no hits on this tensor</i>"
            return
        parts = ["<b>Watchpoint hits and optimization guide</b>"]
        for h in hits[:10]:
            parts.append(f"<div style='margin:4px 0'><b>{html.escape(h.condition)}</b> step {h.step} · "
                         f"watchpoint #{h.watchpoint}<br><small>{html.escape(hit_text(h))}</small>"
                         f"<div class='nbdebug-advice' style='font-size:11px;color:#444'>"
                         f"{html.escape(h.advice or '')}</div></div>")
        self.hits.value = "".join(parts)

    def _draw_relations(self) -> None:
        if self.node is None:
            return
        g = self.source.graph
        rel = relationship(g, self.node, int(self.hops.value))
        cols: dict[int, list[str]] = {}
        for n, d in rel.items():
            cols.setdefault(d, []).append(n)
        pos: dict[str, tuple[float, float]] = {}
        for d, names in cols.items():
            names.sort(key=lambda n: (g.nodes[n].order if n in g.nodes else 0, n))
            for k, n in enumerate(names):
                pos[n] = (float(d), k - (len(names) - 1) / 2)
        marks: dict[str, list[str]] = {}
        for h in self.source.hits:
            if h.hits and h.node in pos:
                lst = marks.setdefault(h.node, [])
                if h.condition not in lst:
                    lst.append(h.condition)
        names = list(pos)
        self._rel_names = names
        self.marks = {n: ",".join(v) for n, v in marks.items()}
        ex, ey = [], []
        for a in names:
            for b in g.successors(a):
                if b in pos:
                    ex += [pos[a][0], pos[b][0], None]
                    ey += [pos[a][1], pos[b][1], None]
        colours = [("#000" if n == self.node else _COLOURS[node_class(g.nodes[n])]) for n in names]
        with self.relations.batch_update():
            self.relations.data[0].update(x=ex, y=ey)
            self.relations.data[1].update(
                x=[pos[n][0] for n in names], y=[pos[n][1] for n in names],
                text=[short_label(g.nodes[n]) for n in names], hovertext=names,
                marker={"color": colours, "size": [18 if n == self.node else 12 for n in names]})
            ks = [n for n in names if n in marks]
            self.relations.data[2].update(x=[pos[n][0] for n in ks], y=[pos[n][1] - 0.3 for n in ks],
                                          text=[",".join(marks[n]) for n in ks])
            # a fixed y range: autorange would stretch a single row (and its marks) over the whole height
            ys = [y for _x, y in pos.values()]
            self.relations.layout.yaxis.update(autorange=False, range=[max(ys) + 0.8, min(ys) - 0.8])

    def _click_relation(self, trace: Any, points: Any, state: Any) -> None:
        if points.point_inds:
            self.on_select(self._rel_names[points.point_inds[0]])


def _value_table(part: np.ndarray) -> str:
    rows = part[:MAX_TABLE, :MAX_TABLE]
    head = "".join(f"<th>{j}</th>" for j in range(rows.shape[1]))
    body = "".join("<tr><th>" + str(i) + "</th>" + "".join(f"<td>{fmt(v.item())}</td>" for v in r) + "</tr>"
                   for i, r in enumerate(rows))
    more = ""
    if part.shape[0] > MAX_TABLE or part.shape[1] > MAX_TABLE:
        more = f"<small>table shows {rows.shape[0]}×{rows.shape[1]} of {part.shape[0]}×{part.shape[1]}</small>"
    return (f"<table class='nbdebug-table' style='font-size:10px'><tr><th></th>{head}</tr>{body}</table>{more}")
