"""The panel header: framework and version, device, process id (or, offline, the dump), the step, state,
hit count, and what ended or broke the session.

Each value is its own small widget with a stable CSS class (``nbdebug-framework``, ``nbdebug-device``,
``nbdebug-pid``, ``nbdebug-dump``, ``nbdebug-step``, ``nbdebug-step-running``, ``nbdebug-state``,
``nbdebug-hit-count``, ``nbdebug-pause-reason``, ``nbdebug-failure``, and — once a loss scale is tracked
(``dbg.track_loss_scale(scaler)``) — ``nbdebug-loss-scale``; for a remote process (a source with
``remote_info``: ``nbdebug.listen``) ``nbdebug-remote`` names its host, rank and connection), so a browser
test reads one value per element; :meth:`Header.refresh` only assigns values that changed, so an idle
header sends nothing.

**One step convention.** ``Step`` (``nbdebug-step``) is the step *whose data the panel shows*: the step
the graph's statistics, the node details, the hit list ("step 3") and the pause reason ("… hits in
step 3") refer to. Live, that is the step in progress once it has recorded something, else the last
finished step (:func:`~nbdebug.ui.source.last_step`); offline, the step chosen in the step selector.
When the step training runs (or will run next) is another one — paused at a step boundary after the
watchpoints fired on the step that just ended — ``nbdebug-step-running`` says so: ``Step 3 · step 4
next``. Before any data it reads ``–``.

States beyond the training's: ``closed`` (the debugger was closed: nothing left to control),
``failed`` (the training function raised, on the worker thread or in the foreground with
``block=True``: ``nbdebug-failure`` names the exception and the node that ran last).
"""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
from ipywidgets.widgets.widget_string import HTMLStyle

from ..watch.watchpoints import count_hits
from .source import SourceView


def failure_text(error: str, node: str | None, step: int | None) -> str:
    """One line about a failure: the exception's last line and where it happened.

    >>> failure_text("Traceback ...\\nRuntimeError: boom\\n", "Torch.log.0.forward", 3)
    'failed in step 3 at Torch.log.0.forward: RuntimeError: boom'

    The kernel's Interrupt (Ctrl-C) is the user's doing, no failure of the model:

    >>> failure_text("Traceback ...\\nKeyboardInterrupt: \\n", "Module.0.Linear.backward.0", 162)
    'interrupted in step 162 at Module.0.Linear.backward.0 (KeyboardInterrupt)'
    """
    lines = [ln for ln in error.strip().splitlines() if ln.strip()]
    last = lines[-1].strip() if lines else "unknown error"
    where = f" in step {step}" if step is not None else ""
    where += f" at {node}" if node else ""
    if last.split(":")[0] == "KeyboardInterrupt":
        return f"interrupted{where} (KeyboardInterrupt)"
    return f"failed{where}: {last}"


def remote_text(info: dict[str, Any]) -> str:
    """What a remote process's header says beside its PID: host, rank, and whether it is connected.

    >>> remote_text({"host": "node7", "rank": 1, "world_size": 4, "connected": False})
    'node7 · rank 1/4 · disconnected'
    """
    parts = [str(info.get("host") or "?")]
    if info.get("rank") is not None:
        size = info.get("world_size")
        parts.append(f"rank {info['rank']}" + (f"/{size}" if size is not None else ""))
    if not info.get("connected", True):
        parts.append("disconnected")
    return " · ".join(parts)


def dump_text(source: Any) -> str:
    """What an offline header says about its dump: path, framework (layout) and the steps."""
    obj = source.obj
    path = getattr(obj, "path", "") or ""
    layout = getattr(obj, "layout", "") or ""
    steps = sorted(getattr(source.session, "steps", {}) or {})
    if not steps:
        span = "no steps"
    elif steps == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        span = f"steps {steps[0]}–{steps[-1]}"
    else:
        span = "steps " + ", ".join(map(str, steps))
    parts = [html.escape(str(path)) if path else "(in memory)"]
    if layout:
        parts.append(html.escape(str(layout)))
    parts.append(span)
    return " · ".join(parts)

_STATE_COLOURS = {
    "running": "#1a7f37", "paused": "#bf8700", "idle": "#57606a", "finished": "#0969da",
    "terminated": "#57606a", "failed": "#cf222e", "offline": "#8250df", "closed": "#57606a",
    "disconnected": "#cf222e",
}


class _Shared:
    """One Layout and one style model per kind of element, shared by the header's fields (a model each would be
    most of the header's models over the websocket and in a saved notebook)."""

    def __init__(self) -> None:
        self.plain, self.value, self.box = w.Layout(), w.Layout(margin="0 12px 0 2px"), w.Layout()
        self.style = HTMLStyle()

    def html(self, value: str = "", layout: w.Layout | None = None, classes: tuple[str, ...] = ()) -> w.HTML:
        """Classes given at creation travel in the ``comm_open`` (``add_class`` would be one more message)."""
        return w.HTML(value, layout=layout if layout is not None else self.plain, style=self.style,
                      _dom_classes=classes)


def _field(label: str, css: str, kit: _Shared, toggled: bool = False, hidden: bool = False) -> tuple[w.HTML, w.HBox]:
    """A label and its value; ``toggled``: the box gets a Layout of its own (its display is switched), ``hidden``
    at first."""
    value = kit.html(layout=kit.value, classes=(css,))
    layout = (w.Layout(display="none") if hidden else w.Layout()) if toggled else kit.box
    box = w.HBox([kit.html(f"<b>{html.escape(label)}</b>"), value], layout=layout)
    return value, box


class Header:
    """One line of session facts; ``widget`` is what the panel shows."""

    def __init__(self, source: SourceView) -> None:
        self.source = source
        kit = _Shared()
        self.framework, f1 = _field("Framework", "nbdebug-framework", kit)
        self.device, f2 = _field("Device", "nbdebug-device", kit)
        live = source.live
        # an offline panel shows the dump, not this kernel's PID
        self.pid, f3 = _field("PID", "nbdebug-pid", kit, toggled=True, hidden=not live)
        self.remote, self._remote_box = _field("Host", "nbdebug-remote", kit, toggled=True,
                                               hidden=getattr(source.obj, "remote_info", None) is None)
        self.dump, self._dump_box = _field("Dump", "nbdebug-dump", kit, toggled=True, hidden=live)
        self.step, f4 = _field("Step", "nbdebug-step", kit)
        self.step_running = kit.html(layout=w.Layout(margin="0 12px 0 0"), classes=("nbdebug-step-running",))
        f4.children = (*f4.children, self.step_running)
        self.state, f5 = _field("State", "nbdebug-state", kit)
        self.hit_count, f6 = _field("Hits", "nbdebug-hit-count", kit)
        self.loss_scale, self._ls_box = _field("Loss scale", "nbdebug-loss-scale", kit, toggled=True, hidden=True)
        self.reason = kit.html(classes=("nbdebug-pause-reason",))
        self.failure = kit.html(classes=("nbdebug-failure",))
        self.widget = w.HBox([f1, f2, self._remote_box, f3, self._dump_box, f4, f5, f6, self._ls_box, self.reason,
                              self.failure],
                             layout=w.Layout(flex_flow="row wrap", align_items="center"),
                             _dom_classes=("nbdebug-header",))
        self.refresh()

    def refresh(self) -> None:
        src = self.source
        s = src.session
        fw = f"{getattr(s, 'framework', '?')} {getattr(s, 'framework_version', '')}".strip()
        _set(self.framework, html.escape(fw))
        _set(self.device, html.escape(str(getattr(s, "device", "?"))))
        if src.live:
            _set(self.pid, str(getattr(s, "pid", "?")))
            info = getattr(src.obj, "remote_info", None)
            if info is not None:
                _set(self.remote, html.escape(remote_text(info)))
        else:
            _set(self.dump, dump_text(src))
        shown = src.step
        _set(self.step, str(shown) if shown >= 0 else "–")
        state = src.state
        running = src.running_step
        note = ""
        if src.live and state in ("running", "paused") and running != shown:
            note = f"· step {running} {'next' if state == 'paused' else 'running'}"
        _set(self.step_running, f"<small>{note}</small>" if note else "")
        colour = _STATE_COLOURS.get(state, "#57606a")
        _set(self.state, f"<span style='color:{colour};font-weight:bold' data-state='{state}'>{state}</span>")
        _set(self.hit_count, str(count_hits(src.hits)))
        self._refresh_loss_scale()
        reason = src.pause_reason if state == "paused" else ""
        node = src.current_node if state == "paused" else None
        text = reason + (f" at {node}" if node and node not in reason else "")
        if state == "closed":
            text = "the debugger is closed (dbg.close()): nothing to control; create a new Debugger to go on"
        _set(self.reason, f"<i>{html.escape(text)}</i>" if text else "")
        fail = ""
        if src.error:
            fail = failure_text(src.error, src.failed_node, src.failed_step)
        _set(self.failure, f"<span style='color:#cf222e'>{html.escape(fail)}</span>" if fail else "")

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
