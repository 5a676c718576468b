"""Parameter validation of watchpoint conditions: defaults, ranges, and the statistics/values split.

>>> validate("TZ", {})
{'zero_percentage_ge': 100.0}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from nbdebug.session.monitor import ALL_FIELDS as MONITOR_FIELDS
from nbdebug.session.stats import FIELDS as STATS_FIELDS

from .registry import _RANGE, ParamSpec, get_condition

#: what a temporal watchpoint's ``field`` may name: a per-tensor statistic or a monitor series field
SERIES_FIELDS: tuple[str, ...] = (*STATS_FIELDS, "nonfinite_count", *sorted(MONITOR_FIELDS))

# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------


def _show(value: Any) -> str:
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _coerce(abbr: str, spec: ParamSpec, value: Any) -> float | bool | str:
    where = f"{abbr}: parameter {spec.name!r}"
    if spec.rule == "field":
        if not isinstance(value, str) or value not in SERIES_FIELDS:
            raise ValueError(f"{where} must be a statistic or a monitor field, one of {', '.join(SERIES_FIELDS)}; "
                             f"got {_show(value)}")
        return value
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
    return int(x) if spec.rule in ("window", "count") else x


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

