"""The panel's run timeline section: a toggle, the field / band controls and the plotly view
(:class:`~nbdebug.ui.frontend.FrontendWidget`, ``view="timeline"``) over a :class:`~nbdebug.ui.timeline.Timeline`.

Closed, it sends nothing. Open, it redraws at most once a second while training runs. The browser asks for
a zoomed range (``range``), opens/closes rows (``toggle``), selects the line chart's row (``select``) and
*scrubs* (``scrub``: a clicked step): the panel then shows that step in every view; a step whose statistics
are not kept is refused with the reason, shown under the timeline (``nbdebug-timeline-note``).

>>> from nbdebug.session.session import Session
>>> from nbdebug.ui.source import SourceView
>>> view = TimelineView(SourceView(Session(framework="pytorch", live=False)), on_scrub=lambda s: None)
>>> view.open, view.widget.layout.display is None
(False, True)
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..session.store import NotRetainedError
from .frontend import FrontendWidget
from .throttle import _AUTO, Coalescer
from .timeline import BANDS, Timeline


def scrub_step(source: Any, step: int) -> str | None:
    """Make ``step`` the one the panel's views show (what clicking the timeline does); the reason when it
    cannot be shown (its statistics fell out of the window, training runs, a step is being recorded)."""
    session = source.session
    step = int(step)
    if source.live:
        if source.state == "running":
            return f"step {step}: training is running; pause it to look at another step"
        if step in session.steps and not len(session.recorder):
            session.goto(step)
            return None
        if step in session.steps:
            return (f"step {step}: step {session.step_index} is being recorded (paused inside it); "
                    "the panel shows it until the step ends")
    elif step in session.steps:
        source.goto(step)
        return None
    level = getattr(getattr(source, "obj", None), "level", None)
    if not getattr(level, "records_tensors", True):  # the monitor level: its window holds empty tables
        return (f"step {step}: level {str(level)!r} records the series this timeline shows, no tensor statistics "
                "(a Debugger at level 'L0', 'L1' or 'mix' keeps them for its last steps)")
    try:
        session.table(step)
    except (NotRetainedError, KeyError) as e:
        return str(e.args[0]) if e.args else str(e)
    return f"step {step} has no statistics to show"


def pick_step(session: Any, first: int, last: int) -> int:
    """The step a click on a column of steps ``first..last`` means: the latest one with full statistics in it,
    else ``last``."""
    kept = [s for s in session.steps if first <= s <= last]
    return max(kept) if kept else int(last)


class TimelineView:
    """The timeline section of a panel; ``on_scrub(step)`` shows a step everywhere and returns why not."""

    def __init__(self, source: Any, *, on_scrub: Callable[[int], str | None], loop: Any = _AUTO,
                 height: int = 460) -> None:
        self.source = source
        self.on_scrub = on_scrub
        self.timeline = Timeline(source.session, hits=lambda: source.hits, graph=source.graph)
        self.open = False
        self.toggle_button = w.ToggleButton(value=False, description="Timeline", icon="line-chart",
                                            tooltip="the run's per-step series: modules × steps, click a step to "
                                                    "show it everywhere", layout=w.Layout(width="120px"),
                                                    _dom_classes=("nbdebug-timeline-toggle",))
        self.toggle_button.observe(lambda ch: self.show(ch["new"]), names="value")
        self.field = w.Dropdown(options=self.timeline.data.fields(), value=self.timeline.field,
                                description="Field", layout=w.Layout(width="230px"),
                                style={"description_width": "40px"}, _dom_classes=("nbdebug-timeline-field",))
        self.band = w.Dropdown(options=list(BANDS), value=self.timeline.band, description="Band",
                               layout=w.Layout(width="150px"), style={"description_width": "40px"},
                               _dom_classes=("nbdebug-timeline-band",))
        self.window = w.BoundedIntText(value=self.timeline.window, min=1, max=100_000, description="window",
                                       layout=w.Layout(width="140px"), style={"description_width": "50px"})
        self.k = w.BoundedFloatText(value=self.timeline.k, min=0.0, max=1e6, description="k",
                                    tooltip="SPIKE: factor × median; DRIFT: |z|",
                                    layout=w.Layout(width="110px"), style={"description_width": "20px"})
        self.latest = w.Button(description="latest step", tooltip="show the latest step again",
                               layout=w.Layout(width="100px"), _dom_classes=("nbdebug-timeline-latest",))
        self.latest.on_click(lambda _b: self.release())
        for wd in (self.field, self.band, self.window, self.k):
            wd.observe(lambda _ch: self._controls_changed(), names="value")
        self.note = w.HTML("", _dom_classes=("nbdebug-timeline-note",))
        self.figure = FrontendWidget(view="timeline", height=height)
        self.figure.handle("range", self._range)
        self.figure.handle("scrub", self._scrub)
        self.figure.handle("toggle", lambda c, _b: self._then_send(self.timeline.toggle, str(c.get("row", ""))))
        self.figure.handle("select", self._select)
        self.figure.handle("hello", lambda _c, _b: self.send())
        self.body = w.VBox([w.HBox([self.field, self.band, self.window, self.k, self.latest]), self.figure,
                            self.note], layout=w.Layout(display="none"))
        self.widget = w.VBox([self.toggle_button, self.body], _dom_classes=("nbdebug-timeline",))
        self.coalescer = Coalescer(lambda _parts: self.send(), rate=1.0, loop=loop)
        self._subs = [source.on(ev, lambda _p: self._changed()) for ev in ("step", "hit")]

    # -- open / refresh ------------------------------------------------------------------------------
    def show(self, open_: bool = True) -> None:
        """Open (or close) the timeline; opening draws it."""
        self.open = bool(open_)
        if self.toggle_button.value != self.open:
            self.toggle_button.value = self.open
        self.body.layout.display = None if self.open else "none"
        if self.open:
            self.refresh()

    def _changed(self) -> None:
        if self.open:
            self.coalescer.mark("timeline")

    def refresh(self) -> None:
        """Redraw now (fields that appeared, the panel's step)."""
        if not self.open:
            return
        fields = self.timeline.data.fields()
        if list(self.field.options) != fields:
            self.field.options = fields
            if self.timeline.field in fields:
                self.field.value = self.timeline.field
        self.send()

    def send(self) -> None:
        if not self.open:
            return
        step = self.source.step
        self.timeline.step = step if step >= 0 else None
        msg, buffers = self.timeline.message()
        self.figure.post(msg, buffers)

    def _then_send(self, fn: Callable[..., Any], *args: Any) -> None:
        fn(*args)
        self.send()

    def _controls_changed(self) -> None:
        tl = self.timeline
        tl.set_field(self.field.value)
        window, k = self.window.value, self.k.value
        if self.band.value != tl.band:
            tl.set_band(self.band.value)
            self.window.value, self.k.value = tl.window, tl.k  # the band's defaults (re-enters once)
        else:
            tl.set_band(self.band.value, window, k)
        self.send()

    # -- browser messages ----------------------------------------------------------------------------
    def _range(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        lo, hi = content.get("lo"), content.get("hi")
        self.timeline.zoom(None if lo is None else int(lo), None if hi is None else int(hi),
                           int(content.get("width") or self.timeline.width))
        self.send()

    def _select(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        self.timeline.selected = str(content.get("row") or "") or None
        self.send()

    def _scrub(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        if content.get("row"):
            self.timeline.selected = str(content["row"])
        first = int(content.get("first", content.get("step", 0)))
        last = int(content.get("last", first))
        self.scrub(pick_step(self.source.session, first, last))

    def scrub(self, step: int) -> str | None:
        """Show ``step`` in the whole panel; returns (and shows) why not when it cannot be shown."""
        why = self.on_scrub(int(step))
        self.timeline.note = why or ""
        self.note.value = ("" if why is None else
                           f"<span style='color:#9a6700'>⚠ {html.escape(why)}</span>")
        self.send()
        return why

    def release(self) -> None:
        """Show the latest step again (live: what training records; offline: the last step)."""
        session = self.source.session
        if self.source.live:
            session.chosen_step = None
            self.on_scrub(-1)
        elif session.steps:
            self.on_scrub(max(session.steps))
        self.timeline.note = ""
        self.note.value = ""
        self.send()

    def close(self) -> None:
        for off in self._subs:
            off()
        self._subs = []
        self.figure.close()


def timeline_export(source: Any, id_: str = "nbdebug-timeline") -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """For ``export_html``: the timeline's element and plotly.js inlined (base64), and its widget snapshot;
    ``("", [])`` when the run has fewer than two steps of series or plotly.js was not built."""
    import base64

    from .frontend import STATIC

    plotly = STATIC / "plotly-cartesian.min.js"
    tl = Timeline(source.session, hits=lambda: source.hits, graph=source.graph)
    tl.step = source.step if source.step >= 0 else None
    msg, buffers = tl.message()
    if msg.get("empty") is not None or msg["steps"][1] <= msg["steps"][0] or not plotly.is_file():
        return "", []
    fig = FrontendWidget(view="timeline")
    fig.post(msg, buffers)
    snap = fig.snapshot()
    fig.close()
    src = base64.b64encode(plotly.read_bytes()).decode("ascii")
    body = (f"<h2>Timeline ({html.escape(msg['field'])}, steps {msg['steps'][0]}–{msg['steps'][1]})</h2>"
            f'<script type="text/plain" id="nbdebug-plotly-src" data-encoding="base64">{src}</script>'
            f'<div id="{id_}" class="nbdebug-export-timeline" data-nbdebug-snapshot="{id_}-data"></div>')
    return body, [(id_, snap)]
