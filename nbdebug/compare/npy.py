"""``compare_npy_dir``: compare two folders of ``.npy`` files (TroubleShooter's workflow for a first loss
that does not match: save key outputs of both networks as ``.npy``, find the first pair that differs).

Files pair up by name (the same file name on both sides), by order (the k-th file with the k-th, files
sorted by their number — a prefix ``0_conv1.npy``, else a suffix as MindSpore's ``ts.save`` writes them,
``conv_float32_0.npy`` — then by name) or by shape (an edit-distance alignment of
the two sequences of shapes: deleting or inserting a file costs 1, pairing files of different shapes
costs 5, so insertions are preferred to mismatched pairs).

>>> import numpy as np, os, tempfile
>>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> np.save(os.path.join(a, "0_x.npy"), np.ones(3)); np.save(os.path.join(b, "0_x.npy"), np.ones(3) * 1.5)
>>> res = compare_npy_dir(a, b)
>>> res.rows[0].allclose, res.first_mismatch.name_a
(False, '0_x.npy')
"""

from __future__ import annotations

import html
import math
import os
import re
from dataclasses import dataclass

import numpy as np

from .metrics import close_report
from .table import TupleTable

_PREFIX = re.compile(r"^(\d+)")
_SUFFIX = re.compile(r"_(\d+)\.npy$")  # MindSpore TroubleShooter's ts.save: conv_float32_0.npy
PAIRINGS = ("name", "order", "shape")


@dataclass
class NpyPair:
    """One pair of files (or a file with no partner: the other name is None)."""

    name_a: str | None
    name_b: str | None
    shape_a: tuple[int, ...] | None
    shape_b: tuple[int, ...] | None
    dtype_a: str | None = None
    dtype_b: str | None = None
    allclose: bool = False
    close_pct: float = math.nan
    cosine: float = math.nan
    mean_abs_diff: float = math.nan
    max_abs_diff: float = math.nan
    message: str = ""

    @property
    def status(self) -> str:
        if self.name_a is None or self.name_b is None:
            return "unmatched"
        return "pass" if self.allclose else "error"


class NpyCompareResult(TupleTable):
    """Pairs of a folder comparison, in pairing order."""

    def __init__(self, rows: list[NpyPair], dir_a: str, dir_b: str, pairing: str, rtol: float, atol: float,
                 equal_nan: bool) -> None:
        self.rows = rows
        self.dir_a, self.dir_b = dir_a, dir_b
        self.pairing, self.rtol, self.atol, self.equal_nan = pairing, rtol, atol, equal_nan

    @property
    def all_close(self) -> bool:
        return all(r.allclose for r in self.rows)

    @property
    def first_mismatch(self) -> NpyPair | None:
        """The first paired files that are not allclose (None when every pair is)."""
        return next((r for r in self.rows if r.name_a is not None and r.name_b is not None and not r.allclose),
                    None)

    @property
    def unmatched(self) -> list[NpyPair]:
        return [r for r in self.rows if r.name_a is None or r.name_b is None]

    COLUMNS = ("file a", "file b", "shape a", "shape b", "dtype a", "dtype b", "allclose", "close %", "cosine",
               "mean |diff|", "max |diff|", "message")

    def records(self) -> list[tuple]:
        return [(r.name_a, r.name_b, r.shape_a, r.shape_b, r.dtype_a, r.dtype_b, r.allclose, r.close_pct,
                 r.cosine, r.mean_abs_diff, r.max_abs_diff, r.message) for r in self.rows]

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        bad = sum(1 for r in self.rows if r.status == "error")
        fm = self.first_mismatch
        return (f"<NpyCompareResult {len(self.rows)} pairs by {self.pairing}: {bad} not allclose, "
                f"{len(self.unmatched)} unmatched; first mismatch: {fm.name_a if fm else None}>")

    def _repr_html_(self) -> str:
        colours = {"error": "#f8d0d0", "pass": "#ffffff", "unmatched": "#e4e4e4"}
        head = "".join(f"<th>{c}</th>" for c in self.COLUMNS)
        body = "".join(
            f"<tr style='background:{colours[r.status]}'>"
            + "".join(f"<td>{html.escape('' if v is None else (f'{v:.6g}' if isinstance(v, float) else str(v)))}</td>"
                      for v in rec) + "</tr>"
            for r, rec in zip(self.rows, self.records(), strict=True))
        return f"<div><b>{html.escape(repr(self))}</b><table><tr>{head}</tr>{body}</table></div>"


def _files(d: str) -> list[str]:
    if not os.path.isdir(d):
        raise FileNotFoundError(f"{d}: no such folder")
    names = [f for f in os.listdir(d) if f.endswith(".npy")]

    def key(f: str) -> tuple:
        m = _PREFIX.match(f) or _SUFFIX.search(f)
        return (0, int(m.group(1)), f) if m else (1, 0, f)

    return sorted(names, key=key)


def _shape(path: str) -> tuple[tuple[int, ...] | None, str | None, str]:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
        return tuple(int(x) for x in arr.shape), str(arr.dtype), ""
    except Exception as e:
        return None, None, f"{os.path.basename(path)}: not a readable .npy file ({type(e).__name__})"


def align_by_shape(a: list, b: list, replace_cost: int = 5) -> list[tuple[int | None, int | None]]:
    """Edit-distance alignment of two sequences (delete/insert 1, pairing unequal items ``replace_cost``).

    >>> align_by_shape([(2,), (3,), (4,)], [(2,), (4,)])
    [(0, 0), (1, None), (2, 1)]
    """
    n, m = len(a), len(b)
    cost = np.zeros((n + 1, m + 1), dtype=np.int64)
    cost[:, 0] = np.arange(n + 1)
    cost[0, :] = np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            sub = cost[i - 1, j - 1] + (0 if a[i - 1] == b[j - 1] else replace_cost)
            cost[i, j] = min(sub, cost[i - 1, j] + 1, cost[i, j - 1] + 1)
    out: list[tuple[int | None, int | None]] = []
    i, j = n, m
    while i > 0 or j > 0:
        if i > 0 and j > 0 and cost[i, j] == cost[i - 1, j - 1] + (0 if a[i - 1] == b[j - 1] else replace_cost):
            out.append((i - 1, j - 1))
            i, j = i - 1, j - 1
        elif i > 0 and cost[i, j] == cost[i - 1, j] + 1:
            out.append((i - 1, None))
            i -= 1
        else:
            out.append((None, j - 1))
            j -= 1
    return out[::-1]


def compare_npy_dir(a: str | os.PathLike, b: str | os.PathLike, rtol: float = 1e-4, atol: float = 1e-4,
                    equal_nan: bool = False, pairing: str = "name") -> NpyCompareResult:
    """Compare the ``.npy`` files of folder ``a`` with those of folder ``b``.

    Each pair reports ``allclose`` (``|a - b| <= atol + rtol·|b|`` everywhere), the percentage of close
    elements, the cosine similarity, and the mean and max ``|a - b|``. Files with no partner are listed
    with ``None`` on the other side.
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {PAIRINGS}, got {pairing!r}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    da, db = os.fspath(a), os.fspath(b)
    fa, fb = _files(da), _files(db)
    meta_a = {f: _shape(os.path.join(da, f)) for f in fa}
    meta_b = {f: _shape(os.path.join(db, f)) for f in fb}
    if pairing == "name":
        sb = set(fb)
        pairs: list[tuple[str | None, str | None]] = [(f, f if f in sb else None) for f in fa]
        sa = set(fa)
        pairs += [(None, f) for f in fb if f not in sa]
    elif pairing == "order":
        k = min(len(fa), len(fb))
        pairs = list(zip(fa[:k], fb[:k], strict=True)) + [(f, None) for f in fa[k:]] + [(None, f) for f in fb[k:]]
    else:
        idx = align_by_shape([meta_a[f][0] for f in fa], [meta_b[f][0] for f in fb])
        pairs = [(fa[i] if i is not None else None, fb[j] if j is not None else None) for i, j in idx]
    rows = []
    for x, y in pairs:
        sa_, ta, ea = meta_a.get(x, (None, None, "")) if x else (None, None, "")
        sb_, tb, eb = meta_b.get(y, (None, None, "")) if y else (None, None, "")
        row = NpyPair(x, y, sa_, sb_, ta, tb, message="; ".join(m for m in (ea, eb) if m))
        if x is not None and y is not None and not row.message:
            if sa_ != sb_:
                row.message = f"shapes differ: {list(sa_)} vs {list(sb_)}"
            else:
                rep = close_report(np.load(os.path.join(da, x), mmap_mode="r"),
                                   np.load(os.path.join(db, y), mmap_mode="r"), rtol, atol, equal_nan)
                row.allclose, row.close_pct, row.cosine = rep["allclose"], rep["close_pct"], rep["cosine"]
                row.mean_abs_diff, row.max_abs_diff = rep["mean_abs_diff"], rep["max_abs_diff"]
        elif x is None or y is None:
            row.message = row.message or ("only in " + (da if y is None else db))
        rows.append(row)
    return NpyCompareResult(rows, da, db, pairing, rtol, atol, equal_nan)
