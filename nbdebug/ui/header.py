"""The panel header: framework and version, device, process id, current step, state, hit count.

Each value is its own small widget with a stable CSS class (``nbdebug-framework``, ``nbdebug-device``,
``nbdebug-pid``, ``nbdebug-step``, ``nbdebug-state``, ``nbdebug-hit-count``, and — once a loss scale is
tracked (``dbg.track_loss_scale(scaler)``) — ``nbdebug-loss-scale``), so a browser test reads
one value per element; :meth:`Header.refresh` only assigns values that changed, so an idle header sends
nothing to the frontend.
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w

from .source import SourceView

_STATE_COLOURS = {
    "running": "#1a7f37", "paused": "#bf8700", "idle": "#57606a", "finished": "#0969da",
    "terminated": "#57606a", "failed": "#cf222e", "offline": "#8250df",
}


def _field(label: str, css: str) -> tuple[w.HTML, w.HBox]:
    value = w.HTML("", layout=w.Layout(margin="0 12px 0 2px"))
    value.add_class(css)
    box = w.HBox([w.HTML(f"<b>{html.escape(label)}</b>"), value])
    return value, box


class Header:
    """One line of session facts; ``widget`` is what the panel shows."""

    def __init__(self, source: SourceView) -> None:
        self.source = source
        self.framework, f1 = _field("Framework", "nbdebug-framework")
        self.device, f2 = _field("Device", "nbdebug-device")
        self.pid, f3 = _field("PID", "nbdebug-pid")
        self.step, f4 = _field("Step", "nbdebug-step")
        self.state, f5 = _field("State", "nbdebug-state")
        self.hit_count, f6 = _field("Hits", "nbdebug-hit-count")
        self.loss_scale, self._ls_box = _field("Loss scale", "nbdebug-loss-scale")
        self._ls_box.layout.display = "none"
        self.reason = w.HTML("")
        self.reason.add_class("nbdebug-pause-reason")
        self.widget = w.HBox([f1, f2, f3, f4, f5, f6, self._ls_box, self.reason],
                             layout=w.Layout(flex_flow="row wrap", align_items="center"))
        self.widget.add_class("nbdebug-header")
        self.refresh()

    def refresh(self) -> None:
        s = self.source.session
        fw = f"{getattr(s, 'framework', '?')} {getattr(s, 'framework_version', '')}".strip()
        _set(self.framework, html.escape(fw))
        _set(self.device, html.escape(str(getattr(s, "device", "?"))))
        _set(self.pid, str(getattr(s, "pid", "?")))
        _set(self.step, str(self.source.step))
        state = self.source.state
        colour = _STATE_COLOURS.get(state, "#57606a")
        _set(self.state, f"<span style='color:{colour};font-weight:bold' data-state='{state}'>{state}</span>")
        _set(self.hit_count, str(sum(1 for h in self.source.hits if h.hits)))
        self._refresh_loss_scale()
        reason = self.source.pause_reason if state == "paused" else ""
        node = self.source.current_node if state == "paused" else None
        text = reason + (f" at {node}" if node and node not in reason else "")
        _set(self.reason, f"<i>{html.escape(text)}</i>" if text else "")


    def _refresh_loss_scale(self) -> None:
        """Latest scale, and the current run of overflowing steps (red) — seed 003's persistent overflow."""
        tracker = getattr(self.source.obj, "loss_scale", None)
        history = tracker.history() if tracker is not None and hasattr(tracker, "history") else []
        if not history:
            return
        last = history[-1]
        run = getattr(tracker, "overflow_run", 0)
        text = f"{last.scale:g}"
        if run:
            text += f" <span style='color:#cf222e'>· overflow {run} step{'s' if run != 1 else ''} in a row</span>"
        _set(self.loss_scale, text)
        if self._ls_box.layout.display == "none":
            self._ls_box.layout.display = None


def _set(widget: Any, value: str) -> None:
    if widget.value != value:
        widget.value = value
