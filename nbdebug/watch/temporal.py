"""Watchpoints over time: SPIKE, DRIFT and STALL on a session's per-step series, and ODD_RANK's arithmetic.

They sit in the same registry as the 17 conditions (:mod:`nbdebug.watch.registry`), are made with
``dbg.watch(...)``, evaluated at the end of every step (a hit pauses training like any other) and land in
the same hit list. Each watches one ``field`` of every series it selects (:mod:`nbdebug.watch.series`: a
statistic of the selected nodes' output tensors, or a monitor field of the selected monitor series; no
``nodes``: every series with that field):

* ``SPIKE`` (``field="norm", factor=10, window=50``): ``|value| > factor × |median|`` of the series' previous
  ``window`` values (a median of 0: any non-zero value);
* ``DRIFT`` (``field="norm", z=6, window=200``): ``|value - mean| / std > z`` against the previous ``window``
  values (``std`` floored at ``1e-6 × |mean|``, so an exactly constant series that moves fires);
* ``STALL`` (``field="update_ratio", below=1e-8, steps=20``): the value stayed below ``below`` for ``steps``
  consecutive steps (fires on each step from then on, until it rises again);
* ``ODD_RANK`` (``field="norm", z=6``) is a job's (:mod:`nbdebug.job.odd_rank`): :func:`rank_outliers`.

**Warm-up**: SPIKE and DRIFT check a series once its window holds :func:`min_history` values — ``max(3,
window // 5)``: 10 for SPIKE's default window of 50, 40 for DRIFT's 200; never before. Absent values are
skipped; non-finite ones are checked but kept out of the baseline: ±Inf and a NaN the model computed (a NaN
loss, the norm of a tensor holding a NaN) fire SPIKE and DRIFT — no band holds them — and end a STALL.

**Cost**: one rolling buffer ``window × series`` per watchpoint; a step is a few numpy operations over all its
series together (no per-series Python loop; SPIKE's median is one ``np.median`` over the buffer).

A hit's :class:`Band` (``engine.bands[(watchpoint, node, slot, step)]``, and in words in the hit's ``advice``)
gives the baseline — median, mean, std over the window — against the value, and ``since``: the step where the
series first left its band (for SPIKE ``|value| > √factor × |median|``, for DRIFT ``|z| > z / 2``, for STALL the
first step below) in the run of steps that ends with the hit.

>>> import numpy as np
>>> from nbdebug.session.session import Session
>>> from nbdebug.session.monitor import Monitor
>>> from nbdebug.watch.watchpoints import WatchManager
>>> s = Session(framework="none"); s.monitor = Monitor()
>>> wm = WatchManager(s)
>>> wp = wm.watch("SPIKE", "Run", field="loss", factor=10, window=20)
>>> hits = []
>>> for step in range(30):
...     s.monitor.record(step, [("Run", "loss")], np.array([500.0 if step == 25 else 5.0 + step % 3]))
...     hits += wm.temporal.check(wm.watchpoints.values(), step)
>>> [(h.step, h.node, h.slot, h.hits[0].param) for h in hits]
[(25, 'Run', 'loss', 'factor')]
>>> wm.temporal.bands[(wp.id, "Run", "loss", 25)].median
6.0
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from .firing import Hit
from .registry import is_temporal
from .series import Key, SeriesReader

#: DRIFT's std floor relative to |mean|, and ODD_RANK's MAD floor relative to |median|
STD_FLOOR = 1e-6
MAD_FLOOR = 1e-4


#: what to look at when a temporal watchpoint fires
ADVICE = {
    "SPIKE": "A sudden jump: look at this step's data batch, the learning rate (a schedule step or warm-up end) "
             "and the loss scale; an update-ratio spike often announces a loss spike a few steps later.",
    "DRIFT": "The series left its recent range: a learning rate too high for the phase, growing weights or "
             "activations (missing normalization or weight decay), or a data distribution shift.",
    "STALL": "The parameter stopped learning: a frozen layer (requires_grad=False), a param group with lr 0, "
             "a parameter missing from the optimizer, or vanishing gradients.",
    "ODD_RANK": "One rank differs from the others at the same step: its data shard, its hardware (a bad "
                "device or link), or a rank-dependent code path.",
}


def min_history(window: int) -> int:
    """Values a window must hold before SPIKE/DRIFT check a series (the warm-up).

    >>> min_history(50), min_history(200), min_history(5)
    (10, 40, 3)
    """
    return max(3, int(window) // 5)


class Band(NamedTuple):
    """What a temporal hit is measured against: the value, the baseline over ``n`` values, and ``since``."""

    value: float
    median: float
    mean: float
    std: float
    n: int
    since: int

    def describe(self) -> str:
        """The band in words.

        >>> Band(50.0, 5.0, 5.1, 0.5, 20, 25).describe()
        'value 50 against median 5, mean 5.1, std 0.5 over the previous 20 steps; left its band at step 25'
        """
        return (f"value {self.value:.4g} against median {self.median:.4g}, mean {self.mean:.4g}, std "
                f"{self.std:.4g} over the previous {self.n} steps; left its band at step {self.since}")


class _State:
    """One watchpoint's rolling state: a ``window × series`` ring of past values plus per-series counters."""

    def __init__(self, wp: Any, window: int) -> None:
        self.version, self.field, self.window = wp.version, wp.params["field"], window
        self.col: dict[Key, int] = {}
        self.keys: list[Key] = []
        self.buf = np.full((window, 0), np.nan)
        self.pos = 0
        self.last = -1
        self.cnt = np.zeros(0, np.int64)      # finite values in the ring
        self.s1 = np.zeros(0)                 # their sum and sum of squares (DRIFT)
        self.s2 = np.zeros(0)
        self.run = np.zeros(0, np.int64)      # STALL: consecutive steps below
        self.since = np.zeros(0, np.int64)    # the step the current out-of-band run began (-1: in band)
        self._last_keys: Any = None
        self._last_cols: np.ndarray | None = None

    def columns(self, keys: list[Key]) -> np.ndarray:
        if keys is self._last_keys and self._last_cols is not None and len(self._last_cols) == len(keys):
            return self._last_cols
        new = [k for k in keys if k not in self.col]
        if new:
            for k in new:
                self.col[k] = len(self.keys)
                self.keys.append(k)
            grow = len(new)
            self.buf = np.concatenate([self.buf, np.full((self.window, grow), np.nan)], axis=1)
            self.cnt = np.concatenate([self.cnt, np.zeros(grow, np.int64)])
            self.s1, self.s2 = np.concatenate([self.s1, np.zeros(grow)]), np.concatenate([self.s2, np.zeros(grow)])
            self.run = np.concatenate([self.run, np.zeros(grow, np.int64)])
            self.since = np.concatenate([self.since, np.full(grow, -1, np.int64)])
        cols = np.fromiter((self.col[k] for k in keys), np.int64, len(keys))
        self._last_keys, self._last_cols = keys, cols
        return cols

    def push(self, row: np.ndarray) -> None:
        """Put this step's row (finite values; NaN elsewhere) into the ring, dropping the oldest."""
        old = self.buf[self.pos]
        was = ~np.isnan(old)
        if was.any():
            self.cnt -= was
            self.s1 -= np.where(was, old, 0.0)
            self.s2 -= np.where(was, old * old, 0.0)
        now = ~np.isnan(row)
        self.cnt += now
        r0 = np.where(now, row, 0.0)
        self.s1 += r0
        self.s2 += r0 * r0
        self.buf[self.pos] = row
        self.pos = (self.pos + 1) % self.window


def _baseline(st: _State) -> tuple[np.ndarray, np.ndarray]:
    """Rolling mean and std (ddof 0) of every series over its ring."""
    n = np.maximum(st.cnt, 1)
    mean = st.s1 / n
    std = np.sqrt(np.maximum(st.s2 / n - mean * mean, 0.0))
    return mean, std


def _median(st: _State) -> np.ndarray:
    rows = np.ascontiguousarray(st.buf.T)  # series × window: the partition runs along contiguous memory
    w = st.window
    if (st.cnt == w).all():  # every ring full (the steady state): one partition, no NaN handling
        if w % 2:
            return np.partition(rows, w // 2, axis=1)[:, w // 2]
        part = np.partition(rows, (w // 2 - 1, w // 2), axis=1)
        return (part[:, w // 2 - 1] + part[:, w // 2]) / 2  # np.median's value: the mean of the middle two
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a series with no value yet: NaN median
        return np.nanmedian(rows, axis=1)


def _evaluate(cond: str, p: dict[str, Any], st: _State, row: np.ndarray, step: int,
              computed_nan: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
    """Which series fire at ``step`` (a mask), and what each fired against: ``(actual, threshold, median)``.
    ``computed_nan`` marks the NaNs of ``row`` the model computed: they fire SPIKE and DRIFT (once warmed up)
    and break a STALL; the other NaNs are absent values."""
    nan = np.zeros(len(row), bool) if computed_nan is None else computed_nan
    present = ~np.isnan(row) | nan
    if cond == "STALL":
        below = present & (row < p["below"])
        st.run = np.where(present, np.where(below, st.run + 1, 0), st.run)
        st.since = np.where(below & (st.run == 1), step, np.where(present & ~below, -1, st.since))
        return st.run >= p["steps"], (row, p["below"], None)
    ready = present & (st.cnt >= min_history(st.window))
    if cond == "SPIKE":
        med = _median(st) if ready.any() else np.full(len(row), np.nan)
        amed, arow = np.abs(med), np.abs(row)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(amed > 0, arow / amed, np.where(arow > 0, np.inf, 0.0))
        fired = ready & ((ratio > p["factor"]) | nan)
        soft = ready & ((ratio > math.sqrt(p["factor"])) | nan)
        actual, threshold = ratio, p["factor"]
    else:  # DRIFT
        mean, std = _baseline(st)
        scale = np.maximum(std, np.maximum(STD_FLOOR * np.abs(mean), 1e-300))
        with np.errstate(invalid="ignore", over="ignore"):
            z = np.abs(row - mean) / scale
        fired = ready & ((z > p["z"]) | nan)
        soft = ready & ((z > p["z"] / 2) | nan)
        actual, threshold, med = z, p["z"], None
    st.since = np.where(soft, np.where(st.since < 0, step, st.since), -1)
    return fired, (actual, threshold, med)


class TemporalEngine:
    """Evaluates a session's SPIKE/DRIFT/STALL watchpoints step by step (see the module docstring)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.reader = SeriesReader(session)
        self._states: dict[int, _State] = {}
        #: the band of every temporal hit: ``(watchpoint, node, slot, step) -> Band``
        self.bands: dict[tuple[int, str, str, int], Band] = {}

    def check(self, watchpoints: Iterable[Any], step: int) -> list[Any]:
        """The hits of ``step``: incremental when ``step`` follows what a watchpoint saw, else (a new or
        changed watchpoint, a step seen before) replayed over the kept history up to ``step``."""
        out: list[Any] = []
        for wp in list(watchpoints):
            if not wp.enabled or not is_temporal(wp.condition) or wp.condition == "ODD_RANK":
                continue
            st = self._states.get(wp.id)
            if st is None or st.version != wp.version or step <= st.last:
                st = self._replay(wp, until=step - 1)
            if self.reader.has_step(st.field, step):
                out.extend(self._feed(wp, st, step))
        return out

    def replay(self, watchpoints: Iterable[Any]) -> list[Any]:
        """Every temporal hit over the whole kept history (``recheck``), each watchpoint from scratch."""
        out: list[Any] = []
        for wp in list(watchpoints):
            if wp.enabled and is_temporal(wp.condition) and wp.condition != "ODD_RANK":
                self._replay(wp, until=None, collect=out)
        return out

    def _replay(self, wp: Any, until: int | None, collect: list[Any] | None = None) -> _State:
        st = self._states[wp.id] = _State(wp, int(wp.params.get("window", 2)))
        for s in self.reader.steps(st.field):
            if until is not None and s > until:
                break
            found = self._feed(wp, st, s)
            if collect is not None:
                collect.extend(found)
        return st

    def _feed(self, wp: Any, st: _State, step: int) -> list[Any]:
        keys = self.reader.keys(wp, st.field, step)
        cols = st.columns(keys)
        row = np.full(len(st.keys), np.nan)
        computed_nan = np.zeros(len(st.keys), bool)  # a NaN the model computed (not an absent value)
        vals, has = self.reader.values_present(step, st.field, keys)
        row[cols] = vals
        computed_nan[cols] = has & np.isnan(vals)
        fired, (actual, threshold, med) = _evaluate(wp.condition, wp.params, st, row, step, computed_nan)
        out = self._records(wp, st, step, row, np.flatnonzero(fired), actual, threshold, med) if fired.any() else []
        st.push(np.where(np.isfinite(row), row, np.nan))
        st.last = step
        return out

    def _records(self, wp: Any, st: _State, step: int, row: np.ndarray, idx: np.ndarray, actual: Any,
                 threshold: float, med: Any) -> list[Any]:
        from .watchpoints import HitRecord

        mean, std = _baseline(st)
        if med is None and wp.condition != "STALL":
            med = _median(st)
        param = {"SPIKE": "factor", "DRIFT": "z", "STALL": "below"}[wp.condition]
        nodes = self.session.graph.nodes
        out = []
        for i in idx.tolist():
            name, slot = st.keys[i]
            since = int(st.since[i]) if st.since[i] >= 0 else step
            band = Band(float(row[i]), float(med[i]) if med is not None else float("nan"), float(mean[i]),
                        float(std[i]), int(st.cnt[i]), since)
            self.bands[(wp.id, name, slot, step)] = band
            node = nodes.get(name)
            text = f"{band.describe()}. {ADVICE[wp.condition]}"
            out.append(HitRecord(wp.id, wp.condition, name, slot, step, node.order if node is not None else 1 << 30,
                                 (Hit(param, float(threshold), float(actual[i] if wp.condition != "STALL"
                                                                      else row[i])),), None, (), text))
        return out


def rank_outliers(values: np.ndarray, z: float, floor: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ODD_RANK on one step: ``values`` is ranks × series; returns ``(fired mask, |z| per rank and series,
    the median across ranks)`` where ``|z| = |value - median| / (1.4826 × MAD)`` — the MAD floored at
    ``1e-4 × |median|``, so ranks that agree exactly (allreduced gradients) fire only on a real departure, and
    at ``floor`` (per series; NaN: none) — the job passes the median of the previous steps' MADs, since a few
    ranks' MAD alone is often tiny by chance (4 ranks of clean Gaussian values: |z| > 6 on 6.6% of series).
    Needs 3 ranks with a value; NaN values are left out.

    >>> v = np.array([[1.0, 5.0], [1.1, 5.0], [0.9, 5.0], [1000.0, 5.0]])
    >>> fired, zs, med = rank_outliers(v, 6)
    >>> np.argwhere(fired).tolist(), med.tolist()
    ([[3, 0]], [1.05, 5.0])
    """
    v = np.asarray(values, dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(v, axis=0)
        mad = np.nanmedian(np.abs(v - med), axis=0)
    scale = np.maximum(1.4826 * mad, np.maximum(MAD_FLOOR * np.abs(med), 1e-300))
    if floor is not None:
        scale = np.fmax(scale, 1.4826 * np.asarray(floor, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):
        zs = np.abs(v - med) / scale
    enough = (~np.isnan(v)).sum(axis=0) >= 3
    fired = enough & ~np.isnan(v) & (zs > z)
    return fired, zs, med
