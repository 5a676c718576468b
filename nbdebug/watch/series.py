"""Per-step series of a session for the watchpoints over time: one value per series and step, many series at once.

A *series* is a key ``(name, slot)``: a tensor's output slot with a statistic (``field`` one of
:data:`~nbdebug.session.stats.FIELDS` or ``nonfinite_count``: read from the step's
:class:`~nbdebug.session.stats.StatsTable` while it is in the window, from the compact
:class:`~nbdebug.session.history.History` after — which keeps ``max, min, mean, norm, nonfinite_count`` only),
or a monitor series ``(name, field)`` of ``session.monitor`` (:mod:`nbdebug.session.monitor`: full resolution
for its horizon). A :class:`SeriesReader` answers a step's values of many keys as one float64 vector (NaN
where a series has no value at that step).

>>> import numpy as np
>>> from nbdebug.session.session import Session
>>> from nbdebug.session.monitor import Monitor
>>> s = Session(framework="none"); s.monitor = Monitor()
>>> keys = [("Run", "loss"), ("Parameter.w", "update_ratio")]
>>> for step in range(3):
...     s.monitor.record(step, keys, np.array([3.0 - step, 1e-3]))
>>> r = SeriesReader(s)
>>> r.values(2, "loss", [("Run", "loss"), ("Run", "nothing")]).tolist(), r.steps("loss")
([1.0, nan], [0, 1, 2])
"""

from __future__ import annotations

import fnmatch
from typing import Any

import numpy as np

from nbdebug.session.history import HISTORY_FIELDS
from nbdebug.session.monitor import ALL_FIELDS as MONITOR_FIELDS
from nbdebug.session.stats import COL

Key = tuple[str, str]
_NONFINITE = [COL["nan_count"], COL["pos_inf_count"], COL["neg_inf_count"]]


def is_monitor_field(field: str) -> bool:
    """Whether ``field`` names a monitor series field (else a per-tensor statistic)."""
    return field in MONITOR_FIELDS


def name_selected(wp: Any, name: str) -> bool:
    """Whether watchpoint ``wp`` selects the series ``name`` by name alone (monitor series: no graph node)."""
    if name in wp.removed:
        return False
    if name in wp.added or wp.nodes is None:
        return True
    return any(name == p or fnmatch.fnmatchcase(name, p) for p in wp.nodes)


def node_selected(wp: Any, node: Any) -> bool:
    """Whether ``wp`` selects graph ``node``; with neither nodes nor a target: every node."""
    if node.name in wp.removed:
        return False
    if node.name in wp.added:
        return True
    if wp.nodes is None and wp.target is None:
        return True
    return bool(wp.selects(node))


class SeriesReader:
    """Reads the series of one session (see the module docstring); selections and row maps are cached."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._sel: dict[Any, list[Key]] = {}
        self._rows: dict[Any, np.ndarray] = {}

    @property
    def monitor(self) -> Any:
        return getattr(self.session, "monitor", None)

    # -- which series ------------------------------------------------------------------------------
    def keys(self, wp: Any, field: str, step: int) -> list[Key]:
        """The series ``wp`` selects for ``field`` at ``step`` (the same list object while nothing changed)."""
        if is_monitor_field(field):
            mon = self.monitor
            if mon is None:
                return []
            ck = ("m", wp.id, wp.version, field, len(mon.keys))
            out = self._sel.get(ck)
            if out is None:
                out = [k for k in mon.keys if k[1] == field and name_selected(wp, k[0])]
                self._remember(ck, out)
            return out
        s = self.session
        table = s.steps.get(step)
        if table is not None:
            src, ident = table.keys, id(table.keys)
        else:
            src = list(s.history._ids)
            ident = ("h", len(src))
        ck = ("s", wp.id, wp.version, ident, len(src), len(s.graph))
        out = self._sel.get(ck)
        if out is None:
            nodes = s.graph.nodes
            out = [k for k in src if not k[1].startswith(("input", "parameters")) and k[0] in nodes
                   and node_selected(wp, nodes[k[0]])]
            self._remember(ck, out)
        return out

    def _remember(self, ck: Any, out: list[Key]) -> None:
        if len(self._sel) > 64:
            self._sel.clear()
        self._sel[ck] = out

    # -- which steps --------------------------------------------------------------------------------
    def steps(self, field: str) -> list[int]:
        """The finished steps that have values of ``field``, ascending."""
        if is_monitor_field(field):
            mon = self.monitor
            return [] if mon is None else [int(x) for x in mon.recent()[0]]
        s = self.session
        old = sorted(s.history.steps) if field in HISTORY_FIELDS else []
        return old + sorted(s.steps)

    def has_step(self, field: str, step: int) -> bool:
        """Whether ``step`` finished and has values of ``field`` (kept, at full resolution)."""
        if is_monitor_field(field):
            mon = self.monitor
            return mon is not None and mon.last_step is not None and mon.last_step >= step
        s = self.session
        return step in s.steps or (field in HISTORY_FIELDS and step in s.history.steps)

    # -- values -------------------------------------------------------------------------------------
    def values(self, step: int, field: str, keys: list[Key]) -> np.ndarray:
        """``field`` of every key at ``step`` as float64 (NaN where absent)."""
        return self.values_present(step, field, keys)[0]

    def values_present(self, step: int, field: str, keys: list[Key]) -> tuple[np.ndarray, np.ndarray]:
        """``(values, present)``: :meth:`values` and a mask of the keys that have a value at ``step`` — a NaN
        there is one the model computed (a NaN loss, the norm of a tensor holding a NaN), not an absence."""
        out = np.full(len(keys), np.nan)
        has = np.zeros(len(keys), bool)
        if not keys:
            return out, has
        if is_monitor_field(field):
            return self._monitor_values(step, keys, out, has)
        s = self.session
        table = s.steps.get(step)
        if table is not None:
            rows = self._map(("t", id(table.keys), id(keys), len(keys)), keys, table.index.get)
            ok = rows >= 0
            if table.unsupported:
                ok &= ~np.isin(rows, list(table.unsupported))
            v = table.values[rows[ok]]
            out[ok] = v[:, _NONFINITE].sum(axis=1) if field == "nonfinite_count" else v[:, COL[field]]
            return out, ok
        h = s.history
        if step in h.steps and field in HISTORY_FIELDS:
            ids, vals = h.steps[step]
            kid = self._map(("k", id(keys), len(keys), len(h._ids)), keys, h._ids.get)
            inv = self._rows.get(("i", id(ids)))
            if inv is None:
                inv = np.full(len(h._ids) + 1, -1, np.int64)
                inv[ids] = np.arange(len(ids))
                self._rows[("i", id(ids))] = inv
            pos = np.where((kid >= 0) & (kid < len(inv)), inv[np.clip(kid, 0, len(inv) - 1)], -1)
            ok = pos >= 0
            out[ok] = vals[pos[ok], HISTORY_FIELDS.index(field)]
            has = ok
        return out, has

    def _map(self, ck: Any, keys: list[Key], get: Any) -> np.ndarray:
        got = self._rows.get(ck)
        if got is None:
            if len(self._rows) > 256:
                self._rows.clear()
            got = self._rows[ck] = np.fromiter((-1 if (i := get(k)) is None else i for k in keys), np.int64,
                                               len(keys))
        return got

    def _monitor_values(self, step: int, keys: list[Key], out: np.ndarray,
                        has: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mon = self.monitor
        if mon is None:
            return out, has
        cols = self._map(("m", id(keys), len(keys), len(mon.keys)), keys, mon.column)
        ok = cols >= 0
        got = mon.row_at(step, cols[ok])
        if got is not None:
            out[ok], has[ok] = got
        return out, has
