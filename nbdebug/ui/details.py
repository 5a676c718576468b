"""Node details: the selected node's inputs and outputs (dtype, shape, statistics; a value preview and the
data flow on rows of their own, the table's whole width), the nodes that produce and consume them, and the
Python stack where the node was called.

Producers and consumers are the graph view's edges (:class:`~.graph_edges.DrawnEdges`): a module call's
consumers are those of the box the graph draws for it, the edges leaving its scope.

Producer/consumer buttons (``nbdebug-details-link``) select that node; the ``View <slot>`` buttons
(``nbdebug-details-view``) open the tensor view on that slot.

Statistics are those of :func:`~.tensor_math.stats_from` (max/min/mean of the finite values, NaN/Inf counts),
the numbers the tensor view shows for the same tensor and step.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w
import numpy as np

from .graph_data import ScopeIndex
from .graph_edges import DrawnEdges
from .source import SourceView
from .tensor_math import fmt, stat_texts, stats_from

MAX_LINKS = 12
PREVIEW = 6
_SHOWN = ("max", "min", "mean", "count", "nan_count", "neg_inf_count", "pos_inf_count", "zero_count")
_HEAD = ("max", "min", "mean", "count", "NaN", "−Inf", "+Inf", "zero")


_KEEP = "<td style='white-space:nowrap'>{}</td>"  # slot, dtype, shape: one line each
# A slot's value preview and data flow each take a row of their own under its statistics, across the whole
# table: beside eleven columns of statistics a value column got what was left (a few characters wide).
_SPAN = 3 + len(_HEAD)
_VALUE = (f"<tr><td class='nbdebug-details-value' colspan='{_SPAN}' style='white-space:normal;"
          "overflow-wrap:anywhere;padding:0 0 2px 12px'>{}</td></tr>")
_FLOW = (f"<tr><td class='nbdebug-details-flow' colspan='{_SPAN}' style='white-space:normal;"
         "overflow-wrap:anywhere;padding:0 0 2px 12px;color:#57606a'>{}</td></tr>")


def shape_text(shape: Any) -> str:
    """A shape on one line: ``4×512×256``; ``scalar`` for ``()``; ``?`` when unknown.

    >>> shape_text((4, 512, 256)), shape_text(()), shape_text(None)
    ('4×512×256', 'scalar', '?')
    """
    if shape is None:
        return "?"
    dims = tuple(shape)
    return "×".join(str(n) for n in dims) if dims else "scalar"


def slot_order(slot: str) -> tuple[int, str]:
    head = slot.split(".", 1)[0]
    rank = {"input": 0, "parameters": 1, "output": 2}.get(head, 3)
    return rank, slot


def preview(values: np.ndarray, n: int = PREVIEW) -> str:
    """The first ``n`` values of a tensor, flattened: ``[0.1, -2, 3, …] (24 values)``."""
    flat = np.asarray(values).reshape(-1)
    head = ", ".join(fmt(v.item() if hasattr(v, "item") else v) for v in flat[:n])
    more = ", …" if flat.size > n else ""
    return f"[{head}{more}] ({flat.size} value{'s' if flat.size != 1 else ''})"


class NodeDetails:
    """Details of one node; ``on_select(name)`` follows a producer/consumer link, ``on_view(name, slot)``
    opens the tensor view."""

    def __init__(self, source: SourceView, on_select: Callable[[str], Any] = lambda name: None,
                 on_view: Callable[[str, str], Any] = lambda name, slot: None) -> None:
        self.source = source
        self.on_select = on_select
        self.on_view = on_view
        self.name: str | None = None
        self.title = w.HTML("<i>Select a node in the graph or the node list.</i>",
                            _dom_classes=("nbdebug-details-title",))
        self.table = w.HTML("", _dom_classes=("nbdebug-details-table",))
        self.views = w.HBox([], layout=w.Layout(flex_flow="row wrap"))
        self.producers = w.HBox([], layout=w.Layout(flex_flow="row wrap"), _dom_classes=("nbdebug-details-producers",))
        self.consumers = w.HBox([], layout=w.Layout(flex_flow="row wrap"), _dom_classes=("nbdebug-details-consumers",))
        self.stack = w.HTML("", _dom_classes=("nbdebug-details-stack",))
        self.widget = w.VBox([self.title, self.table, self.views, self.producers, self.consumers, self.stack],
                             _dom_classes=("nbdebug-details",))
        self._sig: Any = None
        #: slot -> the statistics shown for it (tensor_math.node_stats) at the last refresh
        self.slot_stats: dict[str, dict[str, Any]] = {}
        #: the selected node's producers and consumers, all of them (the buttons show the first MAX_LINKS)
        self.producer_names: list[str] = []
        self.consumer_names: list[str] = []
        self._edges: DrawnEdges | None = None
        self._edges_version: Any = None

    def show(self, name: str | None) -> None:
        self.name = name
        self.refresh(force=True)

    def refresh(self, force: bool = False) -> None:
        name = self.name
        if name is None:
            return
        node = self.source.graph.nodes.get(name)
        if node is None:
            self.title.value = f"<b>{html.escape(name)}</b> — not in the graph"
            return
        sig = (name, self.source.step, self.source.session.step_index, len(self.source.graph))
        if sig == self._sig and not force:
            return
        self._sig = sig
        g = self.source.graph
        self.title.value = (
            f"<b>{html.escape(node.name)}</b><br><small>{html.escape(node.kind)} · {html.escape(node.op_type)}"
            f" · section {html.escape(node.section)} · scope {html.escape(node.scope or '/')}"
            f" · order {node.order}</small>{_moved_note(node)}")
        edges = self.drawn_edges()
        into, out = edges.producers(name), edges.consumers(name)
        self.producer_names = sorted(into, key=_order_of(g))
        self.consumer_names = sorted(out, key=_order_of(g))
        producers: dict[str, list[str]] = {}
        for p in self.producer_names:
            for src_slot, dst_slot in into[p]:
                producers.setdefault(dst_slot, []).append(f"{p} {src_slot}")
        consumers: dict[str, list[str]] = {}
        for c in self.consumer_names:
            for src_slot, dst_slot in out[c]:
                consumers.setdefault(src_slot, []).append(f"{c} {dst_slot}")
        rows = []
        self.slot_stats = {}
        for slot in sorted(node.shapes, key=slot_order):
            dtype = node.dtypes.get(slot, "")
            shape = node.shapes.get(slot)
            try:  # read once: for the statistics and the preview
                values, why = np.asarray(self.source.tensor(name, slot, "current")), ""
                dtype, shape = str(values.dtype), values.shape
            except Exception as e:  # noqa: BLE001 - NotRetainedError & co.: the reason is what we show
                values, why = None, str(e).strip("'\"")
            st = stats_from(values, lambda slot=slot: self.source.stats(name, slot, "current"), why)
            self.slot_stats[slot] = st
            if "error" in st:
                cells = [f"<i>{html.escape(str(st['error'])[:80])}</i>"] + [""] * (len(_SHOWN) - 1)
            else:
                texts = stat_texts(st, _SHOWN)
                cells = [html.escape(texts[k]) for k in _SHOWN]
            # the reason whole: the row spans the table (cut at 120 characters it ended mid-word)
            why = why if len(why) <= 600 else why[:599] + "…"
            value = html.escape(preview(values)) if values is not None else f"<i>{html.escape(why)}</i>"
            link = producers.get(slot) or consumers.get(slot) or []
            rel = ("from " if slot in producers else "to ") + ", ".join(link[:3]) if link else ""
            rel += f" (+{len(link) - 3})" if len(link) > 3 else ""
            rows.append("<tr class='nbdebug-details-slot' style='border-top:1px solid #d0d7de'>"
                        + _KEEP.format(f"<b>{html.escape(slot)}</b>") + _KEEP.format(html.escape(str(dtype)))
                        + _KEEP.format(shape_text(shape)) + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
                        + _VALUE.format(value) + (_FLOW.format(html.escape(rel)) if rel else ""))
        head = "".join(f"<th>{h}</th>" for h in ("slot", "dtype", "shape", *_HEAD))
        # the table scrolls sideways in a narrow panel instead of wrapping shapes or clipping the last column
        self.table.value = (
            "<div class='nbdebug-details-scroll' style='overflow-x:auto;max-width:100%'>"
            "<table class='nbdebug-table' style='font-size:11px;border-collapse:collapse;width:100%'>"
            f"<tr>{head}</tr>{''.join(rows)}</table></div>" if rows else "<i>no tensors recorded for this node</i>")
        self.views.children = [self._view_button(name, s) for s in sorted(node.shapes, key=slot_order)]
        self.producers.children = self._links("Producers:", self.producer_names)
        self.consumers.children = self._links("Consumers:", self.consumer_names)
        stack = "\n".join(node.stack) if node.stack else "(no Python stack recorded)"
        self.stack.value = (f"<details open><summary>Python stack</summary><pre style='font-size:11px'>"
                            f"{html.escape(stack)}</pre></details>")

    def drawn_edges(self) -> DrawnEdges:
        """The graph's edges as the graph view is sent them (a module call's consumers included), for the
        current graph state."""
        graph = self.source.graph
        version = (id(graph), graph.version, len(graph))
        if self._edges is None or self._edges_version != version:
            self._edges = DrawnEdges(graph, ScopeIndex(graph))
            self._edges_version = version
        return self._edges

    def stat_texts(self, slot: str) -> dict[str, str]:
        """The statistics shown for ``slot`` (field -> text), as the tensor view formats them."""
        return stat_texts(self.slot_stats[slot], _SHOWN)

    def _view_button(self, name: str, slot: str) -> w.Button:
        b = w.Button(description=f"View {slot}", layout=w.Layout(width="auto"), _dom_classes=("nbdebug-details-view",))
        b.on_click(lambda _b: self.on_view(name, slot))
        return b

    def _links(self, label: str, names: list[str]) -> list[Any]:
        out: list[Any] = [w.HTML(f"<b>{label}</b>&nbsp;")]
        if not names:
            out.append(w.HTML("<i>none</i>"))
        for n in names[:MAX_LINKS]:
            b = w.Button(description=n, tooltip=n, layout=w.Layout(width="auto"),
                         _dom_classes=("nbdebug-details-link",))
            b.on_click(lambda _b, n=n: self.on_select(n))
            out.append(b)
        if len(names) > MAX_LINKS:
            out.append(w.HTML(f"&nbsp;+{len(names) - MAX_LINKS} more"))
        return out


def _moved_note(node: Any) -> str:
    """A warning when the node's name has stood for different ops: an op that runs in some steps only shifts
    the per-step counters, so ``Tensor.__mul__.3`` may be another call site in another step. The scope and
    stack shown are those of the latest call site; earlier steps' values belong to the op that had the name
    then."""
    moved = getattr(node, "moved", None)
    if not moved:
        return ""
    steps = ", ".join(str(s) for s in moved[-5:]) + (" …" if len(moved) > 5 else "")
    return ("<div class='nbdebug-details-moved' style='color:#b45309;font-size:11px'>⚠ This name stood for "
            f"another call site before step {html.escape(steps)}: an op that runs in some steps only shifts the "
            "counters. Scope and stack are the current call site's; other steps' values belong to the op that "
            "had this name then.</div>")


def _order_of(g: Any) -> Callable[[str], tuple[int, str]]:
    def key(n: str) -> tuple[int, str]:
        node = g.nodes.get(n)
        return (node.order if node is not None and node.order >= 0 else 1 << 60, n)
    return key
