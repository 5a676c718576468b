"""The job's timeline: ranks × steps for one series (``(name, field)``, e.g. ``("Run", "loss")`` or a module's
``output_norm``), drawn by the same ``timeline`` view as a panel's; the line chart is the selected rank's
series with its band. Clicking a rank's step selects that rank in the job panel and scrubs it to the step.

>>> import numpy as np
>>> from nbdebug.job import Job
>>> from nbdebug.offline import OfflineSession
>>> from nbdebug.session.monitor import Monitor
>>> from nbdebug.session.session import Session
>>> def rank(scale):
...     s = Session(framework="pytorch", live=False); s.monitor = Monitor()
...     for step in range(20):
...         s.monitor.record(step, [("Run", "loss")], np.array([scale * (1 + step)]))
...     return OfflineSession(s)
>>> tl = RankTimeline(Job({0: rank(1.0), 1: rank(1e3)}))
>>> msg, bufs = tl.message()
>>> msg["field"], msg["series"], [r[0] for r in msg["rows"]], msg["shape"]
('loss', 'Run', ['0', '1'], [2, 20])
>>> float(bufs[2].reshape(2, 20)[1, 3])
4000.0
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .timeline import DEFAULT_WIDTH, DEFAULTS, MAX_WIDTH, RunSeries, nonfinite_rows
from .timeline_data import HISTORY_FIELDS, band_for, decimate


class RankTimeline:
    """Ranks × steps of one series of a :class:`~nbdebug.job.Job`."""

    def __init__(self, job: Any) -> None:
        self.job = job
        fields = self.fields()
        self.field = "loss" if "loss" in fields else fields[0]
        self.name: str | None = None
        self.selected: int | None = None
        self.view: tuple[int, int] | None = None
        self.width = DEFAULT_WIDTH
        self.band = "DRIFT"
        self.window, self.k = DEFAULTS["DRIFT"]
        self.step: int | None = None
        self.note = ""

    def _data(self, rank: Any) -> RunSeries:
        return RunSeries(self.job.source(rank).session)

    def fields(self) -> list[str]:
        out: list[str] = []
        for r in self.job.ranks:
            out += [f for f in self._data(r).fields() if f not in out]
        return out or list(HISTORY_FIELDS)

    def names(self) -> list[str]:
        out: list[str] = []
        for r in self.job.ranks:
            out += [n for n in self._data(r).names(self.field) if n not in out]
        return out

    def zoom(self, lo: int | None, hi: int | None, width: int | None = None) -> None:
        self.view = None if lo is None or hi is None else (int(min(lo, hi)), int(max(lo, hi)))
        if width is not None:
            self.width = max(10, min(MAX_WIDTH, int(width)))

    def message(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The ``timeline`` message (rows: ranks) and its buffers."""
        names = self.names()
        if self.name not in names:
            self.name = names[0] if names else None
        ranks = self.job.ranks
        base = {"type": "timeline", "field": self.field, "fields": self.fields(), "series": self.name,
                "band": self.band, "window": self.window, "k": self.k, "step": self.step, "note": self.note}
        series = {r: self._data(r).series(self.name, self.field) for r in ranks} if self.name else {}
        have = [s for s in series.values() if len(s[0])]
        if not have:
            return {**base, "empty": f"no {self.field} series on any rank yet", "rows": [], "shape": [0, 0],
                    "steps": None}, []
        extent = (min(int(s[0][0]) for s in have), max(int(s[0][-1]) for s in have))
        lo, hi = self.view or extent
        lo, hi = max(lo, extent[0]), min(hi, extent[1])
        if hi < lo:
            lo, hi = extent
        cols = {r: decimate(s[0], s[1], lo, hi, self.width, s[2]) for r, s in series.items()}
        first = next(iter(cols.values()))
        heat = np.vstack([c.vmax for c in cols.values()]).astype(np.float32)
        if self.selected not in ranks:
            self.selected = ranks[0]
        steps, vmax, _vmin = series[self.selected]
        line = cols[self.selected]
        band = band_for(self.band, vmax, self.window, self.k)
        nan = np.full(len(first.first), np.nan)
        bands = [nan, nan, nan]
        left = None
        if band is not None and len(steps):
            bands = [decimate(steps, np.where(np.isinf(band.lo), np.nan, band.lo), lo, hi, self.width).vmin,
                     decimate(steps, band.mid, lo, hi, self.width).vmax,
                     decimate(steps, band.hi, lo, hi, self.width).vmax]
            out = np.flatnonzero(band.outside(vmax))
            left = int(steps[out[0]]) if len(out) else None
        row_of = {r: i for i, r in enumerate(ranks)}
        hits = [[int(h.step), row_of[r], h.condition, h.node] for r, hs in self.job.hits.items() if r in row_of
                for h in hs if getattr(h, "hits", True) and lo <= h.step <= hi][:500]
        finite = heat[np.isfinite(heat)]
        msg = {**base, "steps": list(extent), "range": [int(lo), int(hi)], "shape": [len(ranks), len(first.first)],
               "rows": [[str(r), f"rank {r}", 0, False, False] for r in ranks], "selected": str(self.selected),
               "selected_label": f"rank {self.selected}: {self.name}", "hits": hits, "left_band": left,
               "log": bool(finite.size) and bool((finite > 0).all()) and float(finite.max() / finite.min()) > 100}
        msg["nonfinite"], nonfinite = nonfinite_rows([*(c.flags for c in cols.values()), line.flags])
        return msg, [first.first.astype(np.int32), first.last.astype(np.int32), heat,
                     line.vmin.astype(np.float32), line.vmax.astype(np.float32),
                     *(b.astype(np.float32) for b in bands), *([nonfinite] if msg["nonfinite"] else [])]


class JobTimelineView:
    """The job panel's timeline section (closed until toggled); ``on_pick(rank, step)`` selects a rank's step."""

    def __init__(self, job: Any, on_pick: Any, height: int = 300) -> None:
        import ipywidgets as w

        from .frontend import FrontendWidget

        self.timeline = RankTimeline(job)
        self.on_pick = on_pick
        self.open = False
        self.toggle_button = w.ToggleButton(value=False, description="Ranks × steps", icon="line-chart",
                                            layout=w.Layout(width="140px"),
                                            _dom_classes=("nbdebug-job-timeline-toggle",))
        self.toggle_button.observe(lambda ch: self.show(ch["new"]), names="value")
        self.field = w.Dropdown(options=self.timeline.fields(), value=self.timeline.field, description="Field",
                                layout=w.Layout(width="230px"), style={"description_width": "40px"})
        self.series = w.Dropdown(options=[], description="Series", layout=w.Layout(width="360px"),
                                 style={"description_width": "44px"})
        self.field.observe(lambda ch: self._set(field=ch["new"]), names="value")
        self.series.observe(lambda ch: self._set(name=ch["new"]), names="value")
        self.figure = FrontendWidget(view="timeline", height=height)
        self.figure.handle("hello", lambda _c, _b: self.send())
        self.figure.handle("range", self._range)
        self.figure.handle("select", self._select)
        self.figure.handle("scrub", self._scrub)
        self.body = w.VBox([w.HBox([self.field, self.series]), self.figure], layout=w.Layout(display="none"))
        self.widget = w.VBox([self.toggle_button, self.body], _dom_classes=("nbdebug-job-timeline",))

    def show(self, open_: bool = True) -> None:
        self.open = bool(open_)
        if self.toggle_button.value != self.open:
            self.toggle_button.value = self.open
        self.body.layout.display = None if self.open else "none"
        self.send()

    def _set(self, **kw: Any) -> None:
        for k, v in kw.items():
            if v is not None:
                setattr(self.timeline, k, v)
        self.send()

    def send(self) -> None:
        if not self.open:
            return
        tl = self.timeline
        names = tl.names()
        if list(self.series.options) != names:
            self.series.options = names
        msg, bufs = tl.message()
        if self.series.value != tl.name and tl.name in names:
            self.series.value = tl.name
        self.figure.post(msg, bufs)

    def _range(self, content: dict[str, Any], _b: Any) -> None:
        lo, hi = content.get("lo"), content.get("hi")
        self.timeline.zoom(None if lo is None else int(lo), None if hi is None else int(hi), content.get("width"))
        self.send()

    def _rank(self, row: Any) -> Any:
        for r in self.timeline.job.ranks:
            if str(r) == str(row):
                return r
        return None

    def _select(self, content: dict[str, Any], _b: Any) -> None:
        self.timeline.selected = self._rank(content.get("row"))
        self.send()

    def _scrub(self, content: dict[str, Any], _b: Any) -> None:
        rank = self._rank(content.get("row"))
        if rank is None:
            rank = self.timeline.selected
        from .timeline_view import pick_step

        last = int(content.get("last", content.get("step", 0)))
        step = pick_step(self.timeline.job.source(rank).session, int(content.get("first", last)), last)
        self.timeline.selected, self.timeline.step = rank, step
        why = self.on_pick(rank, step)
        self.timeline.note = why or ""
        self.send()
