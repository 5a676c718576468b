"""Notebook panels (ipywidgets, and anywidget for our front end): the only part of nbdebug that imports them.

``Panel(source)`` is the debugger panel over a live :class:`nbdebug.Debugger` or an offline session
(the *source* protocol is documented in :mod:`nbdebug.ui.source`); ``dbg.panel()``, displaying ``dbg``
and the ``%nbdebug`` magic (:mod:`nbdebug.ui.magics`) all build one.

Modules, one concern each: ``source`` (what a panel reads), ``throttle`` (coalesced redraws),
``layout`` (node classes, labels, scope keys), ``graph_data`` (the graph view's protocol messages, pure),
``frontend`` (the widget of our own front end), ``export`` (self-contained HTML), ``snapshot`` (the
panel's last state as static HTML), ``heatmap_data``, ``header``, ``graph_view``, ``node_list``, ``details``,
``watch_panel``, ``hits``, ``controls``, ``tensor_math`` (pure numpy), ``tensor_view``, ``panel``,
``magics``; ``compare_panel`` is the run-comparison
panel of ``nbdebug.compare`` (its own classes); ``job_panel`` (``JobPanel``, ``job.panel()``) puts a rank
selector, the first non-finite rank, a per-rank overview, job control and a rank compare over the ``Panel``
of one rank of a :class:`nbdebug.job.Job` (its CSS classes, ``nbdebug-job-*`` and ``nbdebug-rank-select``,
are listed in its module).

The panel's stable CSS classes, for driving it from a browser, are listed in ``CSS_CLASSES.md`` beside
this module.
"""

from __future__ import annotations

from typing import Any

from ..features import register

__all__ = ["Panel"]

register("panel", f"{__name__}.panel", "Panel")  # dbg.panel(), a Debugger shown in a cell
register("compare_panel", f"{__name__}.compare_panel", "ComparePanel")  # CompareResult shown in a notebook
register("export_html", f"{__name__}.export", "export_html")  # dbg.export_html(path)


def __getattr__(name: str) -> Any:
    if name == "Panel":
        from .panel import Panel

        return Panel
    raise AttributeError(f"module 'nbdebug.ui' has no attribute {name!r}")
