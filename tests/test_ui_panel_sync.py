"""A panel converges to the kernel's state (issue 22, item 7), kernel side: a change made while the views
redraw is seen by the next poll; ↻ sends the browser every widget's whole state again; the graph's data is
sent once, in the answer to the view's hello (item 13); the bundle goes to a page that asks (item 17).
The browser side is tests/test_ui_browser_sync.py."""

from __future__ import annotations

import ipywidgets as w
import torch
from conftest import Net, train_steps

import nbdebug
from nbdebug.ui.frontend import FrontendWidget
from nbdebug.ui.panel import Panel, _descendants


def _debugger():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="L0")
    train_steps(model, 1)
    dbg.net = model
    return dbg


def test_a_change_during_a_redraw_is_redrawn_at_the_next_poll():
    dbg = _debugger()
    panel = Panel(dbg, recommend=False, loop=None)
    try:
        header_refresh = panel.header.refresh

        def refresh_then_training_moves_on() -> None:
            header_refresh()  # the header has read the source...
            dbg.watch("TO")  # ...and the kernel's state changes before the redraw ends

        panel.header.refresh = refresh_then_training_moves_on
        panel.refresh()
        panel.header.refresh = header_refresh
        panel.poll()
        assert "header" in panel.coalescer.pending, "the poll took the change as already shown"
        panel.flush()
        assert len(panel.watch.rows()) == 1
    finally:
        panel.close()
        dbg.close()


def test_refresh_sends_every_widget_whole_state(monkeypatch):
    dbg = _debugger()
    panel = Panel(dbg, recommend=False, loop=None)
    try:
        sent: list[int] = []
        monkeypatch.setattr(w.Widget, "send_state", lambda self, key=None: sent.append(id(self)))
        posted: list[str] = []
        original_send = FrontendWidget.send
        monkeypatch.setattr(FrontendWidget, "send",
                            lambda self, content, buffers=None: posted.append(content["type"]))
        panel.refresh()  # nothing changed since the panel was built: only the ↻ resend goes out
        widgets = [c for c in [panel, *_descendants(panel)] if not isinstance(c, FrontendWidget)]
        assert widgets and {id(c) for c in widgets} <= set(sent)
        assert {"graph", "marks"} <= set(posted)
        monkeypatch.setattr(FrontendWidget, "send", original_send)
    finally:
        panel.close()
        dbg.close()


def test_graph_data_waits_for_the_views_hello(monkeypatch):
    posted: list[str] = []
    monkeypatch.setattr(FrontendWidget, "send", lambda self, content, buffers=None: posted.append(content["type"]))
    dbg = _debugger()
    panel = Panel(dbg, recommend=False, loop=None)
    try:
        gw = panel.graph_view.widget
        assert posted == [] and not gw.greeted  # built, refreshed: nothing sent before a view exists
        gw.receive({"type": "hello", "rev": -1})
        assert posted.count("graph") == 1 and gw.greeted
        train_steps(dbg.net, 1)
        panel.refresh()
        assert posted.count("graph") == 2  # a view is there now: ↻ sends the graph again, once
    finally:
        panel.close()
        dbg.close()


def test_bundle_sent_to_a_page_that_asks(monkeypatch):
    sent: list[tuple[dict, list]] = []
    monkeypatch.setattr(FrontendWidget, "send", lambda self, content, buffers=None: sent.append((content, buffers)))
    fw = FrontendWidget(view="graph")
    fw.receive({"type": "nbdebug-bundle"})
    ((content, buffers),) = sent
    assert content["type"] == "nbdebug-bundle" and b"renderStatic" in buffers[0]
    assert content["bytes"] == len(buffers[0])
