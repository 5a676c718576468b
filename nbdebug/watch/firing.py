"""What a condition reports: :class:`Hit` (a parameter that fired) and :class:`Firing` (one row's result).

>>> Firing("GL", 0, (Hit("max_gt", 1.0, 2.0),)).describe()
'GL: max_gt = 1 set, actual max = 2'
"""

from __future__ import annotations

from typing import NamedTuple

from .registry import INF_PRESENT, NAN_PRESENT, NO_PREVIOUS_STEP, TOO_LARGE_TO_KEEP, VALUE_NOT_RETAINED

# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------

_COUNT_PARAMS = ("nan_count", "pos_inf_count", "neg_inf_count")


def _stat_of(param: str) -> str:
    for suffix in ("_gt", "_lt", "_ge"):
        if param.endswith(suffix):
            return param[: -len(suffix)]
    return param


def _num(x: float) -> str:
    return f"{x:.4g}"


def _count(x: float) -> str:
    """
    >>> _count(65536.0), _count(3), _count(float("nan"))
    ('65536', '3', 'nan')
    """
    return str(int(x)) if x == x and abs(x) != float("inf") and float(x).is_integer() else _num(x)


class Hit(NamedTuple):
    """One parameter that fired: the threshold that was set and the actual value.

    For TO/WO/GE/OO the "parameters" are the counts (``nan_count``, ``pos_inf_count``,
    ``neg_inf_count``) with threshold 0. For WNC they are ``rtol`` and ``atol`` with the largest
    relative and absolute change seen.

    >>> Hit("abs_mean_gt", 0.0, 0.0079).describe()
    'abs_mean_gt = 0 set, actual abs_mean = 0.0079'
    """

    param: str
    threshold: float
    actual: float

    def describe(self) -> str:
        if self.param in _COUNT_PARAMS:  # a count reads as a whole number: 65536, never 6.554e+04
            return f"{self.param} = {_count(self.actual)} (> 0)"
        if self.param in ("rtol", "atol"):
            what = "relative" if self.param == "rtol" else "absolute"
            return f"{self.param} = {_num(self.threshold)} set, largest {what} change = {_num(self.actual)}"
        stat = _stat_of(self.param)
        return f"{self.param} = {_num(self.threshold)} set, actual {stat} = {_num(self.actual)}"


_ERROR_TEXT = {
    NAN_PRESENT: "NaN present",
    INF_PRESENT: "Inf present",
    NO_PREVIOUS_STEP: "no previous step",
    VALUE_NOT_RETAINED: "value not retained",
    TOO_LARGE_TO_KEEP: "tensor too large to keep",
}


class Firing(NamedTuple):
    """A condition that fired on one row (or could not be evaluated there).

    ``row`` is the row index into the stats matrix (``-1`` when evaluated outside a table). ``hits``
    lists every parameter that fired; ``error`` is one of :data:`ERROR_CODES` or ``None``; ``unchecked``
    names the parameters the error kept from being checked. A firing may carry hits *and* an error
    (some parameters fired, others could not be checked).

    >>> Firing("TL", 3, (), NAN_PRESENT, ("max_gt",)).describe()
    'TL: could not check max_gt (NaN present)'
    """

    condition: str
    row: int
    hits: tuple[Hit, ...]
    error: str | None = None
    unchecked: tuple[str, ...] = ()

    @property
    def hit(self) -> bool:
        """True when at least one parameter fired (as opposed to an error-only firing)."""
        return bool(self.hits)

    def describe(self) -> str:
        parts = [h.describe() for h in self.hits]
        if self.error is not None:
            why = _ERROR_TEXT.get(self.error, self.error)
            parts.append(f"could not check {', '.join(self.unchecked)} ({why})" if self.unchecked else why)
        return f"{self.condition}: " + "; ".join(parts)

