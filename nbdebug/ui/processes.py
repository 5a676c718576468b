"""The job panel of a listener (``nbdebug.listen()``): one row per connected process — host, PID, rank,
device, step, state — a process selector (``nbdebug-process-select``) and the usual :class:`Panel` on the
selected process (the first until another is chosen). Group buttons (``nbdebug-pause-all``,
``nbdebug-continue-all``, ``nbdebug-terminate-all``) act on every process at one step boundary.

>>> from types import SimpleNamespace
>>> from nbdebug.control import EventHub
>>> idle = SimpleNamespace(sources={}, address="127.0.0.1:5555", hub=EventHub(), pause_all=None, cont_all=None,
...                        terminate_all=None)           # a listener nothing connected to yet
>>> ProcessesPanel(idle, loop=None).table.value
'<i>waiting for training processes on 127.0.0.1:5555</i>'

"""

from __future__ import annotations

import html
import weakref
from typing import Any

import ipywidgets as w

from .panel import Panel
from .throttle import _AUTO, Coalescer


def process_rows(sources: dict[Any, Any]) -> list[dict[str, Any]]:
    """One row per process: key, host, pid, rank, device, step, state."""
    rows = []
    for key, src in sources.items():
        info = src.remote_info
        rows.append({"key": key, "host": info.get("host"), "pid": info.get("pid"), "rank": info.get("rank"),
                     "device": info.get("device"), "step": info.get("step"), "state": str(src.state)})
    return rows


class ProcessesPanel(w.VBox):
    """The processes of ``listener`` and a panel on one of them."""

    def __init__(self, listener: Any, *, loop: Any = _AUTO) -> None:
        self.listener = listener
        self._loop = loop
        self.table = w.HTML("")
        self.table.add_class("nbdebug-processes")
        self.select = w.Dropdown(options=[], description="process", layout=w.Layout(width="280px"))
        self.select.add_class("nbdebug-process-select")
        self.select.observe(self._chosen, names="value")
        self.message = w.HTML("")
        self.message.add_class("nbdebug-group-status")
        buttons = []
        for text, css, action in (("pause all", "nbdebug-pause-all", listener.pause_all),
                                  ("continue all", "nbdebug-continue-all", listener.cont_all),
                                  ("terminate all", "nbdebug-terminate-all", listener.terminate_all)):
            b = w.Button(description=text, layout=w.Layout(width="auto"))
            b.add_class(css)
            b.on_click(lambda _b, action=action: self._group(action))
            buttons.append(b)
        self.panel: Panel | None = None
        self._holder = w.VBox([])
        super().__init__([self.table, w.HBox([self.select, *buttons, self.message]), self._holder])
        self.add_class("nbdebug-job")
        self.coalescer = Coalescer(lambda _parts: self.refresh(), rate=4.0, loop=loop)
        ref = weakref.ref(self)

        def mark(_payload: Any) -> None:
            me = ref()
            if me is not None:
                me.coalescer.mark("processes")
        self._off = [listener.hub.on("state", mark)]
        self._watched: set[int] = set()
        self.refresh()

    def _group(self, action: Any) -> None:
        try:
            result = action()
        except Exception as e:  # noqa: BLE001 - shown, not raised into the frontend
            self.message.value = f"<span style='color:#cf222e'>{html.escape(str(e))}</span>"
            return
        self.message.value = f"pausing all at the end of step {result}" if isinstance(result, int) else ""

    def refresh(self) -> None:
        sources = self.listener.sources
        for src in sources.values():
            if id(src) not in self._watched:  # a process's own events redraw the table too
                self._watched.add(id(src))
                ref = weakref.ref(self)
                for ev in ("state", "step"):
                    self._off.append(src.on(ev, lambda _p, ref=ref: ref() and ref().coalescer.mark("processes")))
        rows = process_rows(sources)
        if not rows:
            self.table.value = f"<i>waiting for training processes on {html.escape(self.listener.address)}</i>"
        else:
            head = "".join(f"<th>{h}</th>" for h in ("process", "host", "PID", "rank", "device", "step", "state"))
            body = "".join(
                "<tr>" + "".join(f"<td>{html.escape(str('–' if r[k] is None else r[k]))}</td>"
                                 for k in ("key", "host", "pid", "rank", "device", "step", "state")) + "</tr>"
                for r in rows)
            self.table.value = f"<table class='nbdebug-process-table'><tr>{head}</tr>{body}</table>"
        options = [(f"{k}", k) for k in sources]
        if [o[1] for o in self.select.options] != [o[1] for o in options]:
            current = self.select.value
            self.select.options = options
            if current in sources:
                self.select.value = current
            elif options:
                self.select.value = options[0][1]
        if self.panel is None and self.select.value is not None:
            self._show(self.select.value)

    def _chosen(self, change: dict[str, Any]) -> None:
        if change.get("new") is not None:
            self._show(change["new"])

    def _show(self, key: Any) -> None:
        src = self.listener.sources.get(key)
        if src is None or (self.panel is not None and self.panel.source.obj is src):
            return
        if self.panel is not None:
            self.panel.close()
        self.panel = Panel(src, loop=self._loop)
        self._holder.children = [self.panel]

    def close(self) -> None:
        for off in self._off:
            off()
        if self.panel is not None:
            self.panel.close()
        super().close()
