r"""Compact statistics of the steps that left the statistics window (what a step timeline needs).

A live :class:`~nbdebug.session.session.Session` keeps full :class:`~nbdebug.session.stats.StatsTable`\ s
for its last ``stats_window`` steps; each older table is reduced to a :class:`History` entry when it
leaves the window, and the table (with its caches) is released.
"""

from __future__ import annotations

import numpy as np

from .stats import FIELDS, StatsTable

#: what :class:`History` keeps per output tensor of a step that left the statistics window
HISTORY_FIELDS: tuple[str, ...] = ("max", "min", "mean", "norm", "nonfinite_count")
#: the largest finite float32: a step with a finite statistic beyond it is kept as float64
_FLOAT32_MAX = float(np.finfo(np.float32).max)


class History:
    """Compact statistics of the steps that left the window: per output tensor (inputs are their producers'
    outputs) ``max, min, mean, norm`` and the NaN+Inf count, as float32 (20 bytes a tensor; the key list is
    shared by steps with the same tensors). A step with a finite statistic beyond float32's range (the
    norm of a large float32 tensor can exceed 3.4e38) keeps its values as float64 instead: every value
    stays what was computed (never turned into ``inf``), and no numpy warning reaches the user's output.

    >>> from nbdebug.session.stats import StatsTable
    >>> t = StatsTable.from_rows([("n", "output.0"), ("n", "input.0")], ["float32"] * 2, [(2,), (2,)],
    ...                          np.array([[1.0, 0, .5, .5, 1, 1, 0, 0, 0, 2]] * 2))
    >>> h = History(); h.add(0, t); h.add(1, t)
    >>> h.get(1, ("n", "output.0"))["norm"], h.get(1, ("n", "input.0"))
    (1.0, None)
    >>> h.series(("n", "output.0"), "max")
    ([0, 1], [1.0, 1.0])
    >>> big = StatsTable.from_rows([("n", "output.0")], ["float32"], [(2,)],
    ...                            np.array([[1.0, 0, .5, .5, 1e39, 1, 0, 0, 0, 2]]))
    >>> h.add(2, big); h.get(2, ("n", "output.0"))["norm"], h.steps[2][1].dtype
    (1e+39, dtype('float64'))
    """

    def __init__(self) -> None:
        self._ids: dict[tuple[str, str], int] = {}
        self.steps: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # step -> (key ids, values)
        self._last_ids: np.ndarray | None = None
        self._last_keys: list[tuple[str, str]] | None = None  # the key list ``_last_rows`` were found in
        self._last_rows: list[int] = []
        self._pos: dict[int, dict[int, int]] = {}  # id(ids array) -> {key id: row}

    def __contains__(self, step: object) -> bool:
        return step in self.steps

    def add(self, step: int, table: StatsTable) -> None:
        if table.keys is self._last_keys:  # the same key list as the step before (shared by the session)
            rows, ids = self._last_rows, self._last_ids
        else:
            rows = [i for i, (_n, slot) in enumerate(table.keys) if not slot.startswith(("input", "parameters"))]
            ids = np.fromiter((self._ids.setdefault(table.keys[i], len(self._ids)) for i in rows), np.int32,
                              len(rows))
            if self._last_ids is not None and np.array_equal(ids, self._last_ids):
                ids = self._last_ids  # shared: the same tensors as the step before
            self._last_keys, self._last_rows = table.keys, rows
        self._last_ids = ids
        v = table.values[rows] if rows else np.zeros((0, len(FIELDS)))
        kept = v[:, [0, 1, 2, 4]]
        with np.errstate(all="ignore"):  # NaN/inf statistics are values too: compare without warnings
            wide = bool(np.any(np.isfinite(kept) & (np.abs(kept) > _FLOAT32_MAX)))
            out = np.empty((len(rows), len(HISTORY_FIELDS)), dtype=np.float64 if wide else np.float32)
            out[:, :4] = kept
            out[:, 4] = v[:, 6] + v[:, 7] + v[:, 8]
        self.steps[step] = (ids, out)

    def _row(self, step: int, key: tuple[str, str]) -> int | None:
        kid = self._ids.get(key)
        if kid is None or step not in self.steps:
            return None
        ids = self.steps[step][0]
        pos = self._pos.get(id(ids))
        if pos is None or len(pos) != len(ids):
            if len(self._pos) > 4:
                self._pos.clear()
            pos = self._pos[id(ids)] = {int(k): i for i, k in enumerate(ids)}
        return pos.get(kid)

    def get(self, step: int, key: tuple[str, str]) -> dict[str, float] | None:
        """The compact statistics of ``key`` in ``step`` (None when not kept)."""
        r = self._row(step, key)
        if r is None:
            return None
        vals = self.steps[step][1][r]
        return {f: float(vals[i]) for i, f in enumerate(HISTORY_FIELDS)}

    def series(self, key: tuple[str, str], field: str) -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one field of ``key`` over the steps that have it."""
        col = HISTORY_FIELDS.index(field)
        steps, vals = [], []
        for step in sorted(self.steps):
            r = self._row(step, key)
            if r is not None:
                steps.append(step)
                vals.append(float(self.steps[step][1][r, col]))
        return steps, vals

    @property
    def nbytes(self) -> int:
        seen: set[int] = set()
        n = 0
        for ids, vals in self.steps.values():
            if id(ids) not in seen:
                seen.add(id(ids))
                n += ids.nbytes
            n += vals.nbytes
        return n
