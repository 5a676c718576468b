"""The run timeline of a panel: a heatmap of modules × steps for one field, a line chart of the selected row
with its band and hit markers, drawn by the front end's ``timeline`` view (plotly.js, ``frontend/src/timeline.ts``).

The kernel decimates (:mod:`nbdebug.ui.timeline_data`: exact min/max per pixel column) and sends one
``timeline`` message with float32/int32 binary buffers; zooming in the browser asks for the new range
(``range``), so a run of 100,000 steps costs the same bytes as one of 500. Clicking a step sends ``scrub``:
the panel shows that step everywhere (header, graph badges, node statistics, hits, details) where its
statistics are kept, else says why (:class:`~nbdebug.session.store.NotRetainedError`'s reason).

>>> from nbdebug.session.session import Session
>>> from nbdebug.session.monitor import Monitor
>>> import numpy as np
>>> s = Session(framework="pytorch", live=False)
>>> s.monitor = Monitor()
>>> keys = [("Module.fc.Linear", "output_norm"), ("Run", "loss")]
>>> for step in range(100):
...     s.monitor.record(step, keys, np.array([1.0 + step, 2.0]))
>>> tl = Timeline(s)
>>> msg, bufs = tl.message()
>>> msg["field"], msg["shape"], [r[0] for r in msg["rows"]], msg["steps"]
('output_norm', [1, 100], ['fc'], [0, 99])
>>> tl.zoom(10, 59, width=10); tl.message()[0]["shape"]
[1, 10]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .timeline_data import (
    HISTORY_FIELDS,
    MONITOR_FIELDS,
    RUN,
    Columns,
    RowTree,
    band_for,
    decimate,
    default_expanded,
    nan_reduce,
    row_values,
    series_path,
)

MAX_WIDTH = 2000     # columns sent at most (one per pixel of a wide screen)
DEFAULT_WIDTH = 800
BANDS = ("SPIKE", "DRIFT", "none")
DEFAULTS = {"SPIKE": (50, 10.0), "DRIFT": (200, 6.0)}


class RunSeries:
    """Every per-step series of one session: the monitor's (``session.monitor``) and, for the statistics of
    the per-tensor history, each forward module's first output (``output.0``; a ``ModelOutput``'s first field)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._cache: dict[tuple[str, str], tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    @property
    def monitor(self) -> Any:
        return getattr(self.session, "monitor", None)

    def fields(self) -> list[str]:
        """Fields with data: the monitor's, then the history's statistics."""
        mon = self.monitor
        have = {f for _n, f in mon.keys} if mon is not None and len(mon) else set()
        out = [f for fs in MONITOR_FIELDS.values() for f in fs if f in have]
        return out + list(HISTORY_FIELDS)

    def is_monitor(self, field: str) -> bool:
        return field not in HISTORY_FIELDS

    def names(self, field: str) -> list[str]:
        if self.is_monitor(field):
            mon = self.monitor
            return mon.names(field) if mon is not None else []
        nodes = list(self.session.graph.nodes.values())  # as of now: training may add nodes meanwhile
        mods = sorted((n for n in nodes if n.kind == "module" and n.section == "forward"
                       and series_path(n.name) is not None), key=lambda n: n.order)
        return [n.name for n in mods]

    def _version(self) -> Any:
        s = self.session
        mon = self.monitor
        return (len(mon) if mon is not None else 0, int(s.step_index), len(s.steps), len(s.history.steps))

    def series(self, name: str, field: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(steps, maxima, minima)`` of one series (maxima == minima except in a monitor's folded blocks)."""
        key, ver = (name, field), self._version()
        hit = self._cache.get(key)
        if hit is not None and hit[0] == ver:
            return hit[1]
        if self.is_monitor(field):
            mon = self.monitor
            steps, vmax = mon.series(name, field, "max")
            _s, vmin = mon.series(name, field, "min")
            out = (steps, vmax, vmin if len(vmin) == len(vmax) else vmax)
        else:
            steps, vals = self._history(name, field)
            out = (steps, vals, vals)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = (ver, out)
        return out

    def _history(self, name: str, field: str) -> tuple[np.ndarray, np.ndarray]:
        """A statistic of the per-tensor history over the steps it has a value: a NaN stays only where the tensor
        held NaN/±Inf (the model computed it); a statistic not computed (unsupported: NaN) is no value, a gap."""
        slot = self._first_output(name)
        steps_l, vals_l = self.session.timeline(name, slot, field)
        steps, vals = np.asarray(steps_l, np.int64), np.asarray(vals_l, np.float64)
        nan = np.isnan(vals)
        if nan.any():
            nf_steps, nf = (self.session.timeline(name, slot, "nonfinite_count") if field != "nonfinite_count"
                            else (steps_l, vals_l))
            bad = dict(zip(nf_steps, nf, strict=True))
            keep = ~nan | np.array([field != "nonfinite_count" and bad.get(int(k), 0) > 0 for k in steps])
            steps, vals = steps[keep], vals[keep]
        return steps, vals

    def _first_output(self, name: str) -> str:
        """A module node's first output slot: ``output.0``, or a ``ModelOutput``'s first field
        (``output.last_hidden_state``), as the monitor's ``output_norm`` reads it."""
        node = self.session.graph.nodes.get(name)
        slots = list(node.shapes) if node is not None else []
        if "output.0" in slots:
            return "output.0"
        return next((s for s in slots if s.startswith("output.")), "output.0")

    def folded_until(self, field: str) -> int | None:
        """The first full-resolution step of the monitor when some of its steps were folded into blocks."""
        mon = self.monitor
        if not self.is_monitor(field) or mon is None or len(mon) <= mon.horizon:
            return None
        steps = mon.recent()[0]
        return int(steps[0]) if len(steps) else None

    def extent(self, names: list[str], field: str) -> tuple[int, int] | None:
        """First and last step any of ``names`` has."""
        if self.is_monitor(field) and self.monitor is not None and len(self.monitor):
            steps = [self.series(n, field)[0] for n in names[:1]] + [self.monitor.recent()[0][-1:]]
        else:
            steps = [self.series(n, field)[0] for n in names]
        steps = [s for s in steps if len(s)]
        if not steps:
            return None
        return int(min(s[0] for s in steps)), int(max(s[-1] for s in steps))


class Timeline:
    """The timeline's state (field, open rows, selected row, view range, band) and its ``timeline`` message."""

    def __init__(self, session: Any, *, hits: Callable[[], list[Any]] | None = None,
                 graph: Any = None) -> None:
        self.data = RunSeries(session)
        self.hits = hits or (lambda: [])
        self.graph = graph if graph is not None else session.graph
        fields = self.data.fields()
        self.field = fields[0]
        self.expanded: list[str] | None = None   # None: the default
        self.selected: str | None = None        # a row path
        self.view: tuple[int, int] | None = None
        self.width = DEFAULT_WIDTH
        self.band = "SPIKE"
        self.window, self.k = DEFAULTS["SPIKE"]
        self.step: int | None = None           # the step the panel shows (a vertical line)
        self.note = ""

    # -- changes --------------------------------------------------------------------------------------
    def set_field(self, field: str) -> None:
        if field not in self.data.fields() and field not in HISTORY_FIELDS:
            raise ValueError(f"unknown timeline field {field!r}; known: {', '.join(self.data.fields())}")
        if self.data.is_monitor(field) != self.data.is_monitor(self.field) or \
                _kind(field) != _kind(self.field):
            self.expanded, self.selected = None, None   # other rows
        self.field = field

    def set_band(self, kind: str, window: int | None = None, k: float | None = None) -> None:
        if kind not in BANDS:
            raise ValueError(f"band must be one of {BANDS}, got {kind!r}")
        if kind != self.band and kind in DEFAULTS:
            self.window, self.k = DEFAULTS[kind]
        self.band = kind
        if window is not None:
            self.window = max(1, int(window))
        if k is not None:
            self.k = float(k)

    def zoom(self, lo: int | None, hi: int | None, width: int | None = None) -> None:
        """Show steps ``lo..hi`` (None: the whole run) at ``width`` columns at most."""
        self.view = None if lo is None or hi is None else (int(min(lo, hi)), int(max(lo, hi)))
        if width is not None:
            self.width = max(10, min(MAX_WIDTH, int(width)))

    def toggle(self, path: str) -> None:
        opened = list(self._expanded(self._tree()))
        if path in opened:
            opened.remove(path)
        else:
            opened.append(path)
        self.expanded = opened

    def _tree(self) -> RowTree:
        return RowTree.of(self.data.names(self.field))

    def _expanded(self, tree: RowTree) -> list[str]:
        if self.expanded is None:
            self.expanded = default_expanded(tree)
        return self.expanded

    # -- the message ----------------------------------------------------------------------------------
    def message(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The ``timeline`` message and its buffers (see ``frontend/PROTOCOL.md``)."""
        field = self.field
        tree = self._tree()
        opened = set(self._expanded(tree))
        rows = tree.visible(opened)
        names = self.data.names(field)
        extent = self.data.extent(names, field) if names else None
        base = {"type": "timeline", "field": field, "fields": self.data.fields(), "band": self.band,
                "window": self.window, "k": self.k, "step": self.step, "note": self.note}
        if extent is None:
            return {**base, "empty": f"no {field} series recorded yet", "rows": [], "shape": [0, 0],
                    "steps": None}, []
        lo, hi = self.view if self.view is not None else extent
        lo, hi = max(lo, extent[0]), min(hi, extent[1])
        if hi < lo:
            lo, hi = extent
        heat, flags = [], []
        cols: Columns | None = None
        for path, _depth, kids in rows:
            c = self._row_columns(tree, path, path in opened or not kids, lo, hi)
            cols = cols or c
            heat.append(c.vmax if field != "min" else c.vmin)
            flags.append(c.flags)
        if cols is None:
            cols = decimate(np.zeros(0), np.zeros(0), lo, hi, self.width)
        if self.selected is None or self.selected not in tree.children:
            self.selected = rows[0][0] if rows else None
        line, band, left = self._line(tree, opened, lo, hi)
        ncols = len(cols.first)
        heat_arr = np.vstack(heat).astype(np.float32) if heat else np.zeros((0, ncols), np.float32)
        row_of = {path: i for i, (path, _d, _k) in enumerate(rows)}
        msg = {**base, "steps": [int(extent[0]), int(extent[1])], "range": [int(lo), int(hi)],
               "shape": [len(rows), ncols],
               "rows": [[p, tree.label(p), d, bool(k), p in opened] for p, d, k in rows],
               "selected": self.selected, "selected_label": self._series_label(tree, opened),
               "hits": self._hits(tree, rows, row_of, lo, hi), "left_band": left,
               "log": field not in ("mean", "min", "max", "loss_scale") and _positive(heat_arr)}
        msg["nonfinite"], nonfinite = nonfinite_rows([*flags, line.flags])
        return msg, [cols.first.astype(np.int32), cols.last.astype(np.int32), heat_arr,
                     line.vmin.astype(np.float32), line.vmax.astype(np.float32),
                     *(b.astype(np.float32) for b in band), *([nonfinite] if msg["nonfinite"] else [])]

    def _row_columns(self, tree: RowTree, path: str, own: bool, lo: int, hi: int) -> Columns:
        parts = [self._decimated(n, lo, hi) for n in row_values(tree, path, own, None)]
        if len(parts) == 1:
            return parts[0]
        return Columns(parts[0].first, parts[0].last, nan_reduce([p.vmin for p in parts], "min"),
                       nan_reduce([p.vmax for p in parts], "max"),
                       np.bitwise_or.reduce([p.flags for p in parts], axis=0))

    def _decimated(self, name: str, lo: int, hi: int) -> Columns:
        steps, vmax, vmin = self.data.series(name, self.field)
        cols = decimate(steps, vmax, lo, hi, self.width, vmin)
        folded_until = self.data.folded_until(self.field)
        if folded_until is not None:  # a folded block stands at its last step but covers the steps before it
            _backfill(cols, folded_until)
        return cols

    def _series_label(self, tree: RowTree, opened: set[str]) -> str:
        if self.selected is None:
            return ""
        names = row_values(tree, self.selected, self.selected in opened or not tree.children.get(self.selected),
                           None)
        return names[0] if len(names) == 1 else f"{self.selected} (max of {len(names)} series)"

    def _line(self, tree: RowTree, opened: set[str], lo: int, hi: int) -> tuple[Columns, list[np.ndarray], Any]:
        """The selected row decimated, its band (lo, mid, hi per column) and the first step outside it."""
        empty = decimate(np.zeros(0), np.zeros(0), lo, hi, self.width)
        nan = np.full(len(empty.first), np.nan)
        if self.selected is None:
            return empty, [nan, nan, nan], None
        own = self.selected in opened or not tree.children.get(self.selected)
        names = row_values(tree, self.selected, own, None)
        if len(names) != 1:
            return self._row_columns(tree, self.selected, own, lo, hi), [nan, nan, nan], None
        steps, vmax, vmin = self.data.series(names[0], self.field)
        line = decimate(steps, vmax, lo, hi, self.width, vmin)
        band = band_for(self.band, vmax, self.window, self.k)
        if band is None:
            return line, [nan, nan, nan], None
        b_lo = decimate(steps, band.lo, lo, hi, self.width).vmin
        b_mid = decimate(steps, band.mid, lo, hi, self.width).vmax
        b_hi = decimate(steps, band.hi, lo, hi, self.width).vmax
        out = np.flatnonzero(band.outside(vmax))
        left = int(steps[out[0]]) if len(out) else None
        return line, [np.where(np.isinf(b_lo), np.nan, b_lo), b_mid, b_hi], left

    def _hits(self, tree: RowTree, rows: list[tuple[str, int, bool]], row_of: dict[str, int],
              lo: int, hi: int) -> list[list[Any]]:
        """``[step, row index, condition, node]`` of the hits in range, on the row that holds their node."""
        out: list[list[Any]] = []
        for h in self.hits():
            if not getattr(h, "hits", True) or not lo <= h.step <= hi:
                continue
            path = self._path_of(h.node)
            row = -1
            while path:
                if path in row_of:
                    row = row_of[path]
                    break
                path = path.rsplit(".", 1)[0] if "." in path else ""
            out.append([int(h.step), row, h.condition, h.node])
            if len(out) >= 500:
                break
        return out

    def _path_of(self, node: str) -> str:
        p = series_path(node)
        if p is not None:
            return p
        n = self.graph.nodes.get(node)
        return n.scope.replace("/", ".") if n is not None else ""


def nonfinite_rows(flags: list[np.ndarray]) -> tuple[list[int], np.ndarray]:
    """The rows (indices into ``flags``; the last one: the line) with a non-finite value, and their flags
    (uint8, one row of columns each, concatenated; the message's ninth buffer, left out for a view without
    NaN or ±Inf).

    >>> nonfinite_rows([np.array([0, 0], np.uint8), np.array([0, 1], np.uint8)])
    ([1], array([0, 1], dtype=uint8))
    """
    rows = [i for i, f in enumerate(flags) if f.any()]
    out = np.concatenate([flags[i] for i in rows]) if rows else np.zeros(0, np.uint8)
    return rows, out.astype(np.uint8)


def _backfill(cols: Columns, until: int) -> None:
    """Empty columns before step ``until`` take the next column's values (the block whose last step is there)."""
    present = ~np.isnan(cols.vmax) | (cols.flags > 0)
    ok = np.flatnonzero(present)
    gaps = np.flatnonzero(~present & (cols.last < until))
    if len(ok) and len(gaps):
        nxt = np.searchsorted(ok, gaps)
        fill = nxt < len(ok)
        cols.flags[gaps[fill]] = cols.flags[ok[nxt[fill]]]
    for arr in (cols.vmin, cols.vmax):
        ok = np.flatnonzero(~np.isnan(arr))
        gaps = np.flatnonzero(np.isnan(arr) & (cols.last < until))
        if not len(ok) or not len(gaps):
            continue
        nxt = np.searchsorted(ok, gaps)
        fill = nxt < len(ok)
        arr[gaps[fill]] = arr[ok[nxt[fill]]]


def _kind(field: str) -> str:
    for kind, fs in MONITOR_FIELDS.items():
        if field in fs:
            return kind
    return "history"


def _positive(a: np.ndarray) -> bool:
    finite = a[np.isfinite(a)]
    return bool(finite.size) and bool((finite > 0).all()) and float(finite.max() / finite.min()) > 100


__all__ = ["RUN", "RunSeries", "Timeline", "nonfinite_rows"]
