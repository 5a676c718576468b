"""The ``heatmap`` message of nbdebug's front end (``frontend/src/heatmap.ts``, ``frontend/PROTOCOL.md``):
a 2-D selection of a tensor as JSON (title, step, original indices, colour scale) plus its values as one
binary buffer (float32 or float64; NaN and ±Inf kept as they are).

The rows and columns are labelled with their indices in the whole tensor (a slice ``4:8`` gives rows
4…7); the leading axes an index fixes are in ``index`` (``null`` where a row/column index goes). Signed
data and differences get a diverging scale centred on 0; non-negative data a sequential one.

>>> import numpy as np
>>> x = np.arange(40.0).reshape(10, 4) - 3
>>> x[5, 1] = np.nan
>>> msg, values = heatmap_message(x, ("4:8", "1:2"), title="t", step="current step 3")
>>> msg["rows"], msg["cols"], msg["index"], msg["shape"]
([4, 5, 6, 7], [1], [None, None], [4, 1])
>>> msg["scale"], msg["counts"]["nan"], values.dtype.name
('sequential', 1, 'float64')
>>> msg, _ = heatmap_message(x, ("4:8", "1"), title="t", step="s")   # 1-D: one row
>>> msg["rows"], msg["cols"], msg["index"], msg["shape"]
(None, [4, 5, 6, 7], [None, 1], [1, 4])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .tensor_math import parse_selection, selection_text

MAX_HEAT = 512  # rows/columns sent (the kernel slices larger selections)
#: dtypes whose values float32 holds exactly; anything else goes as float64
_EXACT_IN_F32 = {"float16", "float32", "bool", "int8", "uint8", "int16", "uint16"}


def step_label(mode: str, step: int | None, prev: int | None) -> str:
    """``current step 3`` / ``previous step 2`` / ``difference step 3 − step 2``.

    >>> step_label("difference", 3, 2)
    'difference step 3 − step 2'
    """
    def s(n: int | None) -> str:
        return f"step {n}" if n is not None and n >= 0 else "step ?"
    if mode == "current":
        return f"current {s(step)}"
    if mode == "previous":
        return f"previous {s(prev)}"
    return f"difference {s(step)} − {s(prev)}"


def _plane(a: np.ndarray) -> np.ndarray:
    if a.dtype == np.bool_:
        return a.astype(np.float32)
    if np.issubdtype(a.dtype, np.complexfloating):
        a = np.abs(a)
    if a.dtype.name in _EXACT_IN_F32:
        return np.ascontiguousarray(a, dtype=np.float32)
    return np.ascontiguousarray(a, dtype=np.float64)


def heatmap_message(values: Any, selection: Sequence[str], *, title: str, step: str,
                    diverging: bool | None = None, max_cells: int = MAX_HEAT,
                    reveal: bool = False) -> tuple[dict[str, Any], np.ndarray]:
    """The message and its buffer (a C-contiguous float32/float64 array, rows × columns) for the part of
    ``values`` that ``selection`` (one text per axis, see :func:`~.tensor_math.parse_selection`) picks.

    ``diverging`` forces the scale (True for differences); by default it is diverging when a shown finite
    value is negative. At most ``max_cells`` rows and columns are sent (the title says so)."""
    a = np.asarray(values)
    sel = parse_selection(selection, a.shape)
    free = [i for i, s in enumerate(sel) if isinstance(s, slice)]
    index: list[int | None] = [None if isinstance(s, slice) else int(s) % int(a.shape[i])
                               for i, s in enumerate(sel)]
    idx = {i: list(range(*sel[i].indices(int(a.shape[i]))))[:max_cells] for i in free}  # type: ignore[union-attr]
    part = a[tuple(sel)] if sel else a
    full_shape = part.shape
    part = part[tuple(slice(0, max_cells) for _ in range(part.ndim))]
    row_axis = free[0] if len(free) == 2 else None
    col_axis = free[-1] if free else None
    plane = _plane(part.reshape(1, -1) if part.ndim < 2 else part)
    finite = plane[np.isfinite(plane)]
    lo = float(finite.min()) if finite.size else None
    hi = float(finite.max()) if finite.size else None
    if diverging is None:
        diverging = lo is not None and lo < 0
    note = ""
    if part.shape != full_shape:
        dims = "×".join(str(n) for n in full_shape)
        note = f"showing the first {'×'.join(str(n) for n in part.shape)} of {dims} (at most {max_cells} per axis)"
    msg: dict[str, Any] = {
        "type": "heatmap", "title": title + (f" · {note}" if note else ""), "step": step,
        "selection": selection_text(sel), "dtype": plane.dtype.name, "tensor_dtype": str(a.dtype),
        "shape": [int(plane.shape[0]), int(plane.shape[1])],
        "rows": idx[row_axis] if row_axis is not None else None,
        "cols": idx[col_axis] if col_axis is not None else None,
        "row_axis": row_axis, "col_axis": col_axis, "index": index,
        "scale": "diverging" if diverging else "sequential", "vmin": lo, "vmax": hi,
        "counts": {"nan": int(np.isnan(plane).sum()), "pos_inf": int(np.isposinf(plane).sum()),
                   "neg_inf": int(np.isneginf(plane).sum())},
        "note": note, "reveal": bool(reveal),
    }
    return msg, plane


def empty_message(title: str, step: str, why: str) -> dict[str, Any]:
    """A heatmap with nothing to draw, and why (e.g. the NotRetainedError text)."""
    return {"type": "heatmap", "title": title, "step": step, "empty": why, "reveal": False}
