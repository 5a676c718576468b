"""The computational graph, drawn by nbdebug's front end (``FrontendWidget(view="graph")``, see
``frontend/PROTOCOL.md``): the kernel sends compact data (:mod:`nbdebug.ui.graph_data`), the browser lays
it out (elkjs) and draws it.

Traits ``expanded`` (open scope keys), ``selected`` (node name) and ``sections`` (sections shown) are
shared with the browser: either side may change them. A click in the browser (``click`` message or a
new ``selected``) calls ``on_select(name)``; a ``hover`` is answered with a ``card``. :meth:`GraphView.refresh`
sends a ``delta`` when the graph only grew, a full ``graph`` otherwise, and ``marks`` when they changed.
``status`` is ``"live"``, ``"offline"`` or ``"closed"`` (the debugger was closed).

>>> from nbdebug.session.session import Session
>>> s = Session(framework="pytorch", live=False)
>>> _ = s.graph.add_node("Input.0", kind="input", op_type="input")
>>> gv = GraphView(s)
>>> [m["type"] for m in gv.widget.recorded()], gv.widget.status
(['graph', 'marks'], 'offline')
>>> gv.visible_keys()
['Input.0']
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import traitlets as t

from .frontend import FrontendWidget
from .graph_data import ROOTS, SECTIONS, GraphFeed, card, key_chain, marks
from .layout import scope_key
from .source import SourceView


class GraphWidget(FrontendWidget):
    """The graph view's widget: :class:`FrontendWidget` with the graph's shared traits."""

    expanded = t.List(t.Unicode()).tag(sync=True)
    selected = t.Unicode("").tag(sync=True)
    sections = t.List(t.Unicode(), default_value=list(SECTIONS)).tag(sync=True)

    def __init__(self, feed: GraphFeed | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._feed = feed

    def recorded(self) -> list[dict[str, Any]]:
        """As :meth:`FrontendWidget.recorded`, with the ``graph`` message brought up to date with the deltas
        sent since (a later view or a snapshot starts from the whole current graph)."""
        if self._feed is not None and "graph" in self._last:
            self._last["graph"] = self._feed.message()
        return super().recorded()


class GraphView:
    """The executed graph of ``source`` with collapsible scopes.

    ``on_select(name)`` is called when the user clicks a node in the browser.
    """

    def __init__(self, source: Any, on_select: Callable[[str], Any] = lambda name: None,
                 height: int = 520) -> None:
        self.source = source if isinstance(source, SourceView) else SourceView(source)
        self.on_select = on_select
        self.feed = GraphFeed()
        self.widget = GraphWidget(self.feed, view="graph", height=height, _dom_classes=("nbdebug-graph",))
        self._marks: dict[str, Any] | None = None
        self._marks_sig: Any = None
        self._marks_now: dict[str, Any] = {}
        self._quiet = False
        self._notified: str | None = None
        self.widget.handle("hello", self._hello)
        self.widget.handle("hover", self._hover)
        self.widget.handle("click", self._click)
        self.widget.observe(self._selected_changed, names="selected")
        self.refresh()

    # -- shared state -----------------------------------------------------------------------------
    @property
    def expanded(self) -> set[str]:
        return set(self.widget.expanded)

    @expanded.setter
    def expanded(self, keys: set[str]) -> None:
        self.widget.expanded = sorted(keys)

    @property
    def selected(self) -> str | None:
        return self.widget.selected or None

    @selected.setter
    def selected(self, name: str | None) -> None:
        self._quiet = True
        try:
            self.widget.selected = name or ""
        finally:
            self._quiet = False
        self._notified = name

    # -- user actions -----------------------------------------------------------------------------
    def expand(self, key: str) -> None:
        """Open a scope box (``"forward:fc1"``) and the scopes around it."""
        if key not in self.feed.scopes:
            raise KeyError(f"no scope {key!r} in the graph")
        self.expanded = self.expanded | {k for k in key_chain(key) if k not in ROOTS}
        self._show_section(key.split(":", 1)[0])

    def collapse(self, key: str) -> None:
        """Close a scope box and everything opened inside it."""
        prefix = key + "/" if not key.endswith(":") else key
        self.expanded = {k for k in self.expanded if k != key and not k.startswith(prefix)}

    def toggle(self, key: str) -> None:
        if key in self.expanded:
            self.collapse(key)
        else:
            self.expand(key)

    def reveal(self, name: str) -> None:
        """Open the scopes around node ``name``, select it and centre it in the browser."""
        if name not in self.source.graph.nodes:
            raise KeyError(f"no node named {name!r} in the graph")
        self.refresh()
        key = self.feed.index.key_of[name] if self.feed.index is not None else ""
        opened = {k for k in key_chain(key) if k not in ROOTS}
        if not opened <= self.expanded:
            self.expanded = self.expanded | opened
        self._show_section(key.split(":", 1)[0])
        self.selected = name
        self.widget.post({"type": "command", "action": "reveal", "name": name}, record=False)

    def select(self, name: str | None) -> None:
        """Mark ``name`` as selected (the browser shows its collapsed scope when it is hidden)."""
        self.selected = name

    def _show_section(self, section: str) -> None:
        if section in SECTIONS and section not in self.widget.sections:
            self.widget.sections = [s for s in SECTIONS if s in self.widget.sections or s == section]

    # -- browser → kernel -------------------------------------------------------------------------
    def _notify(self, name: str) -> None:
        if not name or name == self._notified or name not in self.source.graph.nodes:
            return
        self._notified = name
        self.on_select(name)

    def _selected_changed(self, change: dict[str, Any]) -> None:
        if not self._quiet:
            self._notify(change["new"])

    def _click(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        name = content.get("name")
        if isinstance(name, str):
            self._notify(name)

    def _hover(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        name = content.get("name")
        if isinstance(name, str) and name in self.source.graph.nodes:
            self.widget.post(self.card(name), record=False)

    def _hello(self, _content: dict[str, Any], _buffers: list[Any]) -> None:
        self.widget.post(self.feed.message(), record=False)
        self.widget.post(self._marks or self.marks(), record=False)

    def card(self, name: str) -> dict[str, Any]:
        """The hover card of node ``name``."""
        idx = self.feed.index
        return card(self.source, name, idx.key_of.get(name) if idx is not None else None)

    # -- drawing ----------------------------------------------------------------------------------
    def refresh(self, force: bool = False) -> None:
        """Send what changed: a ``delta`` (or the whole ``graph``), then ``marks`` when they changed."""
        self.widget.status = self._status()
        graph = self.source.graph
        if force or self.feed.index is None:
            self.widget.post(self.feed.full(graph))
        else:
            msg = self.feed.update(graph)
            if msg is not None:
                self.widget.post(msg, record=msg["type"] == "graph")
        m = self.marks()
        if force or m != self._marks:
            self._marks = m
            self.widget.post(m)

    def marks(self) -> dict[str, Any]:
        """The ``marks`` message now (recomputed only when hits, step, state or the graph changed: it may
        look for the first non-finite tensor)."""
        src = self.source
        wps = tuple((w.id, w.version, w.enabled) for w in list(src.watchpoints.watchpoints.values()))
        sig = (len(src.obj.hits), wps, src.step, src.state, src.current_node, self.feed.rev, self._status())
        if self._marks_sig != sig:
            self._marks_sig = sig
            self._marks_now = marks(src, self.feed.ids)
        return self._marks_now

    def _status(self) -> str:
        obj = self.source.obj
        if getattr(obj, "closed", False):
            return "closed"
        return "live" if self.source.live else "offline"

    def visible_keys(self) -> list[str]:
        """What the browser shows with the current ``expanded``/``sections``: nodes whose scopes are all open,
        and the collapsed scopes whose parents are open (in execution order)."""
        exp = self.expanded
        shown = set(self.widget.sections)
        first: dict[str, int] = {}
        for row in self.feed.rows:
            name, key, order = row[0], row[3], row[5]
            section = key.split(":", 1)[0]
            if section not in shown:
                continue
            item = name
            for k in key_chain(key)[1:]:
                if k not in exp:
                    item = k
                    break
            o = order if order >= 0 else 1 << 60
            if item not in first or o < first[item]:
                first[item] = o
        return sorted(first, key=lambda k: (first[k], k))

    def snapshot(self) -> dict[str, Any]:
        """Traits and the current ``graph`` and ``marks``: what ``renderStatic`` draws without a kernel."""
        self.refresh()
        return self.widget.snapshot()

    # -- export -----------------------------------------------------------------------------------
    def export(self, path: str | Path) -> Path:
        """Write the graph to ``path``: ``.html`` (self-contained: the front end inlined, the graph drawn
        by it with no kernel and no server)."""
        from .export import graph_html

        p = Path(path)
        fmt = p.suffix.lower()
        if fmt not in (".html", ".htm"):
            raise ValueError(f"export: unsupported format {p.suffix!r}; the graph exports to .html "
                             "(self-contained, opens in any browser; print it to PDF from there)")
        p.write_text(graph_html(self.snapshot()), encoding="utf-8")
        return p


__all__ = ["GraphView", "GraphWidget", "scope_key"]
