"""Plotly ``FigureWidget``s as wide as their place in the panel.

plotly's widget frontend draws a figure before its element joins the page, so plotly.js cannot measure the
container and falls back to its 700 px default width: wider than a panel column (the right edge is cut off)
or narrower than the panel (plotly.py issue #5208). A relayout of ``autosize`` makes plotly.js measure the
container again; :func:`fit_width` sends one each time a browser view has drawn the figure. A view reports
its traces to the kernel once drawn and after each restyle; a report of an edit that was reported before
(or the very first report) comes from a newly drawn view. A figure drawn while hidden (``display: none``)
cannot be measured at all: show its container first.

>>> import plotly.graph_objects as go
>>> fig = go.FigureWidget(layout={"height": 300})
>>> fit_width(fig)
>>> fig.layout.autosize is None      # no browser view yet: nothing sent
True
"""

from __future__ import annotations

from typing import Any


def fit_width(fig: Any) -> None:
    """Make each browser view of ``fig`` (a FigureWidget without a layout width) fit its container."""
    seen: dict[str, int | None] = {"last": None}  # the latest edit reported

    def on_report(change: dict[str, Any]) -> None:
        msg = change.get("new")
        if not isinstance(msg, dict) or fig.layout.width is not None:
            return
        edit = msg.get("trace_edit_id")
        if not isinstance(edit, int):
            return
        last = seen["last"]
        seen["last"] = edit if last is None else max(last, edit)
        if last is not None and edit > last:
            return  # a restyle, reported by the view that drew it
        # plotly.js re-measures on a relayout that turns autosize on; two edits, so the second always is one
        fig.layout.autosize = False
        fig.layout.autosize = True

    fig.observe(on_report, names="_js2py_traceDeltas")
