"""Comparison metrics of two tensors (msProbe's definitions) and of two sets of statistics.

``N`` is the target value, ``B`` the golden (benchmark) one; ``RE = |(N - B) / B|`` with the dtype's eps
added to both where ``B == 0`` (as msProbe's compare does). Tensor metrics follow msProbe's compare exactly — arrays
are squeezed, NaN/Inf must sit at the same positions (then they are zeroed on both sides), a 0-d tensor
has no Cosine/EucDist/ratios, a one-element tensor no Cosine — so that values agree with ``msprobe
compare`` output; the only difference is that nbdebug keeps full precision where msProbe rounds.

>>> import numpy as np
>>> m = tensor_metrics(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.3]))
>>> round(m.cosine, 6), round(m.max_abs_err, 6), m.one_thousandth
(0.998988, 0.3, 0.6666666666666666)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: msProbe's guidance: a tensor matches when Cosine > 0.99 and MaxAbsErr < 0.001
COSINE_MIN = 0.99
MAX_ABS_ERR_MAX = 0.001
THOUSANDTH = 0.001
FIVE_THOUSANDTHS = 0.005
_EPS64 = float(np.finfo(np.float64).eps)

METRIC_NAMES = ("cosine", "euc_dist", "max_abs_err", "max_rel_err", "one_thousandth", "five_thousandths")
#: column titles used by msProbe's compare table
METRIC_TITLES = ("Cosine", "EucDist", "MaxAbsErr", "MaxRelativeErr", "One Thousandth Err Ratio",
                 "Five Thousandths Err Ratio")


@dataclass(frozen=True)
class TensorMetrics:
    """msProbe's tensor-mode metrics; NaN where one does not apply, with the reason in ``message``."""

    cosine: float
    euc_dist: float
    max_abs_err: float
    max_rel_err: float
    one_thousandth: float
    five_thousandths: float
    message: str = ""

    def as_tuple(self) -> tuple[float, ...]:
        return (self.cosine, self.euc_dist, self.max_abs_err, self.max_rel_err, self.one_thousandth,
                self.five_thousandths)


def _none(message: str) -> TensorMetrics:
    nan = float("nan")
    return TensorMetrics(nan, nan, nan, nan, nan, nan, message)


def relative_error(n: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|(N - B) / B|`` elementwise, computed in the arrays' common float type (at least float32), with
    that type's eps added to both sides where ``B == 0``."""
    n = np.asarray(n)
    b = np.asarray(b)
    if n.dtype.kind != "f":
        n = n.astype(np.float64)
    if b.dtype.kind != "f":
        b = b.astype(np.float64)
    rt = np.result_type(n, b, np.float32)
    zero = b == 0
    n = n.astype(rt, copy=True)
    b = b.astype(rt, copy=True)
    eps = np.finfo(rt).eps
    n[zero] += eps
    b[zero] += eps
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.abs(np.divide(n - b, b))


def tensor_metrics(target: np.ndarray, golden: np.ndarray) -> TensorMetrics:
    """Cosine, EucDist, MaxAbsErr, MaxRelativeErr and the 0.1% / 0.5% relative-error ratios."""
    n = np.squeeze(np.asarray(target))
    b = np.squeeze(np.asarray(golden))
    if n.size == 0 or b.size == 0:
        return _none("empty tensor: nothing to compare")
    if n.shape != b.shape:
        return _none(f"shapes differ: {tuple(np.shape(target))} vs {tuple(np.shape(golden))}")
    msgs: list[str] = []
    nf, bf = n.astype(np.float64), b.astype(np.float64)
    n_inf, b_inf, n_nan, b_nan = np.isinf(nf), np.isinf(bf), np.isnan(nf), np.isnan(bf)
    if n_inf.any() or b_inf.any() or n_nan.any() or b_nan.any():
        if not (np.array_equal(n_inf, b_inf) and np.array_equal(n_nan, b_nan)):
            return _none("NaN/Inf positions differ between target and golden")
        n, b = n.copy(), b.copy()
        bad = n_inf | n_nan
        n[bad] = 0
        b[bad] = 0
        nf, bf = n.astype(np.float64), b.astype(np.float64)
        msgs.append("NaN/Inf at the same positions were set to 0")
    if n.dtype != b.dtype:
        msgs.append(f"dtypes differ: {n.dtype} vs {b.dtype}")
    rel = relative_error(n, b)
    with np.errstate(invalid="ignore", over="ignore"):
        max_abs = float(np.max(np.abs(nf - bf)))
        max_rel = float(np.max(rel))
    if n.ndim == 0:
        msgs.append("0-d tensor: no Cosine, EucDist or error ratios")
        nan = float("nan")
        return TensorMetrics(nan, nan, max_abs, max_rel, nan, nan, "; ".join(msgs))
    fn, fb = nf.reshape(-1), bf.reshape(-1)
    euc = float(np.linalg.norm(fn - fb, ord=2))
    one = float(np.count_nonzero(rel < THOUSANDTH) / rel.size)
    five = float(np.count_nonzero(rel < FIVE_THOUSANDTHS) / rel.size)
    if n.size == 1:
        cos = float("nan")
        msgs.append("one element: no Cosine")
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            na, nb = float(np.linalg.norm(fn)), float(np.linalg.norm(fb))
            if na <= _EPS64 and nb <= _EPS64:
                cos = 1.0
            elif na <= _EPS64:
                cos = float("nan")
                msgs.append("Cosine: the target tensor is all zero")
            elif nb <= _EPS64:
                cos = float("nan")
                msgs.append("Cosine: the golden tensor is all zero")
            else:
                cos = float(np.dot(fn, fb) / (na * nb))
    if np.isnan(max_abs):
        msgs.append("MaxAbsErr: NaN/Inf in the data")
    return TensorMetrics(cos, euc, max_abs, max_rel, one, five, "; ".join(msgs))


STAT_NAMES = ("max", "min", "mean", "norm")


def stats_diff(target: np.ndarray, golden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Differences ``target - golden`` and relative differences ``|diff / golden| · 100`` (percent) of
    statistics matrices (``N x k``). Equal values (NaN and NaN, Inf and Inf included) give 0; a golden
    value of 0 with a non-zero difference gives Inf; NaN on one side gives NaN.

    >>> d, r = stats_diff(np.array([[2.0, 0.0]]), np.array([[1.0, 0.0]]))
    >>> d.tolist(), r.tolist()
    ([[1.0, 0.0]], [[100.0, 0.0]])
    """
    t = np.asarray(target, dtype=np.float64)
    g = np.asarray(golden, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        diff = t - g
        rel = np.abs(diff / g) * 100.0
        rel = np.where((g == 0) & (diff != 0) & ~np.isnan(diff), np.inf, rel)
    equal = (t == g) | (np.isnan(t) & np.isnan(g))
    diff[equal] = 0.0
    rel[equal] = 0.0
    return diff, rel


def close_report(a: np.ndarray, b: np.ndarray, rtol: float = 1e-4, atol: float = 1e-4,
                 equal_nan: bool = False) -> dict[str, float | bool]:
    """TroubleShooter-style report of two arrays: ``allclose``, ``close_pct`` (% of elements with
    ``|a - b| <= atol + rtol·|b|``), ``cosine``, ``mean_abs_diff``, ``max_abs_diff``."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        nan = float("nan")
        return {"allclose": False, "close_pct": nan, "cosine": nan, "mean_abs_diff": nan, "max_abs_diff": nan}
    af = a.astype(np.float64).reshape(-1)
    bf = b.astype(np.float64).reshape(-1)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.isclose(af, bf, rtol=rtol, atol=atol, equal_nan=equal_nan)
        diff = np.abs(af - bf)
        na, nb = np.linalg.norm(af), np.linalg.norm(bf)
        if na <= _EPS64 and nb <= _EPS64:
            cos = 1.0
        elif na <= _EPS64 or nb <= _EPS64:
            cos = float("nan")
        else:
            cos = float(np.dot(af, bf) / (na * nb))
    n = af.size
    return {
        "allclose": bool(close.all()) if n else True,
        "close_pct": float(close.mean() * 100.0) if n else 100.0,
        "cosine": cos,
        "mean_abs_diff": float(diff.mean()) if n else 0.0,
        "max_abs_diff": float(diff.max()) if n else 0.0,
    }
