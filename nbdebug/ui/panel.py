"""The notebook panel: header, graph, node list, node details, watchpoints, hits, training control and the
tensor view, wired together over one *source* (a live Debugger or an offline session, see
:mod:`nbdebug.ui.source`).

The views never talk to each other: they report what the user did (a node chosen, a tensor to view, a
watchpoint changed) to the panel, and the panel updates the others. Events from the training thread
(``state``, ``step``, ``hit``, ``node``, ``error``) only mark parts of the panel dirty; a
:class:`~nbdebug.ui.throttle.Coalescer` redraws them on the kernel's event loop at most ``rate`` times a
second. Outside a kernel (tests, scripts) call :meth:`Panel.flush` to redraw.

Lifecycle: the header's state reads ``closed`` once the debugger is closed (every control disabled),
``failed`` with the exception and the node that ran last when training raised on the worker thread (or
with ``block=True``). When a cell that trains in the foreground (a plain loop under the attached
debugger) raises inside a step, an IPython ``post_run_cell`` hook (:func:`after_cell`) puts the exception
and the node that ran last in the header too. Either way that node is selected. A panel whose kernel
restarted is marked stale in the browser by the lab extension (``nbdebug-stale``, a banner).

An offline panel has a step selector (``nbdebug-step-select``, the dump's steps): choosing a step makes
it "current" for every view (graph, node list, details, hits, tensor view); its header shows the dump
(path, layout, steps) instead of the kernel's PID.

>>> from nbdebug.session.session import Session
>>> p = Panel(Session(framework="pytorch", live=False))     # an (empty) offline session
>>> p.controls is None, p.header.state.value.endswith("offline</span>")
(True, True)
"""

from __future__ import annotations

import html
import time
import traceback
import weakref
from typing import Any

import ipywidgets as w

from .controls import Controls
from .details import NodeDetails
from .graph_view import GraphView
from .header import Header
from .hits import HitList
from .node_list import NodeList
from .snapshot import HIDE_RULE, UNSCROLL_RULE, snapshot_html
from .source import EVENTS, SourceView
from .tensor_view import TensorView
from .throttle import _AUTO, Coalescer
from .timeline_view import TimelineView, scrub_step
from .watch_panel import WatchPanel

#: which parts of the panel each event makes stale
PARTS: dict[str, tuple[str, ...]] = {
    "state": ("header", "controls", "graph", "details"),
    "step": ("header", "controls", "graph", "nodes", "details", "hits", "watch"),
    "hit": ("header", "hits", "graph"),
    "node": ("header", "graph", "nodes"),
    "error": ("header", "controls"),
}
ALL_PARTS = ("header", "controls", "graph", "nodes", "details", "hits", "watch", "tensor")
POLL_SECONDS = 1.0
#: the static snapshot beside a displayed panel is rewritten at most this often
SNAPSHOT_SECONDS = 2.0

_ASKED: weakref.WeakSet[Any] = weakref.WeakSet()  # sources that were offered the recommended watchpoints
_ASKED_IDS: set[int] = set()


def _first_offer(obj: Any) -> bool:
    try:
        if obj in _ASKED:
            return False
        _ASKED.add(obj)
        return True
    except TypeError:  # not weak-referenceable
        if id(obj) in _ASKED_IDS:
            return False
        _ASKED_IDS.add(id(obj))
        return True


class Panel(w.VBox):
    """The debugger panel over ``source`` (a Debugger, an offline session, or a bare Session).

    ``rate``: most redraws per second while training runs. ``recommend``: offer the recommended
    watchpoints (default: the first time a panel opens on a live session).
    """

    def __init__(self, source: Any, *, rate: float = 10.0, recommend: bool | None = None,
                 loop: Any = _AUTO) -> None:
        self.source = SourceView(source)
        src = self.source
        self.selected: str | None = None
        self._pause_seen: Any = None  # the pause last followed (_follow_pause)
        self.errors: list[str] = []
        self.header = Header(src)
        self.graph_view = GraphView(src, on_select=lambda name: self.select(name, reveal=False))
        self.node_list = NodeList(src, on_select=self.select)
        self.details = NodeDetails(src, on_select=self.select, on_view=self.view)
        self.watch = WatchPanel(src, selected=lambda: self.selected, on_change=self._watch_changed)
        self.hit_list = HitList(src, on_select=self.select, on_view=self.view_hit)
        self.controls = Controls(src, selected=lambda: self.selected, on_action=self._acted) if src.live else None
        self.tensor_view = TensorView(src, on_select=self.select)
        self.timeline = TimelineView(src, on_scrub=self.scrub, loop=loop)  # the run timeline (closed)
        self.error = w.HTML("", _dom_classes=("nbdebug-panel-error",))
        # While this widget is drawn, the static snapshot displayed after it is hidden (see ui.snapshot)
        self._hide_snapshot = w.HTML(f"<style>{HIDE_RULE} {UNSCROLL_RULE}</style>", layout=w.Layout(display="none"))
        self._snapshots: list[Any] = []  # display handles of the static snapshots of this panel
        self._snapshot_at = 0.0
        self._snapshot_due = False
        self.refresh_button = w.Button(description="↻", tooltip="refresh the panel", layout=w.Layout(width="36px"),
                                       _dom_classes=("nbdebug-refresh",))
        self.refresh_button.on_click(lambda _b: self.refresh())
        self.recommend_bar = self._recommend_bar(src.live if recommend is None else recommend)
        self.step_select = self._step_selector() if not src.live else None

        left = w.VBox([self.node_list.widget, self.watch.widget, self.hit_list.widget]
                      + ([self.controls.widget] if self.controls else []),
                      layout=w.Layout(width="36%", min_width="300px"))
        right = w.VBox([self.graph_view.widget, self.details.widget], layout=w.Layout(width="64%"))
        super().__init__([
            w.HBox([self.header.widget]
                   + ([self.step_select] if self.step_select is not None else []) + [self.refresh_button],
                   layout=w.Layout(justify_content="space-between", align_items="center")),
            self.recommend_bar, w.HBox([left, right]), self.timeline.widget, self.tensor_view.widget, self.error,
            self._hide_snapshot,
        ], _dom_classes=("nbdebug-panel", "nbdebug-live" if src.live else "nbdebug-offline"))

        self.coalescer = Coalescer(self._redraw, rate=rate, loop=loop)
        ref = weakref.ref(self)
        self._subs = []
        for ev in EVENTS:
            def mark(_payload: Any, ev: str = ev) -> None:
                panel = ref()
                if panel is not None:
                    panel.coalescer.mark(*PARTS[ev])
            self._subs.append(src.on(ev, mark))
        self._sig = self._signature()
        self._chosen = self._sig[-1]  # the session's chosen step the views last drew
        self._closed = False
        if src.live:
            _LIVE.add(self)
            _install_cell_hook()
        if self.coalescer.automatic:
            self.coalescer.loop.call_later(POLL_SECONDS, _poll, ref)

    # -- redraw -----------------------------------------------------------------------------------
    def _redraw(self, parts: set[str]) -> None:
        views = {"header": self.header, "controls": self.controls, "graph": self.graph_view,
                 "nodes": self.node_list, "details": self.details, "hits": self.hit_list, "watch": self.watch}
        # What the views are about to show, taken *before* they read the source: a change while they redraw
        # (training runs on) then differs from it, and the next poll redraws (taken after, it would be
        # taken as shown and the panel could keep "running" or an old hit count for good)
        sig = self._signature()
        for part in ALL_PARTS:
            if part not in parts:
                continue
            view = views.get(part)
            try:
                if view is not None:
                    view.refresh()
            except Exception:  # noqa: BLE001 - one broken view must not take the others down
                msg = traceback.format_exc()
                self.errors.append(msg)
                self.error.value = (f"<details><summary style='color:#cf222e'>panel error in {part}</summary>"
                                    f"<pre>{html.escape(msg)}</pre></details>")
        if sig[-1] != self._chosen:  # the step shown changed (another panel's timeline)
            self._chosen = sig[-1]
            self.timeline.refresh()  # its "showing step" marker too
        self._sig = sig
        if "header" in parts or "watch" in parts:
            self._settle_offer()
        if "header" in parts:
            self._show_failure()
            self._follow_pause()
        if parts & {"header", "hits", "watch"}:
            self._snapshot_due = True
            self.update_snapshot()

    def _follow_pause(self) -> None:
        """When training has just paused, select and reveal where: the node it paused at, else the first
        hit of the step it paused on (so the graph shows the badge, the details the tensor). Once per
        pause: the user's own selection afterwards is left alone."""
        src = self.source
        if not src.live or src.state != "paused":
            self._pause_seen = None
            return
        hits = [h for h in src.hits if h.hits]
        key = (src.session.step_index, src.current_node, len(hits))
        if key == getattr(self, "_pause_seen", None):
            return
        self._pause_seen = key
        target = src.current_node
        if target is None and hits:
            last = max(h.step for h in hits)
            target = min((h for h in hits if h.step == last), key=lambda h: h.order).node
        if target is not None and target in src.graph.nodes:
            self.select(target)

    # -- the static snapshot (a saved notebook without a kernel) ---------------------------------------
    def _ipython_display_(self, **kwargs: Any) -> None:
        """Display the widget and, after it, its static snapshot (kept current; hidden while the widget is
        drawn), so a saved notebook shows the panel's last state without a kernel."""
        from IPython.display import HTML, display

        display(self._repr_mimebundle_(**kwargs), raw=True)
        self._snapshots.append(display(HTML(snapshot_html(self.source, self.graph_view)), display_id=True))
        self._snapshot_at = time.monotonic()
        self._snapshot_due = False

    def update_snapshot(self, force: bool = False) -> None:
        """Rewrite the displayed snapshots (at most every :data:`SNAPSHOT_SECONDS`, unless ``force``)."""
        if not self._snapshots or not (self._snapshot_due or force):
            return
        if not force and time.monotonic() - self._snapshot_at < SNAPSHOT_SECONDS:
            return  # the poll loop comes back for it
        from IPython.display import HTML

        text = snapshot_html(self.source, self.graph_view)
        for handle in self._snapshots:
            handle.update(HTML(text))
        self._snapshot_at = time.monotonic()
        self._snapshot_due = False

    def _show_failure(self) -> None:
        """After a failure, select the node that ran last (graph, node list and details show it), once."""
        src = self.source
        node = src.failed_node if src.error else None
        if node is None or getattr(self, "_failure_shown", None) == src.error:
            return
        self._failure_shown = src.error
        if node in src.graph.nodes:
            try:
                self.select(node)
            except Exception:  # noqa: BLE001 - a view that cannot show it must not break the redraw
                self.errors.append(traceback.format_exc())

    def flush(self) -> None:
        """Redraw whatever changed since the last redraw, now."""
        self.coalescer.flush()

    def refresh(self) -> None:
        """Redraw every part, then send the browser the whole state of every widget of the panel (not only
        what changed): the ↻ button, for a browser that missed updates."""
        self.coalescer.mark(*ALL_PARTS)
        self.coalescer.flush()
        self.hit_list.refresh(force=True)
        for child in [self, *_descendants(self)]:
            if getattr(child, "comm", None) is None:
                continue
            if hasattr(child, "recorded") and hasattr(child, "greeted"):  # a FrontendWidget: its data again
                child.receive({"type": "hello"})
            else:
                child.send_state()

    def _signature(self) -> tuple:
        src = self.source
        wm = src.watchpoints
        closed = bool(getattr(src.obj, "closed", False))  # a closed debugger: the graph says so
        return (src.state, closed, src.session.step_index, len(src.graph), len(wm.hits),
                tuple((p.id, p.version, p.enabled) for p in wm.watchpoints.values()),
                getattr(src.session, "chosen_step", None))  # another panel of the session scrubbed

    def poll(self) -> None:
        """Mark everything stale when something changed without an event (e.g. ``dbg.watch`` in a cell, a
        step shown by another panel's timeline)."""
        sig = self._signature()
        if sig != self._sig:
            self._sig = sig
            self.coalescer.mark(*ALL_PARTS)

    # -- selection and navigation -----------------------------------------------------------------
    def select(self, name: str, reveal: bool = True) -> None:
        """Select node ``name`` everywhere: graph (opening its scopes), node list, details, watchpoints."""
        if name not in self.source.graph.nodes:
            raise KeyError(f"no node named {name!r} in the graph")
        self.selected = name
        if reveal:
            self.graph_view.reveal(name)
        else:
            self.graph_view.select(name)
        self.node_list.show(name)
        self.details.show(name)
        self.watch.refresh()
        if self.controls is not None:
            self.controls.refresh()

    def view(self, node: str, slot: str, step: int | str = "current", hit: Any = None) -> None:
        """Open the tensor view on ``node``'s ``slot``."""
        self.tensor_view.open(node, slot, step, hit)
        if self.selected != node:
            self.select(node)

    def view_hit(self, hit: Any) -> None:
        self.view(hit.node, hit.slot, hit.step, hit)

    # -- offline step ------------------------------------------------------------------------------
    def _step_selector(self) -> w.Dropdown:
        steps = self.source.steps
        current = self.source.step
        dd = w.Dropdown(options=[(f"step {s}", s) for s in steps], value=current if current in steps else None,
                        description="Step", disabled=len(steps) < 2, layout=w.Layout(width="150px"),
                        style={"description_width": "36px"}, _dom_classes=("nbdebug-step-select",))
        dd.observe(lambda ch: self.goto(ch["new"]) if ch["new"] is not None else None, names="value")
        return dd

    def scrub(self, step: int) -> str | None:
        """Show ``step`` in every view (a click on the timeline), live too while training is not running;
        returns why not when its statistics are not kept (``-1``: the latest step again)."""
        if step < 0:
            self.refresh()
            return None
        why = scrub_step(self.source, step)
        if why is None:
            self.goto(step)
        return why

    def goto(self, step: int) -> None:
        """Offline: show ``step`` in every view (what the step selector does)."""
        if self.source.step != step:
            self.source.goto(step)
        if self.step_select is not None and self.step_select.value != step:
            self.step_select.value = step
        tv = self.tensor_view
        if tv.visible and tv.node is not None and tv.step in ("current", "previous"):
            tv.open(tv.node, tv.slot, tv.step)
        elif tv.visible and tv.node is not None:
            tv.open(tv.node, tv.slot, "current")
        self.refresh()

    # -- reactions --------------------------------------------------------------------------------
    def _acted(self) -> None:
        self.coalescer.mark("header", "controls", "graph", "hits", "details")
        self.flush()

    def _watch_changed(self) -> None:
        self.coalescer.mark("header", "hits", "graph", "watch")
        self.flush()

    def _recommend_bar(self, offer: bool) -> w.HBox:
        bar = w.HBox([], layout=w.Layout(display="none", border="1px solid #d4a72c", padding="4px"),
                     _dom_classes=("nbdebug-recommend",))
        if not offer or not _first_offer(self.source.obj):
            return bar
        try:
            rules = self.source.recommend()
        except Exception:  # noqa: BLE001 - no offer when it cannot be computed
            return bar
        text = ", ".join(f"{c} on {t}" for c, _p, t in rules)
        keep = {"width": "auto", "min_width": "56px", "flex": "0 0 auto"}  # never squeezed by the long text
        yes = w.Button(description="yes", button_style="primary", layout=w.Layout(**keep),
                       _dom_classes=("nbdebug-recommend-yes",))
        no = w.Button(description="no", layout=w.Layout(**keep), _dom_classes=("nbdebug-recommend-no",))
        yes.on_click(lambda _b: self.apply_recommended(True))
        no.on_click(lambda _b: self.apply_recommended(False))
        bar.children = [w.HTML(f"Use the recommended watchpoints? <small>({html.escape(text)})</small>&nbsp;"),
                        yes, no]
        bar.layout.display = "flex"
        return bar

    def _settle_offer(self) -> None:
        """The recommended-watchpoints offer goes once it is moot: the user set watchpoints their own way
        (form, ``dbg.watch``), or training is over."""
        bar = self.recommend_bar
        if bar.layout.display == "none":
            return
        src = self.source
        if src.watchpoints.watchpoints or src.state in ("finished", "terminated", "failed", "closed"):
            bar.layout.display = "none"

    def apply_recommended(self, accept: bool) -> list[Any]:
        """Answer the recommended-watchpoints offer."""
        self.recommend_bar.layout.display = "none"
        if not accept:
            return []
        made = self.source.watch_recommended()
        self.watch.message.value = f"{len(made)} recommended watchpoints created"
        self._watch_changed()
        return made

    def export_html(self, path: Any) -> Any:
        """One self-contained HTML file: the graph as this panel shows it (open scopes, selection), the hits,
        the tensor slice in view, and the node statistics (see :func:`nbdebug.ui.export.export_html`)."""
        from .export import export_html, viewed_tensor

        return export_html(self.source.obj, path, graph=self.graph_view, tensors=viewed_tensor(self.tensor_view))

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Unsubscribe from the source and close every widget of the panel."""
        if not getattr(self, "_closed", True):
            self._closed = True
            for off in self._subs:
                off()
            self._subs = []
            tv = self.tensor_view  # its figures join the widget tree only when it first opens
            self.timeline.close()
            for child in _descendants(self) + [tv.heatmap, tv.relations]:
                child.close()
        super().close()


_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # live panels, told about foreground failures
_HOOKED: list[Any] = []


def after_cell(result: Any) -> None:
    """IPython ``post_run_cell`` hook: a cell raised while a live debugger was inside a step in the
    foreground → each of its panels shows the failure (exception, step, node that ran last)."""
    err = getattr(result, "error_in_exec", None)
    if err is None:
        return
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    took = [panel for panel in list(_LIVE) if not panel._closed and panel.source.foreground_failed(text)]
    # the iteration the cell left is over: its step closes as it is (else the next cell's training was recorded
    # into it — after an Interrupt between the backward pass and optimizer.step(), say)
    for obj in {id(p.source.obj): p.source.obj for p in took}.values():
        end = getattr(obj, "end_abandoned_step", None)
        if end is not None:
            end()
    for panel in took:
        panel.source.foreground_settled()
        panel.coalescer.mark("header", "controls")
        panel.flush()


def _install_cell_hook() -> None:
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - ipywidgets needs IPython
        return
    ip = get_ipython()
    if ip is None or any(h is ip for h in _HOOKED):
        return
    ip.events.register("post_run_cell", after_cell)
    _HOOKED.append(ip)


def _descendants(widget: Any) -> list[Any]:
    out = []
    stack = list(getattr(widget, "children", ()))
    while stack:
        wd = stack.pop()
        out.append(wd)
        stack.extend(getattr(wd, "children", ()))
    return out


def _poll(ref: weakref.ref) -> None:
    panel = ref()
    if panel is None or panel._closed:
        return
    panel.poll()
    panel.update_snapshot()
    loop = panel.coalescer.loop
    if loop is not None and not loop.is_closed():
        loop.call_later(POLL_SECONDS, _poll, ref)
