r"""The run timeline's data (pure numpy): per-step series of a run, decimated for a view, with their bands.

A timeline shows one *field* (a monitor field such as ``output_norm`` or ``update_ratio``, or a statistic of
the per-tensor history such as ``norm``) as a heatmap of rows × steps, and one selected row as a line
chart with its band and the hits on it. Rows follow the model's module tree (``transformer.h.0.attn``):
a collapsed row shows the largest value of everything under it.

Series come from the session's :class:`~nbdebug.session.monitor.Monitor` (``session.monitor``; series
``Module.{path}.{Class}``, ``Parameter.{path}``, ``Run``) when it holds the field, else from the per-tensor
statistics (:class:`~nbdebug.session.history.History` and the window's tables: each forward module's
``output.0``). :func:`decimate` reduces a series to at most one column per pixel: the **exact** min and max
of each column's steps, so a one-step spike survives any zoom.

>>> import numpy as np
>>> cols = decimate(np.arange(10), np.arange(10.0) * 2, 0, 9, 4)
>>> cols.first.tolist(), cols.vmin.tolist(), cols.vmax.tolist()
([0, 2, 5, 7], [0.0, 4.0, 10.0, 14.0], [2.0, 8.0, 12.0, 18.0])
>>> band = spike_band(np.array([1.0, 1, 1, 1, 50]), window=3, factor=10)
>>> band.hi.tolist()[3:], band.mid.tolist()[3:]
([10.0, 10.0], [1.0, 1.0])
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..frameworks.registry import module_prefixes

#: the monitor's fields (``nbdebug.session.monitor.FIELDS``) by what they describe; repeated here so the UI
#: can list them before the monitor exists (an older session)
MONITOR_FIELDS: dict[str, tuple[str, ...]] = {
    "module": ("output_norm", "output_max_abs", "grad_input_norm"),
    "parameter": ("weight_norm", "grad_norm", "update_norm", "update_ratio", "exp_avg_norm", "exp_avg_sq_norm",
                  "momentum_norm"),
    "run": ("loss", "grad_norm_total", "loss_scale"),
}
#: statistics of the per-tensor history a timeline can show (a forward module's ``output.0``)
HISTORY_FIELDS: tuple[str, ...] = ("norm", "max", "min", "mean", "nonfinite_count")
RUN = "Run"
_HEADS = "|".join(map(re.escape, module_prefixes()))  # Module|Cell
_MODULE = re.compile(rf"^(?:{_HEADS})\.(.+)\.([^.]+)$")
_MODULE_NODE = re.compile(rf"^(?:{_HEADS})\.(.+)\.([^.]+)\.forward\.\d+$")


#: bits of :attr:`Columns.flags`: a value the model computed in the column was NaN, +Inf or -Inf
NAN, POS_INF, NEG_INF = 1, 2, 4


@dataclass
class Columns:
    """A series decimated to columns: column ``i`` covers steps ``first[i]..last[i]`` (NaN: no step there).
    ``flags[i]``: :data:`NAN` | :data:`POS_INF` | :data:`NEG_INF` of the non-finite values computed there (a
    series absent at a step has no value, no flag: a gap)."""

    first: np.ndarray
    last: np.ndarray
    vmin: np.ndarray
    vmax: np.ndarray
    flags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))

    def __post_init__(self) -> None:
        if len(self.flags) != len(self.first):
            self.flags = np.zeros(len(self.first), np.uint8)


def nonfinite_flags(values: np.ndarray) -> np.ndarray:
    """The :data:`NAN`/:data:`POS_INF`/:data:`NEG_INF` bit of each value (0: finite).

    >>> nonfinite_flags(np.array([1.0, np.nan, np.inf, -np.inf])).tolist()
    [0, 1, 2, 4]
    """
    v = np.asarray(values, np.float64)
    return (np.isnan(v) * NAN + (v == np.inf) * POS_INF + (v == -np.inf) * NEG_INF).astype(np.uint8)


def column_edges(lo: int, hi: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """The step ranges of the columns of ``lo..hi`` at ``width`` columns at most (one per step when they fit).

    >>> [a.tolist() for a in column_edges(0, 9, 4)]
    [[0, 2, 5, 7], [1, 4, 6, 9]]
    """
    n = hi - lo + 1
    if n <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    width = max(1, min(int(width), n))
    i = np.arange(width + 1, dtype=np.int64)
    edges = lo + (i * n) // width
    return edges[:-1], edges[1:] - 1




def decimate(steps: np.ndarray, values: np.ndarray, lo: int, hi: int, width: int,
             vmin_values: np.ndarray | None = None) -> Columns:
    """Exact min and max of ``values`` per column of ``lo..hi`` (``steps`` ascending: the steps that have a
    value; NaN ignored by min/max but flagged, as ±Inf, in ``flags``).
    ``vmin_values``: where the minima come from when they differ (a monitor's folded blocks keep both)."""
    first, last = column_edges(lo, hi, width)
    ncols = len(first)
    vmin = np.full(ncols, np.nan, np.float64)
    vmax = np.full(ncols, np.nan, np.float64)
    flags = np.zeros(ncols, np.uint8)
    steps = np.asarray(steps)
    for arr in (values, vmin_values):
        if arr is None or not ncols:
            continue
        bits = nonfinite_flags(arr)
        keep = (steps >= lo) & (steps <= hi) & (bits > 0)
        if keep.any():
            np.bitwise_or.at(flags, np.searchsorted(first, steps[keep], side="right") - 1, bits[keep])
    for arr, out, reduce in ((values, vmax, np.maximum), (values if vmin_values is None else vmin_values, vmin,
                                                          np.minimum)):
        arr = np.asarray(arr, np.float64)
        keep = (steps >= lo) & (steps <= hi) & ~np.isnan(arr)
        if not keep.any() or not ncols:
            continue
        b = np.searchsorted(first, steps[keep], side="right") - 1
        v = arr[keep]
        starts = np.flatnonzero(np.r_[True, b[1:] != b[:-1]])
        out[b[starts]] = reduce.reduceat(v, starts)
    return Columns(first, last, vmin, vmax, flags)


# -- bands (the temporal watchpoints' definitions) --------------------------------------------------------
@dataclass
class Band:
    """Per step: the baseline ``mid`` and the band ``lo..hi`` computed from the *previous* ``window`` steps
    (NaN until ``window`` steps are there)."""

    kind: str
    mid: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    params: dict[str, float] = field(default_factory=dict)

    def outside(self, values: np.ndarray) -> np.ndarray:
        """Which values left the band."""
        with np.errstate(invalid="ignore"):
            return (values > self.hi) | (values < self.lo)


def _previous_windows(values: np.ndarray, window: int) -> np.ndarray | None:
    """Row ``i`` (for ``i >= window``): the ``window`` values before ``i``."""
    if len(values) <= window or window < 1:
        return None
    return np.lib.stride_tricks.sliding_window_view(values, window)[:-1]


def spike_band(values: np.ndarray, window: int = 50, factor: float = 10.0) -> Band:
    """SPIKE: a value above ``factor`` × the median of the previous ``window`` steps left its band."""
    values = np.asarray(values, np.float64)
    mid = np.full(len(values), np.nan)
    win = _previous_windows(values, window)
    if win is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mid[window:] = np.nanmedian(win, axis=1)
    return Band("SPIKE", mid, np.full(len(values), -np.inf), factor * mid,
                {"window": window, "factor": factor})


def drift_band(values: np.ndarray, window: int = 200, z: float = 6.0) -> Band:
    """DRIFT: a value whose z-score against the mean and std of the previous ``window`` steps exceeds ``z``."""
    values = np.asarray(values, np.float64)
    n = len(values)
    mid, sd = np.full(n, np.nan), np.full(n, np.nan)
    win = _previous_windows(values, window)
    if win is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            mid[window:] = np.nanmean(win, axis=1)
            sd[window:] = np.nanstd(win, axis=1)
    return Band("DRIFT", mid, mid - z * sd, mid + z * sd, {"window": window, "z": z})


def band_for(kind: str, values: np.ndarray, window: int, k: float) -> Band | None:
    """``SPIKE`` (k = factor) or ``DRIFT`` (k = z); None for ``none``."""
    if kind == "SPIKE":
        return spike_band(values, window, k)
    if kind == "DRIFT":
        return drift_band(values, window, k)
    return None


# -- rows: the module tree --------------------------------------------------------------------------------
def series_path(name: str) -> str | None:
    """The module path a series (or a forward module node) stands for: ``Module.h.0.attn.Attn`` → ``h.0.attn``,
    ``Parameter.h.0.attn.weight`` → ``h.0.attn.weight``, ``Run`` → ``Run``.

    >>> series_path("Module.h.0.Block"), series_path("Module.h.0.Block.forward.0"), series_path("Parameter.fc.bias")
    ('h.0', 'h.0', 'fc.bias')
    """
    if name == RUN:
        return RUN
    m = _MODULE_NODE.match(name) or _MODULE.match(name)
    if m:
        return m.group(1)
    if name.startswith("Parameter."):
        return name[len("Parameter."):]
    return None


@dataclass
class RowTree:
    """Paths (``a.b.c``) as a tree: the series standing at each path, and each path's children."""

    series: dict[str, str]                      # path -> series name
    children: dict[str, list[str]]              # path ('' = root) -> child paths, in first-seen order
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, names: Iterable[str]) -> RowTree:
        """The tree of the paths of ``names`` (intermediate paths become group rows)."""
        series: dict[str, str] = {}
        children: dict[str, list[str]] = {"": []}
        labels: dict[str, str] = {}
        for name in names:
            path = series_path(name) or name
            series.setdefault(path, name)
            m = _MODULE.match(name)
            if m and "forward" not in name:
                labels[path] = f"{path.rsplit('.', 1)[-1]} ({m.group(2)})"
            parts = path.split(".") if path != RUN else [RUN]
            for i in range(len(parts)):
                p, parent = ".".join(parts[:i + 1]), ".".join(parts[:i])
                if p not in children:
                    children[p] = []
                    children.setdefault(parent, []).append(p)
        return cls(series, children, labels)

    def under(self, path: str) -> list[str]:
        """``path`` and every path below it."""
        out, stack = [], [path]
        while stack:
            p = stack.pop()
            out.append(p)
            stack.extend(self.children.get(p, ()))
        return out

    def visible(self, expanded: Iterable[str]) -> list[tuple[str, int, bool]]:
        """``(path, depth, has_children)`` of the rows shown when ``expanded`` paths are open."""
        opened = set(expanded)
        out: list[tuple[str, int, bool]] = []

        def walk(path: str, depth: int) -> None:
            for child in self.children.get(path, ()):
                kids = self.children.get(child, ())
                out.append((child, depth, bool(kids)))
                if kids and child in opened:
                    walk(child, depth + 1)
        walk("", 0)
        return out

    def label(self, path: str) -> str:
        return self.labels.get(path, path.rsplit(".", 1)[-1] if path != RUN else RUN)


def default_expanded(tree: RowTree, rows: int = 24) -> list[str]:
    """Open the tree breadth-first while the rows shown stay under ``rows``."""
    opened: list[str] = []
    frontier = list(tree.children.get("", ()))
    shown = len(frontier)
    while frontier:
        nxt = []
        for p in frontier:
            kids = tree.children.get(p, ())
            if kids and shown + len(kids) <= rows:
                opened.append(p)
                shown += len(kids)
                nxt.extend(kids)
        frontier = nxt
    return opened


def row_values(tree: RowTree, path: str, expanded: bool, get: Any) -> list[str]:
    """The series names a row's values come from: its own series when it has one and is open or a leaf,
    else the largest of everything under it."""
    own = tree.series.get(path)
    if own is not None and (expanded or not tree.children.get(path)):
        return [own]
    return [tree.series[p] for p in tree.under(path) if p in tree.series]


def nan_reduce(stack: Sequence[np.ndarray], how: str) -> np.ndarray:
    """Element-wise max (or min) of equally long arrays, NaN where all are NaN."""
    if len(stack) == 1:
        return np.asarray(stack[0], np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        arr = np.vstack(stack)
        return np.nanmax(arr, axis=0) if how == "max" else np.nanmin(arr, axis=0)
