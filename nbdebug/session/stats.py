"""Per-tensor statistics, framework-neutral.

A step's statistics live in one :class:`StatsTable`: a float64 matrix with one row per captured
tensor (a ``(node, slot)`` pair) and one column per field of :data:`FIELDS`, plus dtype and shape.
Adapters fill it from a single device→host transfer at the end of the step; watch conditions
read whole columns at once.

>>> import numpy as np
>>> t = StatsTable.from_rows([("Functional.relu.0.forward", "output.0")], ["float32"], [(2,)],
...                          np.array([[1.0, 0.0, 0.5, 0.5, 1.0, 1, 0, 0, 0, 2]]))
>>> t.get("Functional.relu.0.forward", "output.0")["abs_mean"]
0.5
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

#: Column order of :attr:`StatsTable.values`.
FIELDS: tuple[str, ...] = (
    "max",
    "min",
    "mean",
    "abs_mean",
    "norm",
    "zero_count",
    "nan_count",
    "pos_inf_count",
    "neg_inf_count",
    "count",
)
COL: dict[str, int] = {name: i for i, name in enumerate(FIELDS)}

#: Keys of the mapping returned by ``Debugger.stats``.
STAT_KEYS: tuple[str, ...] = (
    "dtype",
    "shape",
    "count",
    "max",
    "min",
    "mean",
    "abs_mean",
    "norm",
    "zero_count",
    "nan_count",
    "pos_inf_count",
    "neg_inf_count",
)

def row_to_mapping(dtype: str, shape: Sequence[int], row: np.ndarray) -> dict[str, Any]:
    """Turn one stats row into the public mapping (counts as ints, empty tensors' extrema as None)."""
    count = int(row[COL["count"]])
    out: dict[str, Any] = {"dtype": dtype, "shape": tuple(int(s) for s in shape), "count": count}
    for k in ("max", "min", "mean", "abs_mean"):
        out[k] = None if count == 0 else float(row[COL[k]])
    out["norm"] = float(row[COL["norm"]])
    for k in ("zero_count", "nan_count", "pos_inf_count", "neg_inf_count"):
        out[k] = int(row[COL[k]])
    return out


class StatsTable:
    """Statistics of every captured tensor of one step."""

    __slots__ = ("keys", "index", "dtypes", "shapes", "values", "unsupported", "_by_node", "orders")

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self.index: dict[tuple[str, str], int] = {}
        self.dtypes: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.values: np.ndarray = np.zeros((0, len(FIELDS)))
        self.unsupported: dict[int, str] = {}
        self._by_node: dict[str, list[tuple[str, int]]] | None = None
        #: a finished live step's execution order of its nodes (``Node.order`` is the latest step's)
        self.orders: dict[str, int] | None = None

    @classmethod
    def from_rows(
        cls,
        keys: Sequence[tuple[str, str]],
        dtypes: Sequence[str],
        shapes: Sequence[Sequence[int]],
        values: np.ndarray,
    ) -> StatsTable:
        t = cls()
        t.keys = list(keys)
        t.index = {k: i for i, k in enumerate(t.keys)}
        t.dtypes = list(dtypes)
        t.shapes = [tuple(s) for s in shapes]
        t.values = np.asarray(values, dtype=np.float64).reshape(len(t.keys), len(FIELDS))
        return t

    @classmethod
    def taking(cls, keys: list[tuple[str, str]], index: dict[tuple[str, str], int], dtypes: list[str],
               shapes: list[tuple[int, ...]], values: np.ndarray) -> StatsTable:
        """A table over lists it takes as they are (no copies): ``index[keys[i]] == i``; ``keys`` and
        ``index`` may be shared with tables of other steps that hold the same tensors (never modified)."""
        t = cls()
        t.keys, t.index, t.dtypes = keys, index, dtypes
        t.shapes = [s if type(s) is tuple else tuple(s) for s in shapes]
        t.values = np.asarray(values, dtype=np.float64).reshape(len(keys), len(FIELDS))
        return t

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, key: object) -> bool:
        return key in self.index

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self.keys)

    def column(self, field: str) -> np.ndarray:
        return self.values[:, COL[field]]

    def get(self, node: str, slot: str) -> Mapping[str, Any]:
        i = self.index[(node, slot)]
        return row_to_mapping(self.dtypes[i], self.shapes[i], self.values[i])

