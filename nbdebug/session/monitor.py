r"""Per-step scalar series for the whole run (the monitor level's data, recorded at every level).

A :class:`Monitor` keeps one float32 column per series — a ``(name, field)`` pair such as
``("Parameter.fc1.weight", "update_ratio")``, ``("Module.fc1.Linear", "output_norm")`` or
``("Run", "loss")`` — and one row per step. It is bounded for a run of any length:

- the last ``horizon`` steps (default 10,000) are kept at full resolution, in a ring;
- older steps are folded into blocks of ``block`` steps (default 10), each keeping the block's **min and
  max** per series (a spike stays visible; its exact step is within the block).

So 100,000 steps of ~1,400 series (a GPT-2-small's modules and parameters) take about
``1,400 × (10,000 × 4 + 9,000 × 8)`` bytes ≈ 157 MB. Finite values beyond float32's range are clamped to
its largest finite value (never ``inf`` from a cast) and the series is listed in :attr:`Monitor.clamped`; a ±Inf
the model computed stays ±Inf (``TO`` fires on it).

Series names and fields (see :data:`FIELDS`): a module ``Module.{path}.{Class}`` (PyTorch) or
``Cell.{path}.{Class}`` (MindSpore) has ``output_norm``, ``output_max_abs``, ``grad_input_norm``; a
parameter ``Parameter.{path}`` has ``weight_norm``, ``grad_norm``, ``update_norm``, ``update_ratio``
(``|Δw| / |w|``) and the optimizer's moments ``exp_avg_norm``, ``exp_avg_sq_norm`` (Adam) or
``momentum_norm`` (SGD); the run, ``Run``, has ``loss``, ``grad_norm_total`` and ``loss_scale``.

>>> import numpy as np
>>> m = Monitor(horizon=4, block=2)
>>> for step in range(7):
...     m.record(step, [("Run", "loss"), ("Parameter.w", "grad_norm")], np.array([10.0 - step, step]))
>>> steps, values = m.series("Run", "loss")
>>> steps.tolist(), values.tolist()
([1, 3, 4, 5, 6], [10.0, 8.0, 6.0, 5.0, 4.0])
>>> m.series("Run", "loss", reduce="min")[1].tolist()
[9.0, 7.0, 6.0, 5.0, 4.0]
>>> m.value(5, "Parameter.w", "grad_norm"), m.value(0, "Parameter.w", "grad_norm")
(5.0, None)
>>> m.last_step, len(m)
(6, 7)
>>> steps, values = m.columns([("Parameter.w", "grad_norm"), ("Run", "nothing")])
>>> steps.tolist(), values[:, 0].tolist(), bool(np.isnan(values[:, 1]).all())
([1, 3, 4, 5, 6], [1.0, 3.0, 4.0, 5.0, 6.0], True)
>>> m.record(7, [("Run", "loss")], np.array([np.nan]))   # a NaN the model computed is a value
>>> m.value(7, "Run", "loss"), m.value(7, "Parameter.w", "grad_norm"), m.nonfinite(7)
(nan, None, {('Run', 'loss'): nan})
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

#: the fields a series may have, by what it describes
FIELDS: dict[str, tuple[str, ...]] = {
    "module": ("output_norm", "output_max_abs", "grad_input_norm"),
    "parameter": ("weight_norm", "grad_norm", "update_norm", "update_ratio", "exp_avg_norm", "exp_avg_sq_norm",
                  "momentum_norm"),
    "run": ("loss", "grad_norm_total", "loss_scale"),
}
#: every monitor field name
ALL_FIELDS: frozenset[str] = frozenset(f for fs in FIELDS.values() for f in fs)
#: the series name of run-wide values
RUN = "Run"

_F32_MAX = float(np.finfo(np.float32).max)

Key = tuple[str, str]


class Monitor:
    """Bounded per-step series: full resolution for the last ``horizon`` steps, min/max blocks before."""

    def __init__(self, horizon: int = 10_000, block: int = 10) -> None:
        if horizon < 2 * block or block < 1:
            raise ValueError(f"horizon must be >= 2 * block >= 2, got horizon={horizon}, block={block}")
        self.horizon, self.block = int(horizon), int(block)
        self._col: dict[Key, int] = {}
        self.keys: list[Key] = []
        self._cols = 16
        self._ring = np.full((self.horizon, self._cols), np.nan, np.float32)
        self._ring_steps = np.zeros(self.horizon, np.int64)
        #: which cells hold a value (a NaN the model computed is a value; a series absent at a step is not)
        self._ring_has = np.zeros((self.horizon, self._cols), bool)
        self._head = 0   # ring index of the oldest full-resolution row
        self._count = 0  # full-resolution rows held
        self._blocks = 0
        self._dec_min = np.full((0, self._cols), np.nan, np.float32)
        self._dec_max = np.full((0, self._cols), np.nan, np.float32)
        self._dec_steps = np.zeros((0, 2), np.int64)  # first, last step of each block
        self._dec_has = np.zeros((0, self._cols), bool)
        self._cache: tuple[int, np.ndarray] | None = None  # (id of the last key list, its columns)
        self._cache_keys: Sequence[Key] | None = None
        #: series that had a value beyond float32's range (clamped to ±3.4e38)
        self.clamped: set[Key] = set()
        self.last_step: int | None = None
        self._total = 0
        #: one writer (the training thread) and readers elsewhere (the remote agent's thread): a reader sees
        #: whole rows, its steps and values from one moment
        self._lock = threading.Lock()

    def __len__(self) -> int:
        """Steps recorded (full resolution and folded)."""
        return self._total

    # -- writing ------------------------------------------------------------------------------------
    def record(self, step: int, keys: Sequence[Key], values: np.ndarray, present: np.ndarray | None = None) -> None:
        """One step's row: ``values[i]`` is series ``keys[i]`` (a series not in ``keys`` is absent at this step;
        a NaN in ``values`` is a value: the model computed it). ``present``: a mask over ``keys`` of the series
        that have a value this step (default: all of them).

        Steps must increase; passing the same ``keys`` object every step makes this a few array ops."""
        with self._lock:
            self._record(step, keys, values, present)

    def _record(self, step: int, keys: Sequence[Key], values: np.ndarray, present: np.ndarray | None) -> None:
        if self.last_step is not None and step <= self.last_step:
            raise ValueError(f"monitor steps must increase: {step} after {self.last_step}")
        cols = self._columns(keys)
        vals = np.asarray(values, dtype=np.float64)
        big = np.abs(vals) > _F32_MAX
        if big.any():  # a finite value beyond float32's range is clamped (no false Inf); a true ±Inf stays one
            big &= np.isfinite(vals)
            self.clamped.update(keys[i] for i in np.flatnonzero(big))
            vals = np.where(big, np.clip(vals, -_F32_MAX, _F32_MAX), vals)
        if self._count == self.horizon:
            self._fold()
        row = (self._head + self._count) % self.horizon
        self._ring[row] = np.nan
        self._ring[row, cols] = vals
        self._ring_has[row] = False
        self._ring_has[row, cols] = True if present is None else np.asarray(present, bool)
        self._ring_steps[row] = step
        self._count += 1
        self._total += 1
        self.last_step = step

    def _columns(self, keys: Sequence[Key]) -> np.ndarray:
        if self._cache is not None and self._cache_keys is keys and self._cache[0] == len(keys):
            return self._cache[1]
        for k in keys:
            if k not in self._col:
                self._col[k] = len(self.keys)
                self.keys.append(k)
        if len(self.keys) > self._cols:
            self._widen(-(-len(self.keys) // 64) * 64)  # a little slack, not doubling: bounded memory
        cols = np.fromiter((self._col[k] for k in keys), np.int64, len(keys))
        self._cache, self._cache_keys = (len(keys), cols), keys
        return cols

    def _widen(self, cols: int) -> None:
        def wider(a: np.ndarray) -> np.ndarray:
            out = np.full((a.shape[0], cols), np.nan, np.float32) if a.dtype != bool else \
                np.zeros((a.shape[0], cols), bool)
            out[:, :a.shape[1]] = a
            return out
        self._ring, self._dec_min, self._dec_max = wider(self._ring), wider(self._dec_min), wider(self._dec_max)
        self._ring_has, self._dec_has = wider(self._ring_has), wider(self._dec_has)
        self._cols = cols

    def _fold(self) -> None:
        """Fold the oldest ``block`` full-resolution rows into one min/max block (NaN when a value in the
        block was NaN: it stays visible)."""
        idx = (self._head + np.arange(self.block)) % self.horizon
        rows, has = self._ring[idx], self._ring_has[idx]
        if self._blocks == self._dec_min.shape[0]:
            grow = max(64, self._blocks // 8)
            pad = np.full((grow, self._cols), np.nan, np.float32)
            self._dec_min = np.concatenate([self._dec_min, pad])
            self._dec_max = np.concatenate([self._dec_max, pad.copy()])
            self._dec_steps = np.concatenate([self._dec_steps, np.zeros((grow, 2), np.int64)])
            self._dec_has = np.concatenate([self._dec_has, np.zeros((grow, self._cols), bool)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: the series was absent
            self._dec_min[self._blocks] = np.nanmin(rows, axis=0)
            self._dec_max[self._blocks] = np.nanmax(rows, axis=0)
        nan_value = (np.isnan(rows) & has).any(axis=0)
        self._dec_min[self._blocks, nan_value] = self._dec_max[self._blocks, nan_value] = np.nan
        self._dec_has[self._blocks] = has.any(axis=0)
        self._dec_steps[self._blocks] = self._ring_steps[idx[0]], self._ring_steps[idx[-1]]
        self._blocks += 1
        self._head = (self._head + self.block) % self.horizon
        self._count -= self.block

    # -- reading ------------------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        return key in self._col

    def names(self, field: str | None = None) -> list[str]:
        """Series names (those with ``field`` when given), in the order first recorded."""
        seen: dict[str, None] = {}
        for n, f in self.keys:
            if field is None or f == field:
                seen.setdefault(n, None)
        return list(seen)

    def fields(self, name: str) -> list[str]:
        """The fields recorded for series ``name``."""
        return [f for n, f in self.keys if n == name]

    def _order(self) -> np.ndarray:
        """Ring indices of the full-resolution rows, oldest first."""
        return (self._head + np.arange(self._count)) % self.horizon

    def _position(self, step: int) -> int | None:
        """The ring index of ``step``'s full-resolution row (None when folded or not recorded)."""
        if self._count == 0:
            return None
        idx = self._order()
        steps = self._ring_steps[idx]
        i = int(np.searchsorted(steps, step))
        return int(idx[i]) if i < len(steps) and steps[i] == step else None

    def column(self, key: Key) -> int | None:
        """Series ``key``'s column (None when never recorded); a column, once given, stays the series' for
        the run."""
        return self._col.get(key)

    def row_at(self, step: int, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """``(values, has)`` of columns ``cols`` in ``step``'s full-resolution row, read at one moment (copies);
        None when that step is folded or not recorded. The newest step is found without a search."""
        with self._lock:
            if self._count == 0:
                return None
            newest = (self._head + self._count - 1) % self.horizon
            pos = newest if self._ring_steps[newest] == step else self._position(step)
            if pos is None:
                return None
            return self._ring[pos, cols], self._ring_has[pos, cols]

    def recent(self) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, rows)`` of the full-resolution part, oldest first (rows: steps × series, float32; a copy of
        every series — :meth:`columns` reads a few)."""
        with self._lock:
            idx = self._order()
            return self._ring_steps[idx], self._ring[idx][:, :len(self.keys)]

    def full_rows(self) -> tuple[list[Key], np.ndarray, np.ndarray, np.ndarray]:
        """``(keys, steps, values, has)`` of the full-resolution part (values and has: steps × keys), all read at
        one moment — a row recorded meanwhile, and a series it names first, are in all or none of them: what a
        reconnected notebook is sent."""
        with self._lock:
            idx, n = self._order(), len(self.keys)
            return (list(self.keys), self._ring_steps[idx], self._ring[idx][:, :n],
                    self._ring_has[idx][:, :n])

    def columns(self, keys: Sequence[Key], reduce: str = "max") -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of several series over the whole run: values is steps × len(keys), float32, NaN
        where a series has no value (or the model computed NaN: :meth:`present` tells which); a folded block
        is one row at its last step (its max or min)."""
        return self._gather(keys, "_dec_max" if reduce == "max" else "_dec_min", "_ring", np.nan)

    def present(self, keys: Sequence[Key]) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, mask)`` matching :meth:`columns`: True where a series has a value (NaN included)."""
        return self._gather(keys, "_dec_has", "_ring_has", False)

    def _gather(self, keys: Sequence[Key], dec: str, ring: str, empty: Any) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:  # the arrays named, read under the lock (a fold or a widening replaces them)
            return self._gather_now(keys, getattr(self, dec), getattr(self, ring), empty)

    def _gather_now(self, keys: Sequence[Key], dec: np.ndarray, ring: np.ndarray, empty: Any) -> tuple[np.ndarray,
                                                                                                        np.ndarray]:
        cols = np.fromiter((self._col.get(k, -1) for k in keys), np.int64, len(keys))
        known = cols >= 0
        idx = self._order()
        steps = np.concatenate([self._dec_steps[:self._blocks, 1], self._ring_steps[idx]])
        out = np.full((len(steps), len(keys)), empty, ring.dtype)
        if known.any():
            picked = cols[known]
            out[:self._blocks, known] = dec[:self._blocks][:, picked]
            out[self._blocks:, known] = ring[np.ix_(idx, picked)]
        return steps, out

    def series(self, name: str, field: str, reduce: str = "max") -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)`` of one series over the steps that have it (a NaN the model computed stays, as NaN).
        A folded block is one point at its last step, its max (``reduce="max"``) or min (``"min"``); unknown
        series give empty arrays."""
        if (name, field) not in self._col:
            return np.zeros(0, np.int64), np.zeros(0, np.float64)
        steps, vals = self.columns([(name, field)], reduce)
        keep = self.present([(name, field)])[1][:, 0]
        return steps[keep], vals[keep, 0].astype(np.float64)

    def value(self, step: int, name: str, field: str) -> float | None:
        """The full-resolution value of a series at ``step`` (None when not recorded there, or folded)."""
        col = self._col.get((name, field))
        got = self.row_at(step, np.array([col])) if col is not None else None
        return float(got[0][0]) if got is not None and got[1][0] else None

    def row(self, step: int) -> dict[Key, float]:
        """Every series' full-resolution value at ``step`` ({} when folded or not recorded)."""
        with self._lock:
            pos = self._position(step)
            if pos is None:
                return {}
            n = len(self.keys)
            vals, has = self._ring[pos, :n].copy(), self._ring_has[pos, :n].copy()
        return {k: float(v) for k, v, h in zip(self.keys, vals, has, strict=True) if h}

    def nonfinite(self, step: int) -> dict[Key, float]:
        """The series whose value at ``step`` is NaN or ±Inf ({} when none, folded or not recorded)."""
        keys = list(self.keys)  # columns are only ever added: these stay valid
        got = self.row_at(step, np.arange(len(keys)))
        if got is None:
            return {}
        vals, has = got
        return {keys[i]: float(vals[i]) for i in np.flatnonzero(~np.isfinite(vals) & has).tolist()}

    @property
    def nbytes(self) -> int:
        """Bytes held by the series (allocated capacity)."""
        return (self._ring.nbytes + self._ring_steps.nbytes + self._dec_min.nbytes + self._dec_max.nbytes
                + self._dec_steps.nbytes + self._ring_has.nbytes + self._dec_has.nbytes)
