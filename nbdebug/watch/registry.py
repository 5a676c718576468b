"""The registry of watchpoint conditions: error codes, categories, parameters, the 17 MindInsight checks.

The 17 conditions are the MindInsight debugger's watchpoint conditions. Numpy-only and
framework-neutral; :mod:`nbdebug.watch.conditions` re-exports everything here.

>>> get_condition("gl").name, len(CONDITIONS)
('gradient too large', 17)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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
    "field": "a statistic or monitor field name",
    "window": "a whole number >= 3",
    "count": "a whole number >= 1",
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
        if self.rule == "field":
            return isinstance(value, str) and bool(value)
        if not math.isfinite(value):
            return False
        if self.rule == "ge0":
            return value >= 0
        if self.rule == "gt0":
            return value > 0
        if self.rule == "percent":
            return 0 <= value <= 100
        if self.rule in ("window", "count"):
            return value == int(value) and value >= (3 if self.rule == "window" else 1)
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
#: the watchpoints over time (:mod:`nbdebug.watch.temporal`): checked on a series' history, not one step
TEMPORAL_CATEGORY = "temporal"


def _field(default: str) -> ParamSpec:
    return ParamSpec("field", default, "field", "option")


_TEMPORAL: tuple[Condition, ...] = (
    Condition("SPIKE", "spike", TEMPORAL_CATEGORY,
              (_field("norm"), ParamSpec("factor", 10.0, "gt0", "check", "ratio_to_median", ">"),
               ParamSpec("window", 50, "window", "option")), "history",
              "|value| is above factor x |median| of the previous window steps"),
    Condition("DRIFT", "drift", TEMPORAL_CATEGORY,
              (_field("norm"), ParamSpec("z", 6.0, "gt0", "check", "abs_z", ">"),
               ParamSpec("window", 200, "window", "option")), "history",
              "|value - mean| / std over the previous window steps is above z"),
    Condition("STALL", "stall", TEMPORAL_CATEGORY,
              (_field("update_ratio"), ParamSpec("below", 1e-8, "ge0", "check", "value", "<"),
               ParamSpec("steps", 20, "count", "option")), "history",
              "the value stayed below the threshold for steps consecutive steps"),
    Condition("ODD_RANK", "odd rank", TEMPORAL_CATEGORY,
              (_field("norm"), ParamSpec("z", 6.0, "gt0", "check", "abs_z_ranks", ">")), "ranks",
              "one rank's value is far from the other ranks' median at the same step (MAD-scaled)"),
)
#: the watchpoints over time by abbreviation (same registry, form and hit list as the 17)
TEMPORAL: dict[str, Condition] = {c.abbr: c for c in _TEMPORAL}
TEMPORAL_ABBREVIATIONS: tuple[str, ...] = tuple(TEMPORAL)
#: every condition: the 17, then the temporal ones
ALL_CONDITIONS: dict[str, Condition] = {**CONDITIONS, **TEMPORAL}

_RANGE = frozenset({"TR", "AR"})
_CHANGE = frozenset({"WCL", "WCS", "WNC"})


def get_condition(condition: str) -> Condition:
    """Look a condition up by abbreviation (case-insensitive).

    >>> get_condition("wnc").name
    'weight not changed'
    """
    key = condition.strip().upper() if isinstance(condition, str) else condition
    try:
        return ALL_CONDITIONS[key]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown condition {condition!r}; expected one of {', '.join(ABBREVIATIONS)} (or over time: "
            f"{', '.join(TEMPORAL_ABBREVIATIONS)})"
        ) from None


def is_temporal(condition: str) -> bool:
    """Whether ``condition`` is a watchpoint over time (SPIKE, DRIFT, STALL, ODD_RANK).

    >>> is_temporal("spike"), is_temporal("GL")
    (True, False)
    """
    return isinstance(condition, str) and condition.strip().upper() in TEMPORAL

