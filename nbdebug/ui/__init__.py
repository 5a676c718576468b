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

Stable CSS classes, for driving the panel from a browser (``widget.add_class``)::

    nbdebug-panel            the whole panel (plus nbdebug-live or nbdebug-offline; nbdebug-stale, with a
                             nbdebug-stale-banner first child, once the lab extension saw its kernel
                             restart or shut down)
    nbdebug-step-select      offline only: the step selector (Dropdown of the dump's steps)
    nbdebug-refresh          ↻ button: redraw everything
    nbdebug-panel-error      an error inside a view (a <details> with the traceback)
  header
    nbdebug-header           the header line
    nbdebug-framework nbdebug-device nbdebug-pid nbdebug-step nbdebug-hit-count
                             one value each (offline: nbdebug-dump, the dump's path/layout/steps, instead
                             of nbdebug-pid)
    nbdebug-step             the step whose data is shown (hits and pause reason name the same step);
                             nbdebug-step-running "· step N next/running" when training is at another
    nbdebug-state            the state word: idle running paused finished terminated failed closed offline
    nbdebug-pause-reason     why training is paused (and at which node), or that the debugger is closed
    nbdebug-failure          the exception that ended training, with its step and the node that ran last
  recommended watchpoints (first panel on a live session)
    nbdebug-recommend        the offer bar; nbdebug-recommend-yes, nbdebug-recommend-no its buttons
  graph
    nbdebug-graph            the graph widget (our front end, view "graph"; its DOM classes are
                             frontend/src/graph.ts's, see frontend/PROTOCOL.md)
  node list
    nbdebug-nodes            the node list box
    nbdebug-node-section     section / graph-file filter (Dropdown)
    nbdebug-node-type        node type filter (Dropdown)
    nbdebug-node-search      search text; nbdebug-node-regex the "regex" checkbox
    nbdebug-node-message     "N nodes" / "N matches" / invalid regex
    nbdebug-node-list        the rows (a Select: "▸ scope (n)" rows toggle, "• name" rows select)
  node details
    nbdebug-details          the box; nbdebug-details-title, nbdebug-details-table (slots, stats, values),
    nbdebug-details-view     "View <slot>" buttons (open the tensor view)
    nbdebug-details-link     producer/consumer buttons (in nbdebug-details-producers and
                             nbdebug-details-consumers)
    nbdebug-details-stack    the Python stack
  watchpoints
    nbdebug-watchpoints      the box
    nbdebug-wp-add           "+": opens nbdebug-wp-form
    nbdebug-wp-recheck       recheck the current step; nbdebug-wp-clear deletes all
    nbdebug-wp-message       result of the last action
    nbdebug-wp-list          the rows; each nbdebug-wp-row (and nbdebug-wp-<id>) holds
                             nbdebug-wp-enabled (checkbox), nbdebug-wp-label, nbdebug-wp-node (checkbox:
                             the selected node in/out), nbdebug-wp-delete (✕)
    nbdebug-wp-condition     the condition Dropdown (grouped: Tensor/Weight/Gradient/Activation check)
    nbdebug-wp-summary       what the condition checks
    nbdebug-wp-params        the parameter fields (each nbdebug-wp-field: MindInsight's label, the input, its
                             error below): nbdebug-wp-param-<name> (Text; Checkbox for equal_nan), each
                             also nbdebug-wp-param
    nbdebug-wp-only-selected checkbox: watch only the selected node
    nbdebug-wp-create        OK; nbdebug-wp-cancel closes the form
    nbdebug-wp-error         a validation message: under its field at full width (also
                             nbdebug-wp-error-<name>) or under the form (also nbdebug-wp-form-error);
                             empty when there is none; every field is checked at once
  hits
    nbdebug-hits             the box; nbdebug-hit-title "Hits (N)" (hits only); nbdebug-hit-list the groups
    nbdebug-hit-group        the hits of one node in one step: nbdebug-hit-group-title, then its rows
    nbdebug-hit-row          one hit (also nbdebug-hit-hit): nbdebug-hit-select (selects the node),
                             nbdebug-hit-view (tensor view), nbdebug-hit-detail (threshold vs actual)
    nbdebug-hit-notices      tensors that could not be checked, apart (hidden when none):
                             nbdebug-hit-notice-title "Could not check (M)", rows nbdebug-hit-notice
                             (also nbdebug-hit-unchecked); never counted as hits
  training control (live sessions only)
    nbdebug-controls         the box
    nbdebug-step-count       number of steps; nbdebug-step-ok runs them
    nbdebug-continue nbdebug-pause nbdebug-terminate nbdebug-run-to nbdebug-next-node
    nbdebug-control-status   how to start (idle), pause reason, or the failure with its traceback
  tensor view
    nbdebug-tensor-view      the box (display:none until opened); nbdebug-tensor-close hides it
    nbdebug-tensor-title     node, slot, step, dtype, shape
    nbdebug-tensor-mode      ToggleButtons: Current step / Previous step / Comparison
    nbdebug-tolerance        comparison tolerance slider (Comparison only)
    nbdebug-slices           the per-axis boxes nbdebug-slice-<axis> (axis 0, 1, ...; also nbdebug-slice)
    nbdebug-slice-error      why a selection is refused (e.g. more than 2 free dimensions)
    nbdebug-tensor-error     values not retained for a step, and why
    nbdebug-tensor-heatmap   the heatmap of the selection (front-end view "heatmap": canvas nbdebug-heat-canvas,
                             ticks nbdebug-heat-xtick / -ytick, legend nbdebug-heat-legend, nbdebug-heat-readout)
    nbdebug-tensor-table     the values of the selection
    nbdebug-tensor-stats     statistics: current / previous / difference
    nbdebug-tensor-hits      hits on this tensor and the optimization guide (nbdebug-advice)
    nbdebug-tensor-hops      k for the relationship diagram; nbdebug-tensor-graph the diagram (front-end view
                             "relations": nodes nbdebug-rel-node with data-name, marks nbdebug-rel-mark)
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
