"""Value-level evaluation of the conditions on the numpy values of one watched tensor: value ranges (TR/AR),
weight change between steps (WCL/WCS/WNC), the initial value (WI) and operator overflow (OO).

>>> evaluate_values("TO", current=[1.0, float("inf")]).hits
(Hit(param='pos_inf_count', threshold=0.0, actual=1.0),)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nbdebug.session.stats import COL, FIELDS

from .firing import Firing, Hit
from .registry import (
    _CHANGE,
    _RANGE,
    CONDITIONS,
    INF_PRESENT,
    NAN_PRESENT,
    NO_PREVIOUS_STEP,
    VALUE_NOT_RETAINED,
    get_condition,
)
from .stats_eval import _C_COUNT, _C_NAN, _C_NINF, _C_PINF, _C_ZERO, _as_matrix, _count_hits, evaluate_stats
from .validation import split_params, validate

# --------------------------------------------------------------------------------------------------
# Value-level evaluation (watched nodes only)
# --------------------------------------------------------------------------------------------------


def _as_array(values: Any) -> np.ndarray:
    a = np.asarray(values)
    if a.dtype.kind == "c":
        raise TypeError("complex tensors are not supported by watch conditions")
    if a.dtype.kind not in "fiub":
        raise TypeError(f"unsupported dtype {a.dtype} for watch conditions")
    return a


def compute_stats(values: Any) -> np.ndarray:
    """Statistics of one array as a row in :data:`~nbdebug.session.stats.FIELDS` order (float64).

    NaN propagates into max/min/mean/abs_mean/norm (as torch does); empty arrays give 0 for those.
    Integers and booleans are converted to float64 first.

    >>> compute_stats([0, 3, -4]).tolist()
    [3.0, -4.0, -0.3333333333333333, 2.3333333333333335, 5.0, 1.0, 0.0, 0.0, 0.0, 3.0]
    """
    a = _as_array(values).astype(np.float64, copy=False).ravel()
    row = np.zeros(len(FIELDS), dtype=np.float64)
    row[_C_COUNT] = a.size
    if a.size == 0:
        return row
    with np.errstate(invalid="ignore", over="ignore"):
        absa = np.abs(a)
        row[COL["max"]] = np.max(a)
        row[COL["min"]] = np.min(a)
        row[COL["mean"]] = np.mean(a)
        row[COL["abs_mean"]] = np.mean(absa)
        row[COL["norm"]] = np.sqrt(np.dot(a, a)) if np.isfinite(row[COL["abs_mean"]]) else np.linalg.norm(a)
    row[_C_ZERO] = np.count_nonzero(a == 0)
    row[_C_NAN] = np.count_nonzero(np.isnan(a))
    row[_C_PINF] = np.count_nonzero(a == np.inf)
    row[_C_NINF] = np.count_nonzero(a == -np.inf)
    return row


def percentage_in_range(values: Any, start: float, end: float) -> float:
    """Percentage (0-100) of all elements with ``start <= v <= end``; NaN is never in range.

    The denominator counts every element, NaN included. Returns NaN for an empty array.

    >>> percentage_in_range([-2.0, -0.5, 0.0, 3.0], -1, 0)
    50.0
    """
    a = _as_array(values)
    if a.size == 0:
        return math.nan
    lo, hi = float(start), float(end)
    if a.dtype.kind == "f" and a.dtype.itemsize < 8:
        # numpy would round the float64 ends to the array's dtype (e.g. tanh(8.8) -> 1.0 in float16) and
        # count saturated values as inside. Use the tightest ends representable in the dtype instead:
        # v >= lo  <=>  v >= (smallest dtype value >= lo), likewise for hi. No float64 copy of the array.
        lo, hi = _ceil_in(lo, a.dtype), _floor_in(hi, a.dtype)
    with np.errstate(invalid="ignore"):
        inside = int(np.count_nonzero((a >= lo) & (a <= hi)))
    return inside * 100.0 / a.size


def _ceil_in(x: float, dtype: np.dtype) -> np.floating:
    with np.errstate(over="ignore"):
        y = dtype.type(x)
    return np.nextafter(y, dtype.type(np.inf)) if float(y) < x else y


def _floor_in(x: float, dtype: np.dtype) -> np.floating:
    with np.errstate(over="ignore"):
        y = dtype.type(x)
    return np.nextafter(y, dtype.type(-np.inf)) if float(y) > x else y


def weight_change_ratio(cur: Any, prev: Any, epsilon: float = 1e-9) -> float:
    """``mean(|cur - prev|) / (mean(|prev|) + epsilon)``, computed in float64.

    When the denominator is 0 the ratio is 0 if nothing changed and +Inf otherwise; NaN for empty
    arrays. Shapes must match.

    >>> weight_change_ratio([1.0, 2.0], [1.0, 1.0], epsilon=0.0)
    0.5
    """
    c = _as_array(cur).astype(np.float64, copy=False)
    q = _as_array(prev).astype(np.float64, copy=False)
    if c.shape != q.shape:
        raise ValueError(f"current shape {c.shape} differs from previous shape {q.shape}")
    if c.size == 0:
        return math.nan
    with np.errstate(invalid="ignore", over="ignore"):
        num = float(np.mean(np.abs(c - q)))
        den = float(np.mean(np.abs(q))) + float(epsilon)
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def _value_error(abbr: str, params: Mapping[str, Any], code: str, row: int) -> Firing:
    cond = CONDITIONS[abbr]
    checks = tuple(k for k in params if cond.param(k).role == "check")
    return Firing(abbr, row, (), code, checks or tuple(params))


def _naninf_code(*arrays: np.ndarray) -> str | None:
    has_nan = has_inf = False
    for a in arrays:
        if a.dtype.kind == "f":
            has_nan = has_nan or bool(np.isnan(a).any())
            has_inf = has_inf or bool(np.isinf(a).any())
    if has_nan:
        return NAN_PRESENT
    return INF_PRESENT if has_inf else None


def _with_row(f: Firing | None, row: int) -> Firing | None:
    return None if f is None else f._replace(row=row)


def tensor_range(
    condition: str, params: Mapping[str, Any] | None, values: Any, *, row: int = -1
) -> Firing | None:
    """TR/AR on a tensor's values: range percentage and ``max - min`` together.

    NaN elements are counted in the denominator of the range percentage but never lie in the range, so
    the range checks are evaluated even when the tensor holds NaN; ``max_min_*`` follows the statistics
    rules (error code when max or min is NaN/Inf because of the tensor).

    >>> import numpy as np
    >>> x = np.tanh(np.array([20.0, -20.0, 30.0, 0.5]))  # three of four saturated
    >>> tensor_range("AR", {"range_percentage_lt": 30, "range_start_inclusive": np.tanh(-8.8),
    ...                     "range_end_inclusive": np.tanh(8.8)}, x).hits
    (Hit(param='range_percentage_lt', threshold=30.0, actual=25.0),)
    """
    abbr = get_condition(condition).abbr
    if abbr not in _RANGE:
        raise ValueError(f"tensor_range evaluates TR or AR, not {abbr}")
    stats_p, value_p = split_params(abbr, params)
    a = _as_array(values)
    if a.size == 0:
        return None
    first = evaluate_stats(abbr, stats_p, compute_stats(a)[None, :]) if stats_p else []
    base = first[0] if first else Firing(abbr, row, ())
    hits = list(base.hits)
    if value_p:
        pct = percentage_in_range(a, value_p["range_start_inclusive"], value_p["range_end_inclusive"])
        if "range_percentage_lt" in value_p and pct < value_p["range_percentage_lt"]:
            hits.append(Hit("range_percentage_lt", value_p["range_percentage_lt"], pct))
        if "range_percentage_gt" in value_p and pct > value_p["range_percentage_gt"]:
            hits.append(Hit("range_percentage_gt", value_p["range_percentage_gt"], pct))
    if not hits and base.error is None:
        return None
    order = CONDITIONS[abbr].param_names
    hits.sort(key=lambda h: order.index(h.param))
    return base._replace(row=row, hits=tuple(hits))


def weight_change(
    condition: str, params: Mapping[str, Any] | None, cur: Any, prev: Any, *, row: int = -1
) -> Firing | None:
    """WCL/WCS: compare :func:`weight_change_ratio` with its threshold.

    NaN/Inf in either step make the ratio meaningless: the result is an error firing
    (``nan_present``/``inf_present``). Empty weights never fire.

    >>> weight_change("WCL", {"abs_mean_update_ratio_gt": 0.1}, [1.5, 1.0], [1.0, 1.0]).describe()
    'WCL: abs_mean_update_ratio_gt = 0.1 set, actual abs_mean_update_ratio = 0.25'
    """
    abbr = get_condition(condition).abbr
    if abbr not in ("WCL", "WCS"):
        raise ValueError(f"weight_change evaluates WCL or WCS, not {abbr}")
    p = validate(abbr, params)
    c, q = _as_array(cur), _as_array(prev)
    if c.shape != q.shape:
        raise ValueError(f"{abbr}: current shape {c.shape} differs from previous shape {q.shape}")
    if c.size == 0:
        return None
    key = "abs_mean_update_ratio_gt" if abbr == "WCL" else "abs_mean_update_ratio_lt"
    code = _naninf_code(c, q)
    if code is not None:
        return Firing(abbr, row, (), code, (key,))
    ratio = weight_change_ratio(c, q, p["epsilon"])
    t = p[key]
    fired = ratio > t if abbr == "WCL" else ratio < t
    return Firing(abbr, row, (Hit(key, t, ratio),)) if fired else None


def weight_not_changed(
    cur: Any, prev: Any, rtol: float = 1e-5, atol: float = 1e-8, equal_nan: bool = False, *, row: int = -1
) -> Firing | None:
    """WNC: fires when every element satisfies ``|cur - prev| <= atol + rtol * |prev|``.

    Equal values (including equal infinities) always count as unchanged, an infinity is never close to
    anything else, and NaN counts as unchanged only against NaN and only with ``equal_nan`` (the same
    semantics as ``numpy.allclose``). The hit reports ``rtol``/``atol`` with the largest relative and
    absolute change over the finite elements. Empty weights never fire.

    >>> print(weight_not_changed([1.0, 2.0], [1.0, 2.0 + 1e-9]).describe())
    WNC: rtol = 1e-05 set, largest relative change = 5e-10; atol = 1e-08 set, largest absolute change = 1e-09
    """
    p = validate("WNC", {"rtol": rtol, "atol": atol, "equal_nan": equal_nan})
    c = _as_array(cur).astype(np.float64, copy=False)
    q = _as_array(prev).astype(np.float64, copy=False)
    if c.shape != q.shape:
        raise ValueError(f"WNC: current shape {c.shape} differs from previous shape {q.shape}")
    if c.size == 0:
        return None
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(c - q)
        aq = np.abs(q)
        # an infinity is close only to the same infinity (rtol * inf would otherwise accept anything)
        close = (c == q) | (np.isfinite(c) & np.isfinite(q) & (diff <= p["atol"] + p["rtol"] * aq))
        if p["equal_nan"]:
            close |= np.isnan(c) & np.isnan(q)
        if not close.all():
            return None
        finite = np.isfinite(diff)
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        rel_ok = finite & (aq > 0) & np.isfinite(aq)
        max_rel = float((diff[rel_ok] / aq[rel_ok]).max()) if rel_ok.any() else 0.0
    return Firing("WNC", row, (Hit("rtol", p["rtol"], max_rel), Hit("atol", p["atol"], max_abs)))


def weight_initialization(params: Mapping[str, Any] | None, initial: Any, *, row: int = -1) -> Firing | None:
    """WI on the initial value: ``zero_percentage_ge``, ``max_gt``, ``min_lt`` (statistics rules).

    >>> weight_initialization({}, [0.0, 0.0, 0.0]).hits
    (Hit(param='zero_percentage_ge', threshold=100.0, actual=100.0),)
    """
    fs = evaluate_stats("WI", params, compute_stats(initial)[None, :])
    return _with_row(fs[0], row) if fs else None


def _stats_matrix(x: Any) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.size == 0:
        return np.zeros((0, len(FIELDS)))
    return _as_matrix(a)


def operator_overflow(input_stats_rows: Any, output_stats_rows: Any, *, row: int = -1) -> Firing | None:
    """OO off-Ascend: fires when every input is finite and some output holds NaN/Inf.

    Takes stats rows (one per input / output tensor, :data:`~nbdebug.session.stats.FIELDS` order). The
    hit reports the outputs' NaN/Inf counts summed. An op with no recorded inputs counts as having finite
    inputs.

    >>> import numpy as np
    >>> ins = np.stack([compute_stats([1.0, 0.0])])
    >>> outs = np.stack([compute_stats([np.inf, 0.0])])
    >>> operator_overflow(ins, outs).hits
    (Hit(param='pos_inf_count', threshold=0.0, actual=1.0),)
    """
    ins = _stats_matrix(input_stats_rows)
    outs = _stats_matrix(output_stats_rows)
    cols = [_C_NAN, _C_PINF, _C_NINF]
    if ins.shape[0] and ins[:, cols].sum() > 0:
        return None
    counts = outs[:, cols].sum(axis=0).tolist() if outs.shape[0] else [0.0, 0.0, 0.0]
    hits = _count_hits(counts)
    return Firing("OO", row, hits) if hits else None


def _arrays(x: Any) -> list[np.ndarray]:
    if isinstance(x, (list, tuple)) and x and all(isinstance(v, np.ndarray) for v in x):
        return [_as_array(v) for v in x]
    return [_as_array(x)]


def evaluate_values(
    condition: str,
    params: Mapping[str, Any] | None = None,
    *,
    current: Any = None,
    previous: Any = None,
    initial: Any = None,
    inputs: Sequence[Any] | None = None,
    row: int = -1,
) -> Firing | None:
    """Evaluate any of the 17 conditions on numpy values of one tensor; ``None`` when nothing fired.

    ``current`` is the tensor at this step (for OO: the op's output, or a list of numpy output arrays),
    ``previous`` the same tensor one step earlier (WCL/WCS/WNC), ``initial`` its step-0 value (WI),
    ``inputs`` the op's input arrays (OO). Every parameter is evaluated; statistics-level ones from
    statistics computed here. Missing data gives an error firing instead of a silent miss:
    ``value_not_retained`` when ``current`` (or ``initial`` for WI) is ``None``, ``no_previous_step``
    when ``previous`` is ``None``.

    >>> import numpy as np
    >>> evaluate_values("WCS", {}, current=np.ones(3)).error
    'no_previous_step'
    >>> evaluate_values("WNC", {}, current=np.ones(3), previous=np.ones(3)).hit
    True
    >>> evaluate_values("TO", current=np.array([1.0, np.nan])).hits
    (Hit(param='nan_count', threshold=0.0, actual=1.0),)
    """
    abbr = get_condition(condition).abbr
    p = validate(abbr, params)
    if abbr == "WI":
        if initial is None:
            return _value_error(abbr, p, VALUE_NOT_RETAINED, row)
        return weight_initialization(p, initial, row=row)
    if current is None:
        return _value_error(abbr, p, VALUE_NOT_RETAINED, row)
    if abbr == "OO":
        outs = np.stack([compute_stats(a) for a in _arrays(current)])
        ins = np.stack([compute_stats(a) for a in inputs]) if inputs else np.zeros((0, len(FIELDS)))
        return operator_overflow(ins, outs, row=row)
    if abbr in _CHANGE:
        if previous is None:
            return _value_error(abbr, p, NO_PREVIOUS_STEP, row)
        if abbr == "WNC":
            return weight_not_changed(current, previous, p["rtol"], p["atol"], p["equal_nan"], row=row)
        return weight_change(abbr, p, current, previous, row=row)
    if abbr in _RANGE:
        return tensor_range(abbr, p, current, row=row)
    fs = evaluate_stats(abbr, p, compute_stats(current)[None, :])
    return _with_row(fs[0], row) if fs else None
