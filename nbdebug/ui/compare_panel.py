"""The compare panel: the rows of :func:`nbdebug.compare` as a sortable, filterable, colour-coded table.

Rows are red (error), orange (warning), white (pass) or grey (unmatched). Clicking a row shows both tensors
side by side with their difference (heatmaps of a 2-D selection when the values are available, the
statistics otherwise) and selects the node in the graphs of both runs.

Stable CSS classes (for browser tests)::

    nbdebug-compare                 the panel
    nbdebug-compare-summary         counts and the first divergence
    nbdebug-compare-first           button: select the first divergent node
    nbdebug-compare-filter          name filter (Text); nbdebug-compare-status status filter (ToggleButtons)
    nbdebug-compare-sort            sort column (Dropdown); nbdebug-compare-desc descending (Checkbox)
    nbdebug-compare-prev / -next    pages; nbdebug-compare-page the "rows a–b of n" label
    nbdebug-compare-row             one row (also nbdebug-compare-<status>); its first child is the
                                    clickable name button
    nbdebug-compare-detail          the details of the selected row; nbdebug-compare-tensors the heatmaps
                                    (front-end heatmap views, nbdebug-compare-heat-<target|golden|diff>)
    nbdebug-compare-graph-target / nbdebug-compare-graph-golden   the two graphs

Example (with dumps on disk)::

    import nbdebug
    nbdebug.compare("run_a", "run_b").panel()
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable
from typing import Any

import ipywidgets as W
import numpy as np

from ..compare.result import CompareResult, CompareRow
from .frontend import FrontendWidget
from .heatmap_data import heatmap_message
from .tensor_math import default_selection

COLOURS = {"error": "#f4b6b6", "warning": "#fcd49b", "pass": "#ffffff", "unmatched": "#d9d9d9"}
STATUS_FILTERS = ("all", "error", "warning", "pass", "unmatched")
#: sort keys: label -> function of a row (NaN/None sort last)
SORTS: dict[str, Callable[[CompareRow], Any]] = {
    "execution order": lambda r: r.order,
    "name": lambda r: r.name,
    "status": lambda r: ("error", "warning", "pass", "unmatched").index(r.status),
    "Cosine": lambda r: r.cosine,
    "MaxAbsErr": lambda r: r.max_abs_err,
    "MaxRelativeErr": lambda r: r.max_rel_err,
    "One Thousandth Err Ratio": lambda r: r.one_thousandth,
    "Norm rel diff %": lambda r: r.stat_rel_pct[3] if r.stat_rel_pct else math.nan,
    "Max diff": lambda r: abs(r.stat_diff[0]) if r.stat_diff else math.nan,
}
MAX_HEATMAP = 64  # cells per side shown in the heatmaps


def _num(x: Any) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "N/A"
    if isinstance(x, float):
        return f"{x:.6g}"
    return str(x)


def _sort_value(v: Any) -> tuple[int, Any]:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return (1, 0)
    return (0, v)


TENSOR_PANES = (("target", "target"), ("golden", "golden"), ("diff", "target − golden"))


def _heat(values: np.ndarray, title: str, step: str, diverging: bool | None = None) -> tuple[dict, np.ndarray]:
    """The heatmap message of ``values``: leading axes at index 0, at most MAX_HEATMAP cells per side."""
    a = np.asarray(values)
    return heatmap_message(a, default_selection(a.shape), title=title, step=step, diverging=diverging,
                           max_cells=MAX_HEATMAP)


def _summary_html(result: CompareResult, labels: tuple[str, str] | None) -> str:
    """The panel's first line: both sides and steps, the rows counted by status, the unmatched nodes."""
    c = result.counts()
    tl, gl = labels or (result.target_framework, result.golden_framework)
    return (f"<b>{html.escape(tl)}</b> step {result.target_step} vs golden "
            f"<b>{html.escape(gl)}</b> step {result.golden_step} — "
            + " ".join(f"<span style='background:{COLOURS[s]};padding:0 4px;border:1px solid #bbb'>"
                       f"{c[s]} {s}</span>" for s in ("error", "warning", "pass", "unmatched"))
            + f" — unmatched nodes: {len(result.unmatched_target)} target, {len(result.unmatched_golden)} "
              f"golden")


class ComparePanel:
    """Widget over a :class:`~nbdebug.compare.result.CompareResult` (``.widget``; display the panel itself).

    ``graphs=False`` leaves out the two graph views (faster for huge graphs). ``labels``: how the summary
    names the two sides (default: their frameworks; a rank compare passes ``("rank 1", "rank 0")``).
    """

    def __init__(self, result: CompareResult, *, page_size: int = 40, graphs: bool = True,
                 labels: tuple[str, str] | None = None) -> None:
        self.result = result
        self.page_size = page_size
        self.page = 0
        self.selected: CompareRow | None = None
        self.status_filter = "all"
        self.text_filter = ""
        self.sort_by = "execution order"
        self.descending = False
        self._visible: list[CompareRow] = []
        self.row_boxes: list[W.HBox] = []
        self.row_buttons: list[W.Button] = []

        self.summary = W.HTML(_summary_html(result, labels), _dom_classes=("nbdebug-compare-summary",))
        fd = result.first_divergence
        self.first_button = W.Button(description=f"first divergence: {fd.node}" if fd else "no divergence",
                                     disabled=fd is None, layout=W.Layout(width="auto"),
                                     tooltip=fd.describe() if fd else "", _dom_classes=("nbdebug-compare-first",))
        self.first_button.on_click(lambda _b: self.select_first_divergence())
        controls = self._build_controls()
        self.header_row = W.HTML(self._header_html())
        self.table = W.VBox(layout=W.Layout(max_height="420px", overflow="auto"))
        self.detail = W.HTML("<i>click a row to compare its tensors</i>", _dom_classes=("nbdebug-compare-detail",))
        self._build_tensor_views()
        self.graph_target: Any = None
        self.graph_golden: Any = None
        self.graph_message = W.HTML()
        graph_boxes = self._build_graphs() if graphs else []
        self.widget = W.VBox([
            W.HBox([self.summary, self.first_button]), controls, self.filter_status, self.header_row,
            self.table, self.detail, self.tensors, self.graph_message, W.HBox(graph_boxes),
        ], _dom_classes=("nbdebug-compare",))
        self.refresh()

    def _build_controls(self) -> W.HBox:
        """The name and status filters, the sort menu and the page buttons; returns the row above the table
        (the status filter is placed on its own row)."""
        self.filter_text = W.Text(placeholder="filter by name", layout=W.Layout(width="220px"),
                                  _dom_classes=("nbdebug-compare-filter",))
        self.filter_text.observe(lambda ch: self.set_filter(text=ch["new"]), names="value")
        self.filter_status = W.ToggleButtons(options=STATUS_FILTERS, value="all",
                                             style={"button_width": "72px"}, _dom_classes=("nbdebug-compare-status",))
        self.filter_status.observe(lambda ch: self.set_filter(status=ch["new"]), names="value")
        self.sort_menu = W.Dropdown(options=list(SORTS), value="execution order", description="sort",
                                    layout=W.Layout(width="260px"), _dom_classes=("nbdebug-compare-sort",))
        self.sort_menu.observe(lambda ch: self.sort(ch["new"], self.descending), names="value")
        self.desc_box = W.Checkbox(value=False, description="descending", indent=False,
                                   layout=W.Layout(width="110px"), _dom_classes=("nbdebug-compare-desc",))
        self.desc_box.observe(lambda ch: self.sort(self.sort_by, ch["new"]), names="value")
        self.prev_button = W.Button(description="◀", layout=W.Layout(width="36px"),
                                    _dom_classes=("nbdebug-compare-prev",))
        self.prev_button.on_click(lambda _b: self.goto_page(self.page - 1))
        self.next_button = W.Button(description="▶", layout=W.Layout(width="36px"),
                                    _dom_classes=("nbdebug-compare-next",))
        self.next_button.on_click(lambda _b: self.goto_page(self.page + 1))
        self.page_label = W.Label(_dom_classes=("nbdebug-compare-page",))
        return W.HBox([self.filter_text, self.sort_menu, self.desc_box, self.prev_button, self.page_label,
                       self.next_button])

    def _build_tensor_views(self) -> None:
        """The three heatmaps of the selected row (front-end views, hidden until a row is selected);
        ``tensor_shown`` the arrays they show."""
        self.tensor_views: dict[str, FrontendWidget] = {}
        for key, _title in TENSOR_PANES:
            fw = FrontendWidget(view="heatmap", height=300, layout=W.Layout(width="33%", display="none"),
                                _dom_classes=(f"nbdebug-compare-heat-{key}",))
            self.tensor_views[key] = fw
        self.tensor_shown: dict[str, np.ndarray] = {}
        self.tensor_message = W.HTML("")
        self.tensors = W.VBox([self.tensor_message, W.HBox(list(self.tensor_views.values()))],
                              _dom_classes=("nbdebug-compare-tensors",))

    def _build_graphs(self) -> list[W.VBox]:
        """The graph views of both runs, each titled (a run whose graph cannot be drawn has none)."""
        self.graph_target, self.graph_golden = self._graph(self.result.target), self._graph(self.result.golden)
        boxes = []
        for gv, cls, title in ((self.graph_target, "nbdebug-compare-graph-target", "target"),
                               (self.graph_golden, "nbdebug-compare-graph-golden", "golden")):
            if gv is not None:
                gv.widget.add_class(cls)
                boxes.append(W.VBox([W.HTML(f"<b>{title}</b>"), gv.widget], layout=W.Layout(width="50%")))
        return boxes

    # -- graphs -------------------------------------------------------------------------------------
    def _graph(self, session: Any) -> Any:
        try:
            from .graph_view import GraphView
            from .source import SourceView

            return GraphView(SourceView(session), height=300)
        except Exception as e:  # a graph that cannot be drawn must not take the table down
            self.graph_message.value = (f"<span style='color:#a00'>graph view unavailable: "
                                        f"{html.escape(type(e).__name__)}: {html.escape(str(e))}</span>")
            return None

    # -- rows -----------------------------------------------------------------------------------------
    def visible_rows(self) -> list[CompareRow]:
        """All rows passing the filters, in the chosen order (every page)."""
        rows = self.result.rows
        if self.status_filter != "all":
            rows = [r for r in rows if r.status == self.status_filter]
        if self.text_filter:
            needle = self.text_filter.lower()
            rows = [r for r in rows if needle in r.name.lower() or needle in (r.golden_name or "").lower()]
        key = SORTS[self.sort_by]
        rows = sorted(rows, key=lambda r: _sort_value(key(r)), reverse=False)
        if self.descending:  # NaN stays last
            known = [r for r in rows if _sort_value(key(r))[0] == 0]
            rows = known[::-1] + [r for r in rows if _sort_value(key(r))[0] == 1]
        return rows

    def set_filter(self, text: str | None = None, status: str | None = None) -> None:
        if status is not None:
            if status not in STATUS_FILTERS:
                raise ValueError(f"status must be one of {STATUS_FILTERS}, got {status!r}")
            self.status_filter = status
            if self.filter_status.value != status:
                self.filter_status.value = status
        if text is not None:
            self.text_filter = text
            if self.filter_text.value != text:
                self.filter_text.value = text
        self.page = 0
        self.refresh()

    def sort(self, by: str, descending: bool = False) -> None:
        if by not in SORTS:
            raise ValueError(f"sort by one of {list(SORTS)}, got {by!r}")
        self.sort_by, self.descending = by, bool(descending)
        if self.sort_menu.value != by:
            self.sort_menu.value = by
        if self.desc_box.value != self.descending:
            self.desc_box.value = self.descending
        self.page = 0
        self.refresh()

    def goto_page(self, page: int) -> None:
        n_pages = max(1, math.ceil(len(self._visible) / self.page_size))
        self.page = min(max(0, page), n_pages - 1)
        self._draw_rows()

    def refresh(self) -> None:
        self._visible = self.visible_rows()
        self._draw_rows()

    def _header_html(self) -> str:
        cols = ("tensor", "golden", "status", "Cosine", "MaxAbsErr", "MaxRelErr", "1‰ ratio", "Norm rel %")
        widths = ("30%", "24%", "8%", "7%", "8%", "8%", "7%", "8%")
        cells = "".join(f"<div style='display:inline-block;width:{w};font-weight:bold'>{c}</div>"
                        for c, w in zip(cols, widths, strict=True))
        return f"<div style='white-space:nowrap'>{cells}</div>"

    def _draw_rows(self) -> None:
        start = self.page * self.page_size
        page_rows = self._visible[start:start + self.page_size]
        boxes, buttons = [], []
        for r in page_rows:
            # a long name is cut in the button: its tooltip carries it whole, with why the row has its status
            b = W.Button(description=r.name, tooltip=f"{r.name}: " + ("; ".join(r.messages) or r.status),
                         layout=W.Layout(width="30%", justify_content="flex-start"),
                         style={"button_color": COLOURS[r.status]})  # at creation: no update message
            b.on_click(lambda _b, row=r: self.select(row))
            rel = r.stat_rel_pct[3] if r.stat_rel_pct else None
            cells = [W.Label(r.golden_name or "—", layout=W.Layout(width="24%")),
                     W.Label(r.status, layout=W.Layout(width="8%"))]
            for v, w in ((r.cosine, "7%"), (r.max_abs_err, "8%"), (r.max_rel_err, "8%"), (r.one_thousandth, "7%"),
                         (rel, "8%")):
                cells.append(W.Label(_num(v), layout=W.Layout(width=w)))
            classes = ("nbdebug-compare-row", f"nbdebug-compare-{r.status}",
                       *(("nbdebug-compare-selected",) if r is self.selected else ()))
            box = W.HBox([b, *cells], layout=W.Layout(width="100%", flex="0 0 auto"),  # never squeezed by the table
                         _dom_classes=classes)
            boxes.append(box)
            buttons.append(b)
        self.row_boxes, self.row_buttons = boxes, buttons
        self.table.children = boxes
        n = len(self._visible)
        self.page_label.value = f"rows {start + 1 if n else 0}–{min(n, start + self.page_size)} of {n}"
        self.prev_button.disabled = self.page == 0
        self.next_button.disabled = start + self.page_size >= n

    # -- selection --------------------------------------------------------------------------------------
    def select_first_divergence(self) -> CompareRow | None:
        fd = self.result.first_divergence
        if fd is None:
            return None
        row = self.result.row(fd.node, fd.slots[0])
        self.select(row)
        return row

    def select(self, row: CompareRow | int) -> None:
        """Show ``row`` (or the index of a visible row) in the details, tensors and graphs."""
        if isinstance(row, int):
            row = self._visible[row]
        self.selected = row
        self.detail.value = self._detail_html(row)
        self._draw_tensors(row)
        for gv, node in ((self.graph_target, row.target), (self.graph_golden, row.golden)):
            if gv is None:
                continue
            if node is not None and node in gv.source.graph.nodes:
                gv.reveal(node)
            else:
                gv.select(None)
        for box in self.row_boxes:
            box.remove_class("nbdebug-compare-selected")
        if row in self._visible:
            idx = self._visible.index(row)
            if idx // self.page_size != self.page:
                self.goto_page(idx // self.page_size)
            pos = idx - self.page * self.page_size
            if 0 <= pos < len(self.row_boxes):
                self.row_boxes[pos].add_class("nbdebug-compare-selected")

    def _detail_html(self, r: CompareRow) -> str:
        def stats_cells(s):
            return "".join(f"<td>{_num(v)}</td>" for v in (s or (None,) * 4))

        msg = "".join(f"<li>{html.escape(m)}</li>" for m in r.messages) or "<li>no flag</li>"
        metrics = " · ".join(f"{k} {_num(getattr(r, a))}" for k, a in (
            ("Cosine", "cosine"), ("EucDist", "euc_dist"), ("MaxAbsErr", "max_abs_err"),
            ("MaxRelativeErr", "max_rel_err"), ("1‰", "one_thousandth"), ("5‰", "five_thousandths")))
        return (
            f"<div style='border-left:6px solid {COLOURS[r.status] if r.status != 'pass' else '#9c9'};"
            f"padding-left:8px'><b>{html.escape(r.name)}</b> ↔ <b>{html.escape(r.golden_name or '—')}</b> "
            f"({r.status}, {r.mode or 'no pair'}, matched by {r.matched_by or '—'})<br>"
            f"<table><tr><th></th><th>dtype</th><th>shape</th><th>max</th><th>min</th><th>mean</th><th>norm</th>"
            f"</tr><tr><td>target</td><td>{r.target_dtype or ''}</td><td>{list(r.target_shape or ())}</td>"
            f"{stats_cells(r.target_stats)}</tr><tr><td>golden</td><td>{r.golden_dtype or ''}</td>"
            f"<td>{list(r.golden_shape or ())}</td>{stats_cells(r.golden_stats)}</tr><tr><td>diff</td><td></td>"
            f"<td></td>{stats_cells(r.stat_diff)}</tr><tr><td>rel %</td><td></td><td></td>"
            f"{stats_cells(r.stat_rel_pct)}</tr></table>{metrics}<ul>{msg}</ul></div>")

    def _values(self, r: CompareRow) -> tuple[np.ndarray | None, np.ndarray | None, str]:
        res = self.result
        a = b = None
        why = []
        if r.target is not None:
            try:
                a = np.asarray(res.target.tensor(r.target, r.slot, res.target_step))
            except Exception as e:
                why.append(f"target: {e}")
        if r.golden is not None:
            try:
                b = np.asarray(res.golden.tensor(r.golden, r.golden_slot or r.slot, res.golden_step))
            except Exception as e:
                why.append(f"golden: {e}")
        return a, b, "; ".join(why)

    def _draw_tensors(self, r: CompareRow) -> None:
        a, b, why = self._values(r)
        res = self.result
        steps = {"target": f"target step {res.target_step}", "golden": f"golden step {res.golden_step}",
                 "diff": f"difference target step {res.target_step} − golden step {res.golden_step}"}
        arrays: dict[str, tuple[np.ndarray, bool | None]] = {}
        if a is not None:
            arrays["target"] = (a, None)
        if b is not None:
            arrays["golden"] = (b, None)
        if a is not None and b is not None and np.shape(a) == np.shape(b):
            with np.errstate(invalid="ignore", over="ignore"):
                arrays["diff"] = (np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64), True)
        self.tensor_shown = {}
        for key, title in TENSOR_PANES:
            fw = self.tensor_views[key]
            if key not in arrays:
                fw.layout.display = "none"
                fw.forget("heatmap")
                continue
            values, diverging = arrays[key]
            msg, plane = _heat(values, f"{title}: {r.name}" if key == "target" else title, steps[key], diverging)
            self.tensor_shown[key] = plane
            fw.post(msg, [memoryview(plane)])
            fw.layout.display = "block"
        if why or not arrays:
            self.tensor_message.value = f"<i>{html.escape(why or 'no tensor values (statistics dump)')}</i>"
        else:
            self.tensor_message.value = ""

    # -- display ------------------------------------------------------------------------------------
    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)
