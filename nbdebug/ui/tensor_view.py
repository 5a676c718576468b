"""The tensor view: one tensor's values as a heatmap and a table, for the current step, the previous step,
or their difference (MindInsight's tolerance rule), with statistics of each; the hits on it with the
optimization guide; and the tensor relationship diagram (k-hop upstream and downstream nodes, with the
condition abbreviations of their hits).

Dimension selection: one box per axis (``nbdebug-slice-<axis>``) holding an index (fixes the axis) or a
slice such as ``:`` or ``2:10`` (keeps it free); at most two free axes are shown at once.

The heatmap and the diagram are views of nbdebug's own front end (``FrontendWidget`` views ``heatmap`` and
``relations``, messages in ``frontend/PROTOCOL.md``): the kernel sends the selected values as one binary
buffer labelled with their original indices, and the relationship diagram as a list of nodes and edges.
Statistics come from :func:`~.tensor_math.stats_from`, as in node details.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import numpy as np

from ..session.steps import resolve_step
from .frontend import FrontendWidget
from .heatmap_data import empty_message, heatmap_message, step_label
from .hits import hit_text
from .kit import Kit
from .layout import node_class, short_label
from .source import SourceView
from .tensor_math import BOOL_FIELDS, STAT_FIELDS, compare, default_selection, fmt, stat_texts, stats_from

MAX_TABLE = 16  # rows/columns in the value table
MAX_PER_SIDE = 40  # nodes per side in the relationship diagram
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
        self._step_ints: tuple[int | None, int | None] = (None, None)
        self._title_parts: tuple[str, str, str, tuple[int, ...]] = ("", "", "", ())
        self.error_texts: dict[str, str] = {}
        self._stats_key: Any = None
        self._quiet = False
        #: node -> hit abbreviations drawn in the relationship diagram
        self.marks: dict[str, str] = {}
        kit = Kit()  # the labels' Layout and style models, shared
        self.title = kit.html(classes=("nbdebug-tensor-title",))
        self.mode = w.ToggleButtons(options=[("Current step", "current"), ("Previous step", "previous"),
                                             ("Comparison", "compare")], value="current",
                                             _dom_classes=("nbdebug-tensor-mode",))
        self.mode.observe(lambda ch: self._mode_changed(), names="value")
        self.tolerance = w.FloatSlider(value=0.0, min=0.0, max=1.0, step=0.01, description="tolerance",
                                       continuous_update=False, layout=w.Layout(display="none"),
                                       _dom_classes=("nbdebug-tolerance",))
        self.tolerance.observe(lambda ch: self.redraw(), names="value")
        self.slices = w.HBox([], layout=w.Layout(flex_flow="row wrap"), _dom_classes=("nbdebug-slices",))
        self.slice_error = kit.html(classes=("nbdebug-slice-error",))
        self.error = kit.html(classes=("nbdebug-tensor-error",))
        #: shown with a "not retained" error on a live source: keep the node's values from its next execution
        self.keep = w.Button(description="keep this node's values from its next execution",
                             layout=w.Layout(width="auto", display="none"), _dom_classes=("nbdebug-tensor-keep",))
        self.keep.on_click(lambda _b: self._keep())
        self.heatmap = FrontendWidget(view="heatmap", height=420, _dom_classes=("nbdebug-tensor-heatmap",))
        #: the 2-D part of the tensor last sent to the heatmap (rows × columns, original values) and its message
        self.shown: np.ndarray | None = None
        self.message: dict[str, Any] = {}
        #: column ("current", "previous", "difference") -> statistics shown (see tensor_math.stats_from)
        self.stat_columns: dict[str, dict[str, Any]] = {}
        self._reveal = False
        self.table = kit.html(classes=("nbdebug-tensor-table",))
        self.stats = kit.html(classes=("nbdebug-tensor-stats",))
        self.hits = kit.html(classes=("nbdebug-tensor-hits",))
        self.hops = w.BoundedIntText(value=1, min=1, max=5, description="hops", layout=w.Layout(width="120px"),
                                     style={"description_width": "40px"}, _dom_classes=("nbdebug-tensor-hops",))
        self.hops.observe(lambda ch: self._draw_relations(), names="value")
        self.relations = FrontendWidget(view="relations", height=300, _dom_classes=("nbdebug-tensor-graph",))
        self.relations.handle("click", self._click_relation)
        self._rel_names: list[str] = []
        self.close = kit.button("close", width="auto", classes=("nbdebug-tensor-close",))
        self.close.on_click(lambda _b: self.hide())
        left = w.VBox([self.stats, self.hits], layout=w.Layout(width="40%"))
        self._right = w.VBox([self.heatmap, self.table], layout=w.Layout(width="60%"))
        self._relations_box = w.VBox([self.relations])
        self.widget = w.VBox([
            w.HBox([kit.html("<b>Tensor view</b>&nbsp;"), self.title, self.close]),
            w.HBox([self.mode, self.tolerance], layout=w.Layout(flex_flow="row wrap")),
            self.slices, self.slice_error, self.error, self.keep, w.HBox([left, self._right]),
            w.HBox([kit.html("<b>Tensor relationships</b>&nbsp;"), self.hops]), self._relations_box,
        ], layout=w.Layout(display="none", border="1px solid #ccc", padding="4px"),
           _dom_classes=("nbdebug-tensor-view",))

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
        self._stats_key = None  # statistics recomputed for the newly loaded values
        self.error.value = ""
        self._cur, cur_err = self._load(step)
        prev_step: int | str = "previous" if step == "current" else int(step) - 1
        self._steps = (step, prev_step)
        self._prev, prev_err = self._load(prev_step) if prev_step != -1 else (None, "there is no previous step")
        self.error_texts = {"current": cur_err, "previous": prev_err}
        errors = []
        if cur_err:
            errors.append(f"current step: {cur_err}")
        if prev_err:
            errors.append(f"previous step: {prev_err}")
        self.error.value = "<br>".join(f"<small style='color:#8c6d1f'>{html.escape(e)}</small>" for e in errors)
        self._show_keep(bool(errors))
        shape = self._shape()
        self.slices.children = [self._slice_box(i, n, t) for i, (n, t) in
                                enumerate(zip(shape, default_selection(shape)))]  # noqa: B905
        node_obj = self.source.graph.nodes[node]
        dtype = node_obj.dtypes.get(slot, "") if self._cur is None else str(self._cur.dtype)
        self._step_ints = (self._resolve(step), self._resolve(prev_step))
        self._title_parts = (node, slot, dtype, tuple(shape))
        self.widget.layout.display = "flex"
        self._reveal = True  # the heatmap scrolls the view into sight
        self._quiet = True
        try:
            self.mode.value = "current"
        finally:
            self._quiet = False
        self.tolerance.layout.display = "none"
        self.redraw()
        self._draw_hits()
        self._draw_relations()

    def _show_keep(self, missing: bool) -> None:
        """Offer to keep the node's values when some are not retained and training can run again."""
        kept = self.source.kept(self.node)
        offer = missing and self.source.live and (kept or "not retained" in " ".join(self.error_texts.values()))
        self.keep.layout.display = "flex" if offer else "none"
        self.keep.disabled = kept
        self.keep.description = ("kept: its values are retained from its next execution" if kept else
                                 "keep this node's values from its next execution")

    def _keep(self) -> None:
        try:
            self.source.keep(self.node)
        except Exception as e:  # noqa: BLE001 - shown to the user, not raised into the widget callback
            self.error.value += f"<br><small style='color:#cf222e'>{html.escape(str(e))}</small>"
            return
        self._show_keep(True)

    def _resolve(self, step: int | str) -> int | None:
        """The step index that ``step`` ("current", "previous" or an int) stands for here."""
        try:
            return resolve_step(self.source.session, step, (self.node, self.slot))
        except (LookupError, ValueError, TypeError, AttributeError):
            return None

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
        # the label is as wide as its text ("dim 2 (1024)" is never cut); the box keeps room for "2:10"
        box = w.Text(value=text, description=f"dim {axis} ({size})", continuous_update=False,
                     layout=w.Layout(width="auto", min_width="190px", flex="0 0 auto"),
                     style={"description_width": "initial"}, _dom_classes=(f"nbdebug-slice-{axis}", "nbdebug-slice"))
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
        if self._quiet:
            return
        self.tolerance.layout.display = "flex" if self.mode.value == "compare" else "none"
        self.redraw()

    def values(self) -> np.ndarray | None:
        """The whole tensor for the current mode (the difference in comparison mode)."""
        mode = self.mode.value
        if mode == "current":
            return self._cur
        if mode == "previous":
            return self._prev
        return self._difference()

    def _difference(self) -> np.ndarray | None:
        """current − previous with the tolerance applied (cached per tolerance); None without both."""
        if self._cur is None or self._prev is None or self._cur.shape != self._prev.shape:
            return None
        tol = float(self.tolerance.value)
        if self._diff is None or self._diff[0] != tol:
            self._diff = (tol, compare(self._cur, self._prev, tol))
        return self._diff[1]

    def _draw_title(self, label: str) -> None:
        """The title names the step of the mode shown (``previous step 2`` in Previous step mode)."""
        node, slot, dtype, shape = self._title_parts
        value = (f"<code>{html.escape(node)}</code> <b>{html.escape(slot)}</b> · "
                 f"<span class='nbdebug-tensor-step'>{html.escape(label)}</span> · {html.escape(dtype)} {shape}")
        if self.title.value != value:
            self.title.value = value

    def redraw(self) -> None:
        if self.node is None:
            return
        self._draw_stats()
        mode = {"current": "current", "previous": "previous"}.get(self.mode.value, "difference")
        label = step_label(mode, *self._step_ints)
        self._draw_title(label)
        title = f"{self.node} {self.slot}"
        reveal, self._reveal = self._reveal, False
        values = self.values()
        if values is None:
            why = self.stat_columns.get(mode, {}).get("note") or self.stat_columns.get(mode, {}).get("error")
            missing = {"current": "current step", "previous": "previous step"}.get(self.mode.value,
                                                                                  "both steps (same shape)")
            why = why or f"no values retained for the {missing}"
            self.slice_error.value = f"<i>{html.escape(why)}</i>"
            self.shown, self.message = None, empty_message(title, label, why)
            self.heatmap.post(self.message)
            self.table.value = ""
            return
        try:
            msg, plane = heatmap_message(values, self.selection, title=title, step=label,
                                         diverging=True if mode == "difference" else None, reveal=reveal)
        except ValueError as e:
            self.slice_error.value = f"<span style='color:#cf222e'>{html.escape(str(e))}</span>"
            return
        self.slice_error.value = ""
        self.shown, self.message = plane, msg
        self.heatmap.post(msg, [memoryview(plane)])
        note = (f"<div class='nbdebug-tensor-note'><small>{html.escape(msg['note'])}</small></div>"
                if msg["note"] else "")
        self.table.value = _value_table(plane, msg["rows"], msg["cols"]) + note

    def _draw_stats(self) -> None:
        key = (self.node, self.slot, self._steps, id(self._cur), id(self._prev), float(self.tolerance.value))
        if key == self._stats_key:  # a new selection or mode: same statistics (they are of whole tensors)
            return
        self._stats_key = key
        diff = self._difference()
        errors = self.error_texts
        cols = {
            "current": stats_from(self._cur, self._recorded(self._steps[0]), errors.get("current", "")),
            "previous": stats_from(self._prev, self._recorded(self._steps[1]), errors.get("previous", "")),
            "difference": stats_from(diff, None, "needs the values of both steps, of the same shape"),
        }
        self.stat_columns = cols
        is_bool = self._cur is not None and self._cur.dtype == np.bool_
        fields = BOOL_FIELDS if is_bool else STAT_FIELDS
        texts = {c: stat_texts(st, fields) for c, st in cols.items()}
        head = "".join(f"<th>{c}</th>" for c in cols)
        body = []
        for f in fields:
            cells = "".join(f"<td>{texts[c][f]}</td>" for c in cols)
            body.append(f"<tr><th style='text-align:left'>{_STAT_LABEL.get(f, f)}</th>{cells}</tr>")
        notes = [f"{c}: {st.get('note') or st.get('error')}" + (" (recorded statistics; n/a = not known without "
                                                                 "the values)" if st.get("basis") == "recorded" else "")
                 for c, st in cols.items() if c != "difference" and (st.get("note") or st.get("error"))]
        foot = "".join(f"<div class='nbdebug-stats-note'><small>{html.escape(n)}</small></div>" for n in notes)
        self.stats.value = (f"<b>Statistics</b> <small>(max/min/mean of the finite values)</small>"
                            f"<table class='nbdebug-table' style='font-size:11px'>"
                            f"<tr><th></th>{head}</tr>{''.join(body)}</table>{foot}")

    def stat_texts(self, column: str = "current") -> dict[str, str]:
        """The statistics as shown in ``column`` (field -> text), for comparison with node details."""
        return stat_texts(self.stat_columns[column], STAT_FIELDS)

    def _recorded(self, step: int | str) -> Callable[[], Any] | None:
        if step == -1 or self.node is None:
            return None
        node, slot = self.node, self.slot
        return lambda: self.source.stats(node, slot, step)

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
        msg = relations_message(self.source.graph, self.node, int(self.hops.value), self.source.hits)
        self._rel_names = [n[0] for n in msg["nodes"]]
        self.marks = {n[0]: n[4] for n in msg["nodes"] if n[4]}
        self.relations.post(msg)

    def _click_relation(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        name = content.get("name")
        if isinstance(name, str) and name in self.source.graph.nodes:
            self.on_select(name)


def relations_message(graph: Any, name: str, hops: int, hits: Any = ()) -> dict[str, Any]:
    """The ``relations`` message: nodes ``[name, label, class, depth, hit marks]`` by depth then execution
    order, and the edges between them as index pairs.

    >>> from nbdebug.session.graph import Graph
    >>> g = Graph()
    >>> for n in "abc":
    ...     _ = g.add_node(n, kind="op", op_type="op")
    >>> g.add_edge("a", "b"); g.add_edge("b", "c")
    >>> m = relations_message(g, "b", 1)
    >>> [(n[0], n[3]) for n in m["nodes"]], m["edges"]
    ([('a', -1), ('b', 0), ('c', 1)], [0, 1, 1, 2])
    """
    rel = relationship(graph, name, hops)
    names = sorted(rel, key=lambda n: (rel[n], graph.nodes[n].order if n in graph.nodes else 0, n))
    marks: dict[str, list[str]] = {}
    for h in hits:
        if h.hits and h.node in rel:
            lst = marks.setdefault(h.node, [])
            if h.condition not in lst:
                lst.append(h.condition)
    pos = {n: i for i, n in enumerate(names)}
    edges: list[int] = []
    for a in names:
        for b in sorted(graph.successors(a), key=lambda n: pos.get(n, -1)):
            if b in pos:
                edges += [pos[a], pos[b]]
    nodes = [[n, short_label(graph.nodes[n]), node_class(graph.nodes[n]), rel[n], ",".join(marks.get(n, []))]
             for n in names]
    return {"type": "relations", "center": name, "hops": int(hops), "nodes": nodes, "edges": edges}


def _value_table(part: np.ndarray, rows: list[int] | None, cols: list[int] | None) -> str:
    """The top-left corner of ``part`` as an HTML table, rows and columns labelled with their original
    indices."""
    shown = part[:MAX_TABLE, :MAX_TABLE]
    rlab = rows if rows is not None else [""] * shown.shape[0]
    clab = cols if cols is not None else [""] * shown.shape[1]
    head = "".join(f"<th>{j}</th>" for j in clab[:shown.shape[1]])
    body = "".join("<tr><th>" + str(i) + "</th>" + "".join(f"<td>{fmt(v.item())}</td>" for v in r) + "</tr>"
                   for i, r in zip(rlab, shown))  # noqa: B905
    more = ""
    if part.shape[0] > MAX_TABLE or part.shape[1] > MAX_TABLE:
        more = (f"<div class='nbdebug-table-note'><small>table shows {shown.shape[0]}×{shown.shape[1]} of "
                f"{part.shape[0]}×{part.shape[1]}</small></div>")
    return f"<table class='nbdebug-table' style='font-size:10px'><tr><th></th>{head}</tr>{body}</table>{more}"
