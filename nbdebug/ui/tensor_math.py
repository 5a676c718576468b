"""Numbers behind the tensor view (numpy only): dimension selection, statistics, step comparison.

* A *dimension selection* has one entry per axis: an index (``"3"``, ``"-1"``) that fixes the axis, or a
  slice (``":"``, ``"2:10"``, ``"::4"``) that keeps it free. At most two free axes are shown at once
  (as MindInsight's tensor view): a heatmap is rows × columns.
* Statistics as MindInsight shows them: max, min, mean, count, NaN, −Inf, +Inf, zero, negative zero and
  positive zero counts (true/false counts for bool tensors). Extrema and mean ignore NaN and ±Inf.
* Comparison with the previous step: ``diff = cur − prev``; a tolerance ``t`` in [0, 1] sets to zero the
  elements with ``|diff| <= t · max(|min diff|, |max diff|)``.

>>> import numpy as np
>>> x = np.arange(24.0).reshape(2, 3, 4)
>>> sel = parse_selection(["1", ":", "1:3"], x.shape)
>>> select(x, sel).tolist()
[[13.0, 14.0], [17.0, 18.0], [21.0, 22.0]]
>>> compare(np.array([1.0, 2.0, 3.0]), np.array([1.0, 1.9, 0.0]), tolerance=0.5).tolist()
[0.0, 0.0, 3.0]
>>> tensor_stats(np.array([0.0, -0.0, 1.0, np.inf]))["negative_zero_count"]
1

Statistics are shown the same way everywhere (node details, the tensor view): :func:`stats_from` picks
the basis (the retained values when there are some, else the recorded statistics made NaN-aware, with
the reason the values are missing) and :func:`stat_texts` formats them.

>>> st = stats_from(np.array([np.nan, 0.389687, -np.inf, 0.1]))
>>> stat_texts(st, ("max", "min", "nan_count", "neg_inf_count"))
{'max': '0.389687', 'min': '0.1', 'nan_count': '1', 'neg_inf_count': '1'}
>>> rec = {"max": float("nan"), "min": float("nan"), "mean": float("nan"), "count": 4, "nan_count": 1}
>>> st = stats_from(None, lambda: rec, "values are kept for the current and previous step only")
>>> stat_texts(st, ("max", "nan_count"))["max"]
'n/a'
>>> st["note"]
'values are kept for the current and previous step only'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

#: Statistics shown in the tensor view, in display order.
STAT_FIELDS: tuple[str, ...] = (
    "max", "min", "mean", "count", "nan_count", "neg_inf_count", "pos_inf_count", "zero_count",
    "negative_zero_count", "positive_zero_count",
)
BOOL_FIELDS: tuple[str, ...] = ("count", "true_count", "false_count")

MAX_FREE_AXES = 2
NONFINITE_FIELDS: tuple[str, ...] = ("nan_count", "neg_inf_count", "pos_inf_count")
EXTREMA: tuple[str, ...] = ("max", "min", "mean")


def default_selection(shape: Sequence[int]) -> list[str]:
    """Index 0 on leading axes, the last two axes free.

    >>> default_selection((4, 3, 8, 8))
    ['0', '0', ':', ':']
    """
    n = len(shape)
    return ["0" if i < n - MAX_FREE_AXES else ":" for i in range(n)]


def _parse_one(text: str, axis: int, size: int) -> int | slice:
    t = str(text).strip()
    if t in ("", ":"):
        return slice(None)
    where = f"axis {axis} (size {size})"
    if ":" in t:
        parts = t.split(":")
        if len(parts) > 3:
            raise ValueError(f"{where}: {t!r} is not a slice like 'start:stop' or 'start:stop:step'")
        try:
            nums = [int(p) if p.strip() else None for p in parts]
        except ValueError:
            raise ValueError(f"{where}: {t!r} is not a slice like 'start:stop' or 'start:stop:step'") from None
        while len(nums) < 3:
            nums.append(None)
        if nums[2] is not None and nums[2] <= 0:
            raise ValueError(f"{where}: the step of {t!r} must be a positive integer")
        s = slice(*nums)
        if len(range(*s.indices(size))) == 0:
            raise ValueError(f"{where}: {t!r} selects nothing")
        return s
    try:
        i = int(t)
    except ValueError:
        raise ValueError(f"{where}: {t!r} is neither an index nor a slice (use e.g. 0, -1, :, 2:10)") from None
    if not -size <= i < size:
        raise ValueError(f"{where}: index {i} is out of range [{-size}, {size - 1}]")
    return i


def parse_selection(texts: Sequence[str], shape: Sequence[int]) -> tuple[int | slice, ...]:
    """Parse one entry per axis; ``ValueError`` names the axis and what is wrong.

    >>> parse_selection([":", ":", ":"], (2, 2, 2))
    Traceback (most recent call last):
    ...
    ValueError: 3 free dimensions selected; at most 2 can be shown at once: fix an axis with an index
    """
    if len(texts) != len(shape):
        raise ValueError(f"the tensor has {len(shape)} dimensions, got {len(texts)} selections")
    sel = tuple(_parse_one(t, i, int(n)) for i, (t, n) in enumerate(zip(texts, shape)))  # noqa: B905
    free = sum(isinstance(s, slice) for s in sel)
    if free > MAX_FREE_AXES:
        raise ValueError(f"{free} free dimensions selected; at most {MAX_FREE_AXES} can be shown at once: "
                         f"fix an axis with an index")
    return sel


def selection_text(sel: Sequence[int | slice]) -> str:
    """``[0, :, 3:7]`` style text of a selection."""
    def one(s: int | slice) -> str:
        if isinstance(s, int):
            return str(s)
        a = "" if s.start is None else str(s.start)
        b = "" if s.stop is None else str(s.stop)
        c = "" if s.step in (None, 1) else f":{s.step}"
        return f"{a}:{b}{c}"
    return "[" + ", ".join(one(s) for s in sel) + "]"


def select(values: np.ndarray, sel: Sequence[int | slice]) -> np.ndarray:
    """The selected part as a 2-D array (rows × columns); 0-d and 1-d results become one row."""
    part = np.asarray(values)[tuple(sel)] if len(sel) else np.asarray(values)
    if part.ndim == 0:
        return part.reshape(1, 1)
    if part.ndim == 1:
        return part.reshape(1, -1)
    return part


def compare(current: np.ndarray, previous: np.ndarray, tolerance: float = 0.0) -> np.ndarray:
    """``current − previous`` with the tolerance rule applied (see the module docstring)."""
    if not 0.0 <= float(tolerance) <= 1.0:
        raise ValueError(f"tolerance must be in [0, 1], got {tolerance}")
    cur = np.asarray(current)
    prev = np.asarray(previous)
    if cur.shape != prev.shape:
        raise ValueError(f"cannot compare shapes {cur.shape} (current) and {prev.shape} (previous)")
    if cur.dtype == np.bool_:
        cur = cur.astype(np.int8)
        prev = prev.astype(np.int8)
    work = np.result_type(cur.dtype, prev.dtype, np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = cur.astype(work) - prev.astype(work)
    if tolerance > 0 and diff.size:
        finite = diff[np.isfinite(diff)]
        if finite.size:
            bound = float(tolerance) * max(abs(float(finite.min())), abs(float(finite.max())))
            with np.errstate(invalid="ignore"):
                diff = np.where(np.abs(diff) <= bound, np.zeros((), diff.dtype), diff)
    return diff


def tensor_stats(values: Any) -> dict[str, Any]:
    """Statistics of a whole tensor as the tensor view shows them (see :data:`STAT_FIELDS`)."""
    a = np.asarray(values)
    if a.dtype == np.bool_:
        t = int(np.count_nonzero(a))
        return {"count": int(a.size), "true_count": t, "false_count": int(a.size) - t}
    out: dict[str, Any] = {"count": int(a.size)}
    if np.issubdtype(a.dtype, np.complexfloating):
        a = np.abs(a)
    if np.issubdtype(a.dtype, np.floating):
        nan = np.isnan(a)
        pinf = np.isposinf(a)
        ninf = np.isneginf(a)
        zero = a == 0
        neg_zero = zero & np.signbit(a)
        finite = a[~(nan | pinf | ninf)]
        out.update(nan_count=int(nan.sum()), neg_inf_count=int(ninf.sum()), pos_inf_count=int(pinf.sum()),
                   zero_count=int(zero.sum()), negative_zero_count=int(neg_zero.sum()),
                   positive_zero_count=int(zero.sum() - neg_zero.sum()))
    else:
        finite = a.reshape(-1)
        zero = int(np.count_nonzero(finite == 0))
        out.update(nan_count=0, neg_inf_count=0, pos_inf_count=0, zero_count=zero, negative_zero_count=0,
                   positive_zero_count=zero)
    if finite.size:
        out["max"] = float(finite.max())
        out["min"] = float(finite.min())
        out["mean"] = float(finite.astype(np.float64).mean())
    else:
        out["max"] = out["min"] = out["mean"] = None
    return {k: out[k] for k in STAT_FIELDS}


def fmt(value: Any) -> str:
    """Compact number formatting for tables."""
    if value is None:
        return "–"
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    try:
        return f"{float(value):.6g}"
    except (TypeError, ValueError):
        return str(value)


def recorded_stats(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """Recorded statistics (a dump's or the recorder's, whose max/min/mean include NaN and ±Inf) as the
    NaN-aware view shows them: max/min/mean only where they are the finite ones (no NaN/Inf counted),
    ``None`` (unknown) otherwise; the counts as they are.

    >>> recorded_stats({"max": float("inf"), "min": 0.0, "mean": float("inf"), "pos_inf_count": 2})["max"] is None
    True
    >>> recorded_stats({"max": 3.0, "min": 0.0, "mean": 1.0, "nan_count": 0, "pos_inf_count": 0})["max"]
    3.0
    """
    out = {k: recorded[k] for k in STAT_FIELDS if k in recorded}
    nonfinite = any(_positive(recorded.get(k)) for k in NONFINITE_FIELDS)
    for k in EXTREMA:
        v = out.get(k)
        if nonfinite or v is None or (isinstance(v, float | np.floating) and not np.isfinite(v)):
            out[k] = None
    return out


def _positive(v: Any) -> bool:
    try:
        return float(v) > 0
    except (TypeError, ValueError):
        return False


def stats_from(values: Any, recorded: Callable[[], Mapping[str, Any]] | None = None,
               why: str = "") -> dict[str, Any]:
    """The statistics to show for one tensor at one step: of ``values`` when they are retained
    (:func:`tensor_stats`, ``basis`` "values"); else of ``recorded()`` (:func:`recorded_stats`, ``basis``
    "recorded", ``note`` = ``why`` the values are missing); else ``{"error": why}``."""
    if values is not None:
        out = tensor_stats(values)
        out["basis"] = "values"
        return out
    if recorded is not None:
        try:
            rec = recorded()
        except (LookupError, ValueError) as e:
            return {"error": why or _reason(e), "basis": "none"}
        out = recorded_stats(rec)
        out["basis"] = "recorded"
        out["note"] = why
        return out
    return {"error": why or "no values", "basis": "none"}


def _reason(e: BaseException) -> str:
    return str(e).strip("'\"")


def node_stats(source: Any, node: str, slot: str, step: int | str = "current") -> dict[str, Any]:
    """:func:`stats_from` for ``node``'s ``slot`` at ``step`` of a panel source (``.tensor`` /
    ``.stats``): the one function node details and the tensor view both use."""
    try:
        values = np.asarray(source.tensor(node, slot, step))
        why = ""
    except (LookupError, ValueError) as e:  # NotRetainedError is a LookupError: its text says why
        values, why = None, _reason(e)
    return stats_from(values, lambda: source.stats(node, slot, step), why)


def stat_texts(stats: Mapping[str, Any], fields: Sequence[str] = STAT_FIELDS) -> dict[str, str]:
    """Field -> displayed text: a number (:func:`fmt`), ``n/a`` where a recorded extremum is not the finite
    one, ``–`` where the field is not known at all."""
    out = {}
    for f in fields:
        if "error" in stats:
            out[f] = "–"
        elif f in stats and stats[f] is not None:
            out[f] = fmt(stats[f])
        elif f in EXTREMA and f in stats:
            out[f] = "n/a"
        else:
            out[f] = "–"
    return out
