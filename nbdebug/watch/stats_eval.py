"""Vectorized evaluation of the 17 conditions over a statistics matrix (thousands of rows at once).

>>> import numpy as np
>>> from nbdebug.session.stats import FIELDS
>>> m = np.zeros((1, len(FIELDS))); m[0, COL["max"]] = 5.0; m[0, COL["count"]] = 1
>>> [f.hits for f in evaluate_stats("GL", {"max_gt": 1}, m)]
[(Hit(param='max_gt', threshold=1.0, actual=5.0),)]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbdebug.session.stats import COL, FIELDS

from .firing import _COUNT_PARAMS, Firing, Hit
from .registry import _OVERFLOW, ERROR_CODES, INF_PRESENT, NAN_PRESENT, get_condition
from .validation import validate

# --------------------------------------------------------------------------------------------------
# Vectorized evaluation over a statistics matrix
# --------------------------------------------------------------------------------------------------

_C_MAX, _C_MIN, _C_COUNT = COL["max"], COL["min"], COL["count"]
_C_ZERO, _C_NAN = COL["zero_count"], COL["nan_count"]
_C_PINF, _C_NINF = COL["pos_inf_count"], COL["neg_inf_count"]
_OPS = {">": np.greater, "<": np.less, ">=": np.greater_equal}
_tnew = tuple.__new__  # builds Hit/Firing without the NamedTuple constructor's Python frame (hot loop)


def _count_hits(counts: Sequence[float]) -> tuple[Hit, ...]:
    return tuple([_tnew(Hit, (k, 0.0, c)) for k, c in zip(_COUNT_PARAMS, counts) if c > 0])  # noqa: B905


def _hits(meta: list[tuple[str, float]], actuals: list[float]) -> tuple[Hit, ...]:
    return tuple([_tnew(Hit, (name, t, x)) for (name, t), x in zip(meta, actuals, strict=True)])


def _column(sub: np.ndarray, stat: str) -> np.ndarray:
    if stat == "max_min":
        return sub[:, _C_MAX] - sub[:, _C_MIN]
    if stat == "zero_percentage":
        return sub[:, _C_ZERO] * 100.0 / sub[:, _C_COUNT]
    return sub[:, COL[stat]]


def _as_matrix(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1 and values.shape[0] == len(FIELDS):
        values = values[None, :]
    if values.ndim != 2 or values.shape[1] != len(FIELDS):
        raise ValueError(f"stats values must have shape (N, {len(FIELDS)}), got {values.shape}")
    return values


def evaluate_stats(
    condition: str,
    params: Mapping[str, Any] | None,
    values: np.ndarray,
    rows: Sequence[int] | np.ndarray | None = None,
    *,
    inputs_finite: Sequence[bool] | np.ndarray | None = None,
    missing: str | None = None,
) -> list[Firing]:
    """Evaluate ``condition`` on the statistics rows ``rows`` of ``values`` (``N x len(FIELDS)``).

    Answers every parameter the statistics can answer: the NaN/Inf checks (TO, WO, GE; OO given
    ``inputs_finite``, one flag per row saying whether all of that op's inputs were finite), TZ, the
    threshold checks (TL/TS/WL/WS/GL/GV), WI on the rows of the initial step, and the ``max_min_*`` part
    of TR/AR. Each parameter is tested on its own; empty tensors (count 0) never fire.

    An infinite statistic is compared as it is: a gradient whose max is ``+inf`` is "too large" for any
    ``max_gt`` (a hit whose actual value is ``inf``), as is one whose ``abs_mean`` overflowed. When a
    statistic a check needs is NaN because the tensor holds NaN/Inf (its NaN/Inf counts are non-zero:
    NaN values, or ``+inf`` and ``-inf`` in one mean), the comparison cannot be made; the row fires with
    error ``nan_present`` (the tensor has NaN) or ``inf_present`` (it has Inf but no NaN) and the
    parameter is listed in ``unchecked``. A NaN statistic with zero NaN/Inf counts (the NaN rows adapters
    write for unsupported dtypes) never fires.

    Parameters that need tensor values (see :func:`split_params`) are left to :func:`evaluate_values`;
    pass ``missing=<error code>`` (e.g. ``VALUE_NOT_RETAINED``) to instead have every non-empty row
    report them as unchecked with that code. WCL/WCS/WNC have no statistics-level part.

    ``values`` may also be a :class:`~nbdebug.session.stats.StatsTable`; its unsupported rows (dtypes the
    adapter could not reduce) are then skipped. ``rows`` defaults to all rows; the returned firings carry
    indices into ``values``.

    >>> import numpy as np
    >>> from nbdebug.watch.values_eval import compute_stats
    >>> m = np.stack([compute_stats(np.array(a)) for a in ([1.0, 2.0], [np.nan, 1.0], [0.0, 0.0])])
    >>> [(f.row, f.hits, f.error) for f in evaluate_stats("TL", {"max_gt": 1.5}, m)]
    [(0, (Hit(param='max_gt', threshold=1.5, actual=2.0),), None), (1, (), 'nan_present')]
    >>> [f.row for f in evaluate_stats("TZ", {}, m, rows=[1, 2])]
    [2]
    """
    cond = get_condition(condition)
    abbr = cond.abbr
    p = validate(abbr, params)
    if missing is not None and missing not in ERROR_CODES:
        raise ValueError(f"missing must be one of {', '.join(ERROR_CODES)}, got {missing!r}")
    values, row_ids, inputs_finite = _selected(values, rows, inputs_finite)
    sub = values if row_ids is None else values[row_ids]
    if abbr in _OVERFLOW:
        return _overflow_firings(abbr, sub, row_ids, inputs_finite)
    checks = [cond.param(k) for k in p if cond.param(k).role == "check" and cond.param(k).level == "stats"]
    value_checks = tuple(k for k in p if cond.param(k).role == "check" and cond.param(k).level == "values")
    report_missing = bool(value_checks) and missing is not None
    if sub.shape[0] == 0 or (not checks and not report_missing):
        return []
    return _threshold_firings(abbr, p, checks, value_checks, sub, row_ids, missing if report_missing else None)


def _selected(values: Any, rows: Any, inputs_finite: Any) -> tuple[np.ndarray, np.ndarray | None, Any]:
    """``(matrix, row ids or None for all, inputs_finite)`` with a StatsTable's unsupported rows dropped."""
    skip = None
    if not isinstance(values, np.ndarray) and hasattr(values, "values"):  # a StatsTable
        skip = getattr(values, "unsupported", None)
        values = values.values
    values = _as_matrix(values)
    row_ids = None if rows is None else np.asarray(rows, dtype=np.intp).ravel()
    if skip:
        keep = np.ones(values.shape[0], dtype=bool)
        keep[list(skip)] = False
        kept = keep if row_ids is None else keep[row_ids]
        row_ids = np.flatnonzero(keep) if row_ids is None else row_ids[kept]
        if inputs_finite is not None:  # one flag per requested row: drop the skipped rows' flags too
            flags = np.asarray(inputs_finite, dtype=bool).ravel()
            inputs_finite = flags[kept] if flags.shape[0] == kept.shape[0] else flags
    return values, row_ids, inputs_finite


def _overflow_firings(abbr: str, sub: np.ndarray, row_ids: np.ndarray | None, inputs_finite: Any) -> list[Firing]:
    """TO/WO/GE/OO: the rows holding NaN/Inf (OO: only where every input was finite)."""
    n = sub.shape[0]
    mask = (sub[:, _C_NAN] > 0) | (sub[:, _C_PINF] > 0) | (sub[:, _C_NINF] > 0)
    if abbr == "OO":
        if inputs_finite is None:
            raise ValueError("OO: needs inputs_finite (per row: were all the op's inputs finite)")
        ok = np.asarray(inputs_finite, dtype=bool).ravel()
        if ok.shape[0] != n:
            raise ValueError(f"OO: inputs_finite has {ok.shape[0]} flags for {n} rows")
        mask &= ok
    idx = np.flatnonzero(mask)
    if idx.size == 0:
        return []
    ids = (idx if row_ids is None else row_ids[idx]).tolist()
    counts = sub[idx][:, [_C_NAN, _C_PINF, _C_NINF]].tolist()
    return [_tnew(Firing, (abbr, r, _count_hits(cs), None, ())) for r, cs in zip(ids, counts, strict=True)]


def _threshold_firings(abbr: str, p: Mapping[str, Any], checks: list, value_checks: tuple[str, ...],
                       sub: np.ndarray, row_ids: np.ndarray | None, missing: str | None) -> list[Firing]:
    """The threshold checks of ``checks`` on every row, each parameter on its own (see :func:`evaluate_stats`)."""
    n = sub.shape[0]
    count = sub[:, _C_COUNT]
    nonempty = count > 0
    nan_c = sub[:, _C_NAN]
    inf_c = sub[:, _C_PINF] + sub[:, _C_NINF]
    naninf = (nan_c > 0) | (inf_c > 0)

    fired = report_missing_mask = nonempty if missing is not None else np.zeros(n, dtype=bool)
    hit_masks, bad_masks, actuals = [], [], []
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        for spec in checks:
            x = _column(sub, spec.stat)
            bad = nonempty & naninf & np.isnan(x)
            hit = nonempty & ~bad & _OPS[spec.op](x, p[spec.name])
            fired = fired | hit | bad
            hit_masks.append(hit)
            bad_masks.append(bad)
            actuals.append(x)

    idx = np.flatnonzero(fired)
    if idx.size == 0:
        return []
    ids = idx if row_ids is None else row_ids[idx]
    k = len(checks)
    # One integer per fired row says which parameters hit (bits 0..k-1), which could not be checked
    # (bits k..2k-1), whether value-level parameters are reported missing (bit 2k) and whether the
    # tensor has Inf but no NaN (bit 2k+1). Rows sharing a pattern are built together (_by_pattern).
    code = report_missing_mask[idx].astype(np.int64) << (2 * k)
    code |= ((nan_c[idx] == 0) & (inf_c[idx] > 0)).astype(np.int64) << (2 * k + 1)
    xs_all = None
    if k:
        weights = np.left_shift(1, np.arange(2 * k, dtype=np.int64))
        code |= np.concatenate([np.stack(hit_masks)[:, idx], np.stack(bad_masks)[:, idx]]).T @ weights
        xs_all = np.stack(actuals)[:, idx]
    names = [s.name for s in checks]
    return _by_pattern(abbr, names, [p[k] for k in names], value_checks, missing, code, ids, xs_all)


def _by_pattern(abbr: str, names: list[str], thresholds: list[float], value_checks: tuple[str, ...],
                missing: str | None, code: np.ndarray, ids: np.ndarray, xs_all: Any) -> list[Firing]:
    """Build the firings of the fired rows, the rows sharing a bit pattern ``code`` together (hot loop)."""
    k = len(names)
    patterns = np.unique(code).tolist()
    out: list[Any] = [None] * ids.size
    for c in patterns:
        pos = np.flatnonzero(code == c) if len(patterns) > 1 else np.arange(ids.size)
        hit_j = [j for j in range(k) if c >> j & 1]
        unchecked = tuple(names[j] for j in range(k) if c >> (k + j) & 1)
        error = (INF_PRESENT if c >> (2 * k + 1) & 1 else NAN_PRESENT) if unchecked else None
        if c >> (2 * k) & 1:
            unchecked += value_checks
            error = error or missing
        rs = ids[pos].tolist()
        if not hit_j:
            fs = [_tnew(Firing, (abbr, r, (), error, unchecked)) for r in rs]
        elif len(hit_j) == 1:
            name, t = names[hit_j[0]], thresholds[hit_j[0]]
            fs = [
                _tnew(Firing, (abbr, r, (_tnew(Hit, (name, t, x)),), error, unchecked))
                for r, x in zip(rs, xs_all[hit_j[0], pos].tolist(), strict=True)
            ]
        else:
            meta = [(names[j], thresholds[j]) for j in hit_j]
            fs = [
                _tnew(Firing, (abbr, r, _hits(meta, xr), error, unchecked))
                for r, xr in zip(rs, xs_all[hit_j][:, pos].T.tolist(), strict=True)
            ]
        if len(patterns) == 1:
            return fs
        for i, f in zip(pos.tolist(), fs, strict=True):
            out[i] = f
    return out
