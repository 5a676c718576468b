"""Watchpoint conditions: the registry of the 17 checks, parameter validation, and evaluation.

The 17 conditions follow the MindInsight debugger (see ``shared/REFERENCE.md`` §1). Everything here is
numpy-only and framework-neutral.

Two evaluation paths:

* :func:`evaluate_stats` works on whole columns of a step's statistics matrix (the ``values`` of a
  :class:`~nbdebug.session.stats.StatsTable`) and answers every parameter that statistics can answer,
  for thousands of rows at once.
* :func:`evaluate_values` (and the helpers it uses) works on the numpy values of one watched tensor and
  answers the rest: value ranges (TR/AR), weight change between steps (WCL/WCS/WNC), the initial value
  (WI) and operator overflow from input/output data (OO).

Both return :class:`Firing` records. A firing lists every parameter that fired as
``Hit(param, threshold, actual)``; when a parameter could not be checked meaningfully the firing carries
an error code (``nan_present``, ``inf_present``, ``no_previous_step``, ``value_not_retained``,
``too_large_to_keep``) and names the parameter in ``unchecked``.

>>> import numpy as np
>>> row = compute_stats(np.array([0.0, 0.0, 0.01, -0.02]))
>>> [f.describe() for f in evaluate_stats("TL", {"abs_mean_gt": 0.0}, row[None, :])]
['TL: abs_mean_gt = 0 set, actual abs_mean = 0.0075']
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from nbdebug.session.stats import COL, FIELDS

# --------------------------------------------------------------------------------------------------
# Error codes
# --------------------------------------------------------------------------------------------------

#: The tensor holds NaN, so a statistic the check needs is NaN (or could not be trusted).
NAN_PRESENT = "nan_present"
#: The tensor holds +Inf/-Inf (and no NaN), so a statistic the check needs is infinite.
INF_PRESENT = "inf_present"
#: A change condition (WCL/WCS/WNC) ran on the first step it saw: there is nothing to compare with.
NO_PREVIOUS_STEP = "no_previous_step"
#: The check needs tensor values that were not kept for this node.
VALUE_NOT_RETAINED = "value_not_retained"
#: The check needs tensor values, but the tensor was over the retention size limit.
TOO_LARGE_TO_KEEP = "too_large_to_keep"

ERROR_CODES: tuple[str, ...] = (
    NAN_PRESENT, INF_PRESENT, NO_PREVIOUS_STEP, VALUE_NOT_RETAINED, TOO_LARGE_TO_KEEP
)

CATEGORIES: tuple[str, ...] = ("tensor", "weight", "gradient", "activation")

# --------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------

_RULE_TEXT = {
    "finite": "a finite number",
    "ge0": ">= 0",
    "gt0": "> 0",
    "percent": "in [0, 100]",
    "bool": "true or false",
}


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of a condition.

    ``role`` is ``"check"`` for a threshold that is tested on its own and reported when it fires, or
    ``"option"`` for a value that shapes a check (range ends, epsilon, tolerances). ``stat`` and ``op``
    say what a check compares (``actual <op> threshold``); ``level`` is ``"stats"`` when the statistics
    row answers it and ``"values"`` when the tensor values are needed.

    >>> get_condition("TZ").param("zero_percentage_ge").range_text
    'in [0, 100]'
    """

    name: str
    default: float | bool | None
    rule: str
    role: str = "check"
    stat: str | None = None
    op: str | None = None
    level: str = "stats"

    @property
    def range_text(self) -> str:
        """Human-readable allowed range, as used in validation messages."""
        return _RULE_TEXT[self.rule]

    def allows(self, value: float) -> bool:
        """Whether an already-numeric ``value`` satisfies this parameter's rule.

        >>> ParamSpec("max_min_gt", None, "gt0").allows(0.0)
        False
        """
        if self.rule == "bool":
            return isinstance(value, (bool, np.bool_))
        if not math.isfinite(value):
            return False
        if self.rule == "ge0":
            return value >= 0
        if self.rule == "gt0":
            return value > 0
        if self.rule == "percent":
            return 0 <= value <= 100
        return True


@dataclass(frozen=True)
class Condition:
    """A watchpoint condition.

    ``needs`` names the data the condition needs beyond one step's statistics: ``"values"`` (TR/AR
    range percentages), ``"previous"`` (WCL/WCS/WNC), ``"initial"`` (WI: the step-0 statistics or
    values), ``"inputs"`` (OO: the statistics of the op's inputs), or ``None``.

    >>> c = get_condition("GV")
    >>> c.name, c.category, c.param_names
    ('gradient vanishing', 'gradient', ('abs_mean_lt', 'max_lt', 'min_lt', 'mean_lt'))
    """

    abbr: str
    name: str
    category: str
    params: tuple[ParamSpec, ...]
    needs: str | None
    summary: str

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> ParamSpec:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.abbr} has no parameter {name!r}")


def _gt(name: str, stat: str, rule: str = "finite", default: float | None = None, level: str = "stats"):
    return ParamSpec(name, default, rule, "check", stat, ">", level)


def _lt(name: str, stat: str, rule: str = "finite", default: float | None = None, level: str = "stats"):
    return ParamSpec(name, default, rule, "check", stat, "<", level)


def _above() -> tuple[ParamSpec, ...]:
    return (
        _gt("abs_mean_gt", "abs_mean", "ge0"),
        _gt("max_gt", "max"),
        _gt("min_gt", "min"),
        _gt("mean_gt", "mean"),
    )


def _below() -> tuple[ParamSpec, ...]:
    return (
        _lt("abs_mean_lt", "abs_mean", "ge0"),
        _lt("max_lt", "max"),
        _lt("min_lt", "min"),
        _lt("mean_lt", "mean"),
    )


def _range() -> tuple[ParamSpec, ...]:
    return (
        ParamSpec("range_start_inclusive", None, "finite", "option", level="values"),
        ParamSpec("range_end_inclusive", None, "finite", "option", level="values"),
        _lt("range_percentage_lt", "range_percentage", "percent", level="values"),
        _gt("range_percentage_gt", "range_percentage", "percent", level="values"),
        _lt("max_min_lt", "max_min", "gt0"),
        _gt("max_min_gt", "max_min", "gt0"),
    )


def _zero_pct(default: float | None = 100.0) -> ParamSpec:
    return ParamSpec("zero_percentage_ge", default, "percent", "check", "zero_percentage", ">=")


def _epsilon() -> ParamSpec:
    return ParamSpec("epsilon", 1e-9, "ge0", "option", level="values")


_ALL: tuple[Condition, ...] = (
    Condition("OO", "operator overflow", "tensor", (), "inputs",
              "an op whose inputs are all finite produced NaN or Inf"),
    Condition("TO", "tensor overflow", "tensor", (), None, "the tensor holds NaN or +/-Inf"),
    Condition("TZ", "tensor all zero", "tensor", (_zero_pct(),), None,
              "the percentage of exact zeros is at or above the threshold"),
    Condition("TR", "tensor value range", "tensor", _range(), "values",
              "the share of values inside a range, or max - min, crosses a threshold"),
    Condition("TL", "tensor too large", "tensor", _above(), None, "a statistic is above its threshold"),
    Condition("TS", "tensor too small", "tensor", _below(), None, "a statistic is below its threshold"),
    Condition("WCL", "weight change too large", "weight",
              (_gt("abs_mean_update_ratio_gt", "abs_mean_update_ratio", "ge0", 0.1, "values"), _epsilon()),
              "previous", "mean(|cur - prev|) / (mean(|prev|) + epsilon) is above the threshold"),
    Condition("WCS", "weight change too small", "weight",
              (_lt("abs_mean_update_ratio_lt", "abs_mean_update_ratio", "ge0", 1e-4, "values"), _epsilon()),
              "previous", "mean(|cur - prev|) / (mean(|prev|) + epsilon) is below the threshold"),
    Condition("WI", "weight initialization", "weight",
              (_zero_pct(), _gt("max_gt", "max"), _lt("min_lt", "min")), "initial",
              "the initial (step 0) value is all zero or out of range"),
    Condition("WNC", "weight not changed", "weight",
              (ParamSpec("rtol", 1e-5, "ge0", "option", level="values"),
               ParamSpec("atol", 1e-8, "ge0", "option", level="values"),
               ParamSpec("equal_nan", False, "bool", "option", level="values")),
              "previous", "every element satisfies |cur - prev| <= atol + rtol * |prev|"),
    Condition("WO", "weight overflow", "weight", (), None, "the weight holds NaN or +/-Inf"),
    Condition("WL", "weight too large", "weight", _above(), None, "a statistic is above its threshold"),
    Condition("WS", "weight too small", "weight", _below(), None, "a statistic is below its threshold"),
    Condition("AR", "activation value range", "activation", _range(), "values",
              "the share of values inside a range, or max - min, crosses a threshold"),
    Condition("GE", "gradient explosion", "gradient", (), None, "the gradient holds NaN or +/-Inf"),
    Condition("GL", "gradient too large", "gradient", _above(), None, "a statistic is above its threshold"),
    Condition("GV", "gradient vanishing", "gradient", _below(), None, "a statistic is below its threshold"),
)

#: The 17 conditions by abbreviation, in MindInsight's order.
CONDITIONS: dict[str, Condition] = {c.abbr: c for c in _ALL}
ABBREVIATIONS: tuple[str, ...] = tuple(CONDITIONS)

_OVERFLOW = frozenset({"OO", "TO", "WO", "GE"})
_RANGE = frozenset({"TR", "AR"})
_CHANGE = frozenset({"WCL", "WCS", "WNC"})


def get_condition(condition: str) -> Condition:
    """Look a condition up by abbreviation (case-insensitive).

    >>> get_condition("wnc").name
    'weight not changed'
    """
    key = condition.strip().upper() if isinstance(condition, str) else condition
    try:
        return CONDITIONS[key]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown condition {condition!r}; expected one of {', '.join(ABBREVIATIONS)}"
        ) from None


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def _show(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _coerce(abbr: str, spec: ParamSpec, value: Any) -> float | bool:
    where = f"{abbr}: parameter {spec.name!r}"
    if spec.rule == "bool":
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"{where} must be true or false, got {_show(value)}")
        return bool(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where} must be a number ({spec.range_text}), got {_show(value)}")
    try:
        x = float(value)
    except OverflowError:
        raise ValueError(f"{where} must be a finite number, got {_show(value)}") from None
    if not math.isfinite(x):
        extra = "" if spec.rule == "finite" else f" {spec.range_text}"
        raise ValueError(f"{where} must be a finite number{extra}, got {_show(value)}")
    if not spec.allows(x):
        raise ValueError(f"{where} must be {spec.range_text}, got {_show(value)}")
    return x


def validate(condition: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Check ``params`` against ``condition`` and return a complete copy with defaults filled in.

    Rules: unknown parameters are refused; ``abs_*`` thresholds, ratios, ``epsilon``, ``rtol`` and
    ``atol`` must be >= 0; ``max_min_*`` must be > 0; percentages must be in [0, 100]; every threshold
    must be a finite number (NaN and +/-Inf are refused); ``range_percentage_*`` needs both range ends
    (and range ends need a ``range_percentage_*``; the start may not exceed the end). A condition with
    parameters needs at least one check: when none is given its default check is used where it has one
    (TZ, WCL, WCS, WI), otherwise it is an error. Options (``epsilon``, ``rtol``, ``atol``,
    ``equal_nan``) always get their defaults. Keys whose value is ``None`` count as not given.

    >>> validate("WCL", {})
    {'abs_mean_update_ratio_gt': 0.1, 'epsilon': 1e-09}
    >>> validate("TL", {"abs_mean_gt": -1})
    Traceback (most recent call last):
    ...
    ValueError: TL: parameter 'abs_mean_gt' must be >= 0, got -1
    """
    cond = get_condition(condition)
    abbr = cond.abbr
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        kind = type(params).__name__
        raise ValueError(f"{abbr}: parameters must be a mapping of name to value, got {kind}")
    given = {k: v for k, v in params.items() if v is not None}
    if not cond.params:
        if given:
            raise ValueError(f"{abbr}: takes no parameters, got {', '.join(map(str, given))}")
        return {}
    allowed = cond.param_names
    for key in given:
        if key not in allowed:
            raise ValueError(f"{abbr}: unknown parameter {key!r}; allowed: {', '.join(allowed)}")
    out: dict[str, Any] = {s.name: _coerce(abbr, s, given[s.name]) for s in cond.params if s.name in given}

    checks = [s for s in cond.params if s.role == "check"]
    if checks and not any(s.name in out for s in checks):
        defaults = [s for s in checks if s.default is not None]
        if not defaults:
            raise ValueError(
                f"{abbr}: at least one parameter is needed; choose from {', '.join(s.name for s in checks)}"
            )
        for s in defaults:
            out[s.name] = s.default
    for s in cond.params:
        if s.role == "option" and s.name not in out and s.default is not None:
            out[s.name] = s.default

    if abbr in _RANGE:
        wants_range = "range_percentage_lt" in out or "range_percentage_gt" in out
        start, end = out.get("range_start_inclusive"), out.get("range_end_inclusive")
        if wants_range and (start is None or end is None):
            raise ValueError(
                f"{abbr}: range_percentage_* needs both range_start_inclusive and range_end_inclusive"
            )
        if not wants_range and (start is not None or end is not None):
            raise ValueError(
                f"{abbr}: range_start_inclusive/range_end_inclusive are only used with "
                "range_percentage_lt or range_percentage_gt; give one of them"
            )
        if wants_range and start > end:
            raise ValueError(
                f"{abbr}: parameter 'range_start_inclusive' must be <= range_end_inclusive, "
                f"got {start!r} > {end!r}"
            )
    return {s.name: out[s.name] for s in cond.params if s.name in out}


def split_params(condition: str, params: Mapping[str, Any] | None = None) -> tuple[dict, dict]:
    """Validate and split ``params`` into (answerable from statistics, needs tensor values).

    Range ends go with the range percentages, ``epsilon`` with the change ratio, and all WNC options to
    the value side. Conditions without parameters return two empty dicts.

    >>> split_params("TR", {"max_min_gt": 1, "range_percentage_lt": 5,
    ...                     "range_start_inclusive": 0, "range_end_inclusive": 1})
    ({'max_min_gt': 1.0}, {'range_start_inclusive': 0.0, 'range_end_inclusive': 1.0, \
'range_percentage_lt': 5.0})
    """
    cond = get_condition(condition)
    p = validate(cond.abbr, params)
    stats = {k: v for k, v in p.items() if cond.param(k).level == "stats"}
    values = {k: v for k, v in p.items() if cond.param(k).level == "values"}
    return stats, values


def needs(condition: str, params: Mapping[str, Any] | None = None) -> str | None:
    """What a condition with these parameters needs beyond the current step's statistics.

    Same vocabulary as :attr:`Condition.needs`, but narrowed by the parameters: TR/AR with only
    ``max_min_*`` need nothing more.

    >>> needs("TR", {"max_min_lt": 1e-6}), needs("AR", {"range_percentage_gt": 99.9,
    ...     "range_start_inclusive": -1, "range_end_inclusive": 0}), needs("WNC")
    (None, 'values', 'previous')
    """
    cond = get_condition(condition)
    if cond.abbr in _RANGE:
        return "values" if split_params(cond.abbr, params)[1] else None
    return cond.needs


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
        if self.param in _COUNT_PARAMS:
            return f"{self.param} = {_num(self.actual)} (> 0)"
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
    sub = values if row_ids is None else values[row_ids]
    n = sub.shape[0]

    if abbr in _OVERFLOW:
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

    checks = [cond.param(k) for k in p if cond.param(k).role == "check" and cond.param(k).level == "stats"]
    value_checks = tuple(k for k in p if cond.param(k).role == "check" and cond.param(k).level == "values")
    report_missing = bool(value_checks) and missing is not None
    if n == 0 or (not checks and not report_missing):
        return []

    count = sub[:, _C_COUNT]
    nonempty = count > 0
    nan_c = sub[:, _C_NAN]
    inf_c = sub[:, _C_PINF] + sub[:, _C_NINF]
    naninf = (nan_c > 0) | (inf_c > 0)

    fired = report_missing_mask = nonempty if report_missing else np.zeros(n, dtype=bool)
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
    names = [s.name for s in checks]
    thresholds = [p[k] for k in names]
    k = len(checks)
    # One integer per fired row says which parameters hit (bits 0..k-1), which could not be checked
    # (bits k..2k-1), whether value-level parameters are reported missing (bit 2k) and whether the
    # tensor has Inf but no NaN (bit 2k+1). Rows sharing a pattern are built together below.
    code = report_missing_mask[idx].astype(np.int64) << (2 * k)
    code |= ((nan_c[idx] == 0) & (inf_c[idx] > 0)).astype(np.int64) << (2 * k + 1)
    if k:
        weights = np.left_shift(1, np.arange(2 * k, dtype=np.int64))
        code |= np.concatenate([np.stack(hit_masks)[:, idx], np.stack(bad_masks)[:, idx]]).T @ weights
        xs_all = np.stack(actuals)[:, idx]
    patterns = np.unique(code).tolist()

    out: list[Any] = [None] * idx.size
    for c in patterns:
        pos = np.flatnonzero(code == c) if len(patterns) > 1 else np.arange(idx.size)
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
