"""Watchpoint conditions: the registry of the 17 checks, parameter validation, and evaluation.

The 17 conditions are the MindInsight debugger's watchpoint conditions. Everything here is
numpy-only and framework-neutral. This module is the one place to import them from; the code lives in
:mod:`~nbdebug.watch.registry` (conditions, parameters, error codes), :mod:`~nbdebug.watch.validation`,
:mod:`~nbdebug.watch.firing` (results), :mod:`~nbdebug.watch.stats_eval` (statistics matrix) and
:mod:`~nbdebug.watch.values_eval` (tensor values).

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

from .firing import Firing, Hit
from .registry import (
    ABBREVIATIONS,
    ALL_CONDITIONS,
    CATEGORIES,
    CONDITIONS,
    ERROR_CODES,
    INF_PRESENT,
    NAN_PRESENT,
    NO_PREVIOUS_STEP,
    TEMPORAL,
    TEMPORAL_ABBREVIATIONS,
    TEMPORAL_CATEGORY,
    TOO_LARGE_TO_KEEP,
    VALUE_NOT_RETAINED,
    Condition,
    ParamSpec,
    get_condition,
    is_temporal,
)
from .stats_eval import evaluate_stats
from .validation import needs, split_params, validate
from .values_eval import (
    compute_stats,
    evaluate_values,
    operator_overflow,
    percentage_in_range,
    tensor_range,
    weight_change,
    weight_change_ratio,
    weight_initialization,
    weight_not_changed,
)

__all__ = [
    "ABBREVIATIONS", "ALL_CONDITIONS", "CATEGORIES", "TEMPORAL", "TEMPORAL_ABBREVIATIONS", "TEMPORAL_CATEGORY",
    "is_temporal", "CONDITIONS", "ERROR_CODES", "INF_PRESENT", "NAN_PRESENT", "NO_PREVIOUS_STEP",
    "TOO_LARGE_TO_KEEP", "VALUE_NOT_RETAINED", "Condition", "Firing", "Hit", "ParamSpec", "compute_stats",
    "evaluate_stats", "evaluate_values", "get_condition", "needs", "operator_overflow", "percentage_in_range",
    "split_params", "tensor_range", "validate", "weight_change", "weight_change_ratio", "weight_initialization",
    "weight_not_changed",
]
