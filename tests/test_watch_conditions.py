"""Watch conditions against an independent pure-Python oracle, on adversarial tensors.

Stats rows are built here with numpy directly (two conventions for NaN: propagate like torch, or ignore
NaN like nanmax; two fills for empty tensors), the oracle recomputes every statistic from the elements
with Python floats and decides each parameter on its own.
"""

from __future__ import annotations

import doctest
import math
import time
import warnings

import numpy as np
import pytest

from nbdebug.session.stats import FIELDS
from nbdebug.watch import conditions as C
from nbdebug.watch import guide, recommend
from nbdebug.watch.conditions import (
    ABBREVIATIONS,
    CONDITIONS,
    Firing,
    Hit,
    compute_stats,
    evaluate_stats,
    evaluate_values,
    operator_overflow,
    percentage_in_range,
    split_params,
    tensor_range,
    validate,
    weight_change,
    weight_change_ratio,
    weight_not_changed,
)
from nbdebug.watch.guide import advice
from nbdebug.watch.recommend import Target, recommended

INF = math.inf
NAN = math.nan

# --------------------------------------------------------------------------------------------------
# Adversarial tensors and stats rows built with numpy
# --------------------------------------------------------------------------------------------------

_rng = np.random.default_rng(1234)

TENSORS: dict[str, np.ndarray] = {
    "normal": _rng.normal(size=50),
    "positive": _rng.uniform(0.5, 2.0, size=30),
    "nan": np.array([1.0, NAN, -2.0, 0.0]),
    "pinf": np.array([1.0, INF, 0.0]),
    "ninf": np.array([-INF, 3.0, 0.0, 0.0]),
    "both_inf": np.array([INF, -INF, 1.0]),
    "nan_inf": np.array([NAN, INF, -1.0]),
    "all_nan": np.array([NAN, NAN]),
    "all_zero": np.zeros(7),
    "signed_zero": np.array([-0.0, 0.0, -0.0]),
    "empty": np.zeros(0),
    "empty_2d": np.zeros((3, 0)),
    "constant": np.full(5, 3.0),
    "neg_constant": np.full((2, 2), -0.25),
    "tiny": np.array([1e-30, -2e-30, 5e-310, 0.0]),
    "huge": np.array([1e300, -5e299, 2e300]),
    "ints": np.array([0, 3, -7, 0, 12], dtype=np.int64),
    "int8": np.array([-128, 127, 0], dtype=np.int8),
    "uint8": np.array([0, 255, 1], dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "float32": (_rng.normal(size=20) * 1e3).astype(np.float32),
    "float16_inf": np.array([65504.0, np.inf, -1.0], dtype=np.float16),
    "single": np.array([-2.5]),
    "half_zero": np.array([0.0, 0.0, 1.0, -1.0]),
}
NAMES = list(TENSORS)


def np_stats(a: np.ndarray, convention: str = "propagate", empty_fill: float = 0.0) -> np.ndarray:
    """One stats row in FIELDS order, computed with numpy in the test."""
    x = np.asarray(a).astype(np.float64).ravel()
    n = x.size
    counts = {
        "zero_count": float(np.sum(x == 0)),
        "nan_count": float(np.sum(np.isnan(x))),
        "pos_inf_count": float(np.sum(np.isposinf(x))),
        "neg_inf_count": float(np.sum(np.isneginf(x))),
        "count": float(n),
    }
    if n == 0:
        st = dict.fromkeys(("max", "min", "mean", "abs_mean", "norm"), empty_fill)
    else:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if convention == "propagate":
                st = {
                    "max": np.max(x),
                    "min": np.min(x),
                    "mean": np.mean(x),
                    "abs_mean": np.mean(np.abs(x)),
                    "norm": np.linalg.norm(x),
                }
            else:
                st = {
                    "max": np.nanmax(x),
                    "min": np.nanmin(x),
                    "mean": np.nanmean(x),
                    "abs_mean": np.nanmean(np.abs(x)),
                    "norm": np.linalg.norm(x[~np.isnan(x)]),
                }
    st.update(counts)
    return np.array([float(st[f]) for f in FIELDS])


def matrix(convention: str = "propagate", empty_fill: float = 0.0) -> np.ndarray:
    return np.stack([np_stats(TENSORS[k], convention, empty_fill) for k in NAMES])


CONVENTIONS = [("propagate", 0.0), ("propagate", NAN), ("ignore", 0.0), ("ignore", NAN)]

# --------------------------------------------------------------------------------------------------
# The oracle: Python floats, element by element
# --------------------------------------------------------------------------------------------------


def elems(a: np.ndarray) -> list[float]:
    return [float(v) for v in np.asarray(a).ravel().tolist()]


def o_stat(xs: list[float], stat: str, convention: str) -> float:
    if stat == "max_min":
        return o_stat(xs, "max", convention) - o_stat(xs, "min", convention)
    vals = [x for x in xs if not (convention == "ignore" and math.isnan(x))]
    if not vals or any(math.isnan(x) for x in vals):
        return NAN
    has_pos = any(x == INF for x in vals)
    has_neg = any(x == -INF for x in vals)
    if stat == "max":
        return max(vals)
    if stat == "min":
        return min(vals)
    if stat == "mean":
        if has_pos and has_neg:
            return NAN
        if has_pos or has_neg:
            return INF if has_pos else -INF
        return math.fsum(vals) / len(vals)
    if stat == "abs_mean":
        if has_pos or has_neg:
            return INF
        return math.fsum(abs(x) for x in vals) / len(vals)
    raise AssertionError(stat)


OPS = {"gt": lambda v, t: v > t, "lt": lambda v, t: v < t, "ge": lambda v, t: v >= t}


def oracle(xs: list[float], param: str, t: float, convention: str):
    """('none'|'hit'|'error', actual or error code) for one statistics-level parameter."""
    if not xs:
        return ("none", None)
    stat, op = param.rsplit("_", 1)
    if stat == "zero_percentage":
        v = 100.0 * sum(1 for x in xs if x == 0) / len(xs)
        return ("hit", v) if OPS[op](v, t) else ("none", None)
    v = o_stat(xs, stat, convention)
    has_nan = any(math.isnan(x) for x in xs)
    has_inf = any(math.isinf(x) for x in xs)
    if math.isnan(v) and (has_nan or has_inf):  # an infinite statistic is compared as it is
        return ("error", "inf_present" if (has_inf and not has_nan) else "nan_present")
    if math.isnan(v):
        return ("none", None)
    return ("hit", v) if OPS[op](v, t) else ("none", None)


def thresholds(param: str, xs_all: list[list[float]]) -> list[float]:
    stat = param.rsplit("_", 1)[0]
    if stat == "zero_percentage":
        return [0.0, 10.0, 25.0, 50.0, 99.9, 100.0, 100.0 / 3, 200.0 / 3]
    if stat == "max_min":
        return [1e-31, 1e-9, 1.0, 5.0, 20.0, 1e301]
    if stat == "abs_mean":
        return [0.0, 1e-31, 1e-9, 0.5, 1.0, 3.0, 10.0, 1e301]
    grid = [-1e301, -10.0, -1.0, -1e-30, 0.0, 1e-30, 0.5, 1.0, 3.0, 10.0, 1e301]
    # exact boundaries: every finite max/min of the tensors (strict comparisons must not fire on equality)
    for xs in xs_all:
        fin = [x for x in xs if math.isfinite(x)]
        if fin:
            grid += [max(fin), min(fin)]
    return sorted(set(grid))


STATS_CONDS = {
    "TZ": ["zero_percentage_ge"],
    "TL": ["abs_mean_gt", "max_gt", "min_gt", "mean_gt"],
    "WL": ["abs_mean_gt", "max_gt", "min_gt", "mean_gt"],
    "GL": ["abs_mean_gt", "max_gt", "min_gt", "mean_gt"],
    "TS": ["abs_mean_lt", "max_lt", "min_lt", "mean_lt"],
    "WS": ["abs_mean_lt", "max_lt", "min_lt", "mean_lt"],
    "GV": ["abs_mean_lt", "max_lt", "min_lt", "mean_lt"],
    "WI": ["zero_percentage_ge", "max_gt", "min_lt"],
    "TR": ["max_min_lt", "max_min_gt"],
    "AR": ["max_min_lt", "max_min_gt"],
}


def by_row(firings: list[Firing]) -> dict[int, Firing]:
    out = {f.row: f for f in firings}
    assert len(out) == len(firings), "one firing per row"
    return out


# --------------------------------------------------------------------------------------------------
# Statistics-level conditions, one parameter at a time, every tensor, every convention
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("convention,empty_fill", CONVENTIONS)
@pytest.mark.parametrize("cond", list(STATS_CONDS))
def test_single_parameter_matches_oracle(cond, convention, empty_fill):
    m = matrix(convention, empty_fill)
    xs_all = [elems(TENSORS[k]) for k in NAMES]
    for param in STATS_CONDS[cond]:
        for t in thresholds(param, xs_all):
            got = by_row(evaluate_stats(cond, {param: t}, m))
            for i, xs in enumerate(xs_all):
                kind, val = oracle(xs, param, t, convention)
                where = f"{cond} {param}={t} on {NAMES[i]} ({convention}, empty={empty_fill})"
                f = got.get(i)
                if kind == "none":
                    assert f is None, where
                    continue
                assert f is not None, where
                assert f.condition == cond and f.row == i, where
                if kind == "hit":
                    assert f.error is None and f.unchecked == (), where
                    assert len(f.hits) == 1, where
                    h = f.hits[0]
                    assert (h.param, h.threshold) == (param, t), where
                    assert math.isclose(h.actual, val, rel_tol=1e-9, abs_tol=1e-300), where
                else:
                    assert f.hits == () and f.error == val and f.unchecked == (param,), where


@pytest.mark.parametrize("convention,empty_fill", CONVENTIONS)
@pytest.mark.parametrize("cond", ["TL", "TS", "GV", "WI", "TR"])
def test_all_parameters_together_report_each_that_fired(cond, convention, empty_fill):
    m = matrix(convention, empty_fill)
    rng = np.random.default_rng(7)
    for _ in range(40):
        params = {}
        for p in STATS_CONDS[cond]:
            stat = p.rsplit("_", 1)[0]
            if stat in ("abs_mean", "max_min"):
                params[p] = float(rng.choice([1e-9, 0.5, 1.0, 4.0]))
            elif stat == "zero_percentage":
                params[p] = float(rng.choice([0.0, 40.0, 100.0]))
            else:
                params[p] = float(rng.choice([-3.0, -0.5, 0.0, 0.7, 2.0]))
        got = by_row(evaluate_stats(cond, params, m))
        for i, k in enumerate(NAMES):
            xs = elems(TENSORS[k])
            res = {p: oracle(xs, p, t, convention) for p, t in params.items()}
            want_hits = [p for p in params if res[p][0] == "hit"]
            want_bad = [p for p in params if res[p][0] == "error"]
            f = got.get(i)
            if not want_hits and not want_bad:
                assert f is None, (k, params)
                continue
            assert [h.param for h in f.hits] == want_hits, (k, params)
            assert list(f.unchecked) == want_bad, (k, params)
            for h in f.hits:
                assert h.threshold == params[h.param]
                assert math.isclose(h.actual, res[h.param][1], rel_tol=1e-9, abs_tol=1e-300)
            if want_bad:
                assert f.error == res[want_bad[0]][1]
            else:
                assert f.error is None


@pytest.mark.parametrize("convention,empty_fill", CONVENTIONS)
@pytest.mark.parametrize("cond", ["TO", "WO", "GE"])
def test_overflow_conditions(cond, convention, empty_fill):
    m = matrix(convention, empty_fill)
    got = by_row(evaluate_stats(cond, {}, m))
    for i, k in enumerate(NAMES):
        xs = elems(TENSORS[k])
        want = [
            ("nan_count", float(sum(math.isnan(x) for x in xs))),
            ("pos_inf_count", float(sum(x == INF for x in xs))),
            ("neg_inf_count", float(sum(x == -INF for x in xs))),
        ]
        want = [(p, 0.0, c) for p, c in want if c > 0]
        if not want:
            assert i not in got, k
        else:
            assert got[i].hits == tuple(want), k
            assert got[i].error is None


def test_overflow_params_refused():
    with pytest.raises(ValueError, match="TO: takes no parameters"):
        validate("TO", {"max_gt": 1})


def test_operator_overflow_stats_and_values():
    m = matrix()
    n = len(NAMES)
    flags = np.array([i % 2 == 0 for i in range(n)])
    got = by_row(evaluate_stats("OO", {}, m, inputs_finite=flags))
    for i, k in enumerate(NAMES):
        xs = elems(TENSORS[k])
        bad = any(math.isnan(x) or math.isinf(x) for x in xs)
        assert (i in got) == (bad and flags[i]), k
    with pytest.raises(ValueError, match="inputs_finite"):
        evaluate_stats("OO", {}, m)
    with pytest.raises(ValueError, match="flags"):
        evaluate_stats("OO", {}, m, inputs_finite=[True])

    fin = compute_stats([1.0, 2.0])
    nan_in = compute_stats([NAN])
    out_inf = compute_stats([INF, -INF, NAN, 0.0])
    f = operator_overflow(fin[None], out_inf[None])
    assert f.hits == (
        Hit("nan_count", 0.0, 1.0),
        Hit("pos_inf_count", 0.0, 1.0),
        Hit("neg_inf_count", 0.0, 1.0),
    )
    assert operator_overflow(np.stack([fin, nan_in]), out_inf[None]) is None  # propagated, not created
    assert operator_overflow(fin[None], fin[None]) is None
    assert operator_overflow(np.zeros((0, len(FIELDS))), out_inf[None]) is not None
    # evaluate_values: arrays in, several outputs
    f = evaluate_values(
        "OO", current=[np.array([1.0]), np.array([np.inf])], inputs=[np.array([1e308])], row=4
    )
    assert f.row == 4 and f.hits == (Hit("pos_inf_count", 0.0, 1.0),)
    assert evaluate_values("OO", current=np.array([np.inf]), inputs=[np.array([np.inf])]) is None
    assert evaluate_values("OO", current=np.array([1.0]), inputs=[np.array([2.0])]) is None


def test_rows_subset_and_indices():
    m = matrix()
    rows = [NAMES.index("all_zero"), NAMES.index("normal"), NAMES.index("empty"), NAMES.index("signed_zero")]
    got = evaluate_stats("TZ", {}, m, rows=np.array(rows))
    assert [f.row for f in got] == [NAMES.index("all_zero"), NAMES.index("signed_zero")]
    assert evaluate_stats("TZ", {}, m, rows=[]) == []
    assert evaluate_stats("TZ", {}, np.zeros((0, len(FIELDS)))) == []
    with pytest.raises(ValueError, match="shape"):
        evaluate_stats("TZ", {}, np.zeros((3, 4)))
    # a single row may be passed as a vector
    assert evaluate_stats("TZ", {}, np_stats(np.zeros(3)))[0].row == 0


def test_empty_tensors_never_fire():
    for fill in (0.0, NAN, INF):
        row = np_stats(np.zeros(0), empty_fill=fill)[None]
        for cond, params in STATS_CONDS.items():
            for p in params:
                t = 0.0 if p.endswith("_ge") else (1.0 if "max_min" in p else 0.5)
                assert evaluate_stats(cond, {p: t}, row) == [], (cond, p, fill)
        for cond in ("TO", "WO", "GE"):
            assert evaluate_stats(cond, {}, row) == []


def test_unsupported_nan_row_never_fires():
    # adapters write NaN statistics with zero NaN/Inf counts for dtypes they cannot reduce
    row = np.array([[NAN] * 5 + [0.0, 0.0, 0.0, 0.0, 6.0]])
    for cond, params in STATS_CONDS.items():
        for p in params:
            if p != "zero_percentage_ge":
                assert evaluate_stats(cond, {p: 1.0}, row) == [], (cond, p)
    for cond in ("TO", "WO", "GE"):
        assert evaluate_stats(cond, {}, row) == []


def test_stats_table_input_skips_unsupported_rows():
    from nbdebug.session.stats import StatsTable

    m = matrix()
    keys = [(k, "output.0") for k in NAMES]
    table = StatsTable.from_rows(keys, ["float64"] * len(NAMES), [TENSORS[k].shape for k in NAMES], m)
    nan_row = NAMES.index("nan")
    table.unsupported = {nan_row: "unsupported: test"}
    assert nan_row in {f.row for f in evaluate_stats("TO", {}, m)}
    assert nan_row not in {f.row for f in evaluate_stats("TO", {}, table)}
    assert [f.row for f in evaluate_stats("TO", {}, table)] == [
        f.row for f in evaluate_stats("TO", {}, m) if f.row != nan_row
    ]
    rows = [nan_row, NAMES.index("pinf")]
    assert [f.row for f in evaluate_stats("TO", {}, table, rows)] == [NAMES.index("pinf")]
    flags = np.ones(len(NAMES), dtype=bool)
    got = evaluate_stats("OO", {}, table, inputs_finite=flags)
    assert nan_row not in {f.row for f in got} and NAMES.index("pinf") in {f.row for f in got}
    assert [f.row for f in evaluate_stats("OO", {}, table, rows, inputs_finite=[True, True])] == [rows[1]]


def test_inf_statistic_without_inf_elements_is_compared():
    # float64 overflow of the mean itself: no NaN/Inf in the tensor, so the comparison stands
    a = np.array([1e308, 1e308])
    row = np_stats(a)
    assert math.isinf(row[FIELDS.index("mean")])
    f = evaluate_stats("TL", {"mean_gt": 1.0}, row[None])[0]
    assert f.error is None and f.hits[0].actual == INF


# --------------------------------------------------------------------------------------------------
# missing=, split_params, needs
# --------------------------------------------------------------------------------------------------


def test_missing_value_level_params():
    m = matrix()
    params = {
        "range_percentage_lt": 5,
        "range_start_inclusive": -1,
        "range_end_inclusive": 1,
        "max_min_gt": 10,
    }
    plain = evaluate_stats("TR", params, m)
    assert all(f.unchecked in ((), ("max_min_gt",)) for f in plain)
    got = by_row(evaluate_stats("TR", params, m, missing=C.VALUE_NOT_RETAINED))
    for i, k in enumerate(NAMES):
        if TENSORS[k].size == 0:
            assert i not in got
            continue
        f = got[i]
        assert "range_percentage_lt" in f.unchecked
        assert f.error in (C.VALUE_NOT_RETAINED, C.NAN_PRESENT, C.INF_PRESENT)
    assert by_row(evaluate_stats("WCL", {}, m, missing=C.NO_PREVIOUS_STEP))[0].error == C.NO_PREVIOUS_STEP
    assert evaluate_stats("WCL", {}, m) == []
    assert evaluate_stats("WNC", {}, m) == []
    with pytest.raises(ValueError, match="missing must be one of"):
        evaluate_stats("TR", params, m, missing="oops")


def test_split_and_needs():
    s, v = split_params(
        "AR",
        {"max_min_lt": 1, "range_percentage_gt": 2, "range_start_inclusive": 0, "range_end_inclusive": 1},
    )
    assert s == {"max_min_lt": 1.0}
    assert set(v) == {"range_percentage_gt", "range_start_inclusive", "range_end_inclusive"}
    assert split_params("WCL", {}) == ({}, {"abs_mean_update_ratio_gt": 0.1, "epsilon": 1e-9})
    assert C.needs("TR", {"max_min_gt": 1}) is None
    assert C.needs("OO") == "inputs" and C.needs("WI") == "initial" and C.needs("WCS") == "previous"
    assert C.needs("TL", {"max_gt": 1}) is None


# --------------------------------------------------------------------------------------------------
# Value-level functions
# --------------------------------------------------------------------------------------------------


def o_pct(xs, start, end):
    return 100.0 * sum(1 for x in xs if start <= x <= end) / len(xs)


RANGES = [
    (-1.0, 0.0),
    (0.0, 0.0),
    (-INF, INF),
    (math.tanh(-8.8), math.tanh(8.8)),
    (1e-31, 1e301),
    (-3.0, 3.0),
]


@pytest.mark.parametrize("name", NAMES)
def test_percentage_in_range(name):
    xs = elems(TENSORS[name])
    for lo, hi in RANGES:
        got = percentage_in_range(TENSORS[name], lo, hi)
        if not xs:
            assert math.isnan(got)
        else:
            assert math.isclose(got, o_pct(xs, lo, hi), rel_tol=1e-12)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_percentage_in_range_low_precision_ends_are_exact(dtype):
    # The float64 range ends must not be rounded to the array's dtype: tanh(8.8) rounds to 1.0 in float16,
    # which would count saturated values as inside.
    ends = [math.tanh(-8.8), math.tanh(8.8), 1 / (1 + math.exp(16.2)), 1e-31, -1e-31, 1e30, 0.1, -0.3]
    raw = [-1.0, 1.0, 0.99999994, -0.99999994, 9.2e-8, 9.3e-8, 6e-8, 0.1, -0.3, 0.0, 1e30, np.inf]
    with np.errstate(over="ignore"):
        vals = np.array(raw, dtype=np.float64).astype(dtype)
    xs = elems(vals)
    for lo in ends:
        for hi in ends:
            if lo <= hi:
                assert percentage_in_range(vals, lo, hi) == pytest.approx(o_pct(xs, lo, hi), rel=1e-12), (
                    lo,
                    hi,
                )


@pytest.mark.parametrize("cond", ["TR", "AR"])
@pytest.mark.parametrize("name", NAMES)
def test_range_conditions_on_values(cond, name):
    a = TENSORS[name]
    xs = elems(a)
    for lo, hi in [(-1.0, 0.0), (-3.0, 3.0), (0.0, 0.0)]:
        for op in ("lt", "gt"):
            for t in (0.0, 0.1, 25.0, 50.0, 99.9, 100.0):
                for mm in (None, ("max_min_lt", 1.0), ("max_min_gt", 1.0)):
                    params = {
                        f"range_percentage_{op}": t,
                        "range_start_inclusive": lo,
                        "range_end_inclusive": hi,
                    }
                    if mm:
                        params[mm[0]] = mm[1]
                    f = tensor_range(cond, params, a, row=9)
                    assert evaluate_values(cond, params, current=a, row=9) == f
                    if not xs:
                        assert f is None
                        continue
                    pct = o_pct(xs, lo, hi)
                    range_fired = pct < t if op == "lt" else pct > t
                    want_hits = [f"range_percentage_{op}"] if range_fired else []
                    mm_res = oracle(xs, mm[0], mm[1], "propagate") if mm else ("none", None)
                    if mm_res[0] == "hit":
                        want_hits.append(mm[0])
                    if not want_hits and mm_res[0] != "error":
                        assert f is None, (name, params)
                        continue
                    assert f.row == 9 and f.condition == cond
                    assert [h.param for h in f.hits] == want_hits, (name, params)
                    if range_fired:
                        assert math.isclose(f.hits[0].actual, pct)
                    if mm_res[0] == "error":
                        assert f.error == mm_res[1] and f.unchecked == (mm[0],)
                    else:
                        assert f.error is None


def test_range_rejects_other_conditions():
    with pytest.raises(ValueError):
        tensor_range("TL", {"max_gt": 1}, np.ones(2))
    with pytest.raises(ValueError):
        weight_change("TL", {"max_gt": 1}, np.ones(2), np.ones(2))


PAIRS = {
    "same": (np.array([1.0, -2.0, 3.0]), np.array([1.0, -2.0, 3.0])),
    "tiny_change": (np.array([1.0, -2.0, 3.0]), np.array([1.0 + 1e-9, -2.0, 3.0])),
    "small_change": (np.array([1.0, -2.0, 3.0]), np.array([1.001, -2.0, 3.0])),
    "big_change": (np.array([5.0, -2.0, 3.0]), np.array([1.0, 2.0, 3.0])),
    "zeros": (np.zeros(4), np.zeros(4)),
    "from_zero": (np.array([0.0, 1e-3]), np.zeros(2)),
    "nan_both": (np.array([NAN, 1.0]), np.array([NAN, 1.0])),
    "nan_cur": (np.array([NAN, 1.0]), np.array([0.5, 1.0])),
    "inf_both": (np.array([INF, 1.0]), np.array([INF, 1.0])),
    "inf_cur": (np.array([INF, 1.0]), np.array([1.0, 1.0])),
    "ninf_prev": (np.array([1.0, 1.0]), np.array([-INF, 1.0])),
    "empty": (np.zeros(0), np.zeros(0)),
    "ints": (np.array([1, 2, 3]), np.array([1, 2, 4])),
    "float32": (np.float32([0.1, 0.2]), np.float32([0.1, 0.2]) + np.float32(1e-8)),
    "tiny_values": (np.array([1e-30, 2e-30]), np.array([1.1e-30, 2e-30])),
    "huge_values": (np.array([1e300, -1e300]), np.array([1.01e300, -1e300])),
}


def o_ratio(cur, prev, eps):
    c, p = elems(cur), elems(prev)
    num = math.fsum(abs(a - b) for a, b in zip(c, p, strict=True)) / len(c)
    den = math.fsum(abs(b) for b in p) / len(p) + eps
    if den == 0:
        return 0.0 if num == 0 else INF
    return num / den


@pytest.mark.parametrize("name", list(PAIRS))
def test_weight_change_ratio_and_wcl_wcs(name):
    cur, prev = PAIRS[name]
    c, p = elems(cur), elems(prev)
    naninf = any(not math.isfinite(x) for x in c + p)
    for eps in (0.0, 1e-9, 1.0):
        if not c:
            assert math.isnan(weight_change_ratio(cur, prev, eps))
        elif not naninf:
            assert math.isclose(weight_change_ratio(cur, prev, eps), o_ratio(cur, prev, eps), rel_tol=1e-9)
        for cond, key, ts in (
            ("WCL", "abs_mean_update_ratio_gt", (0.0, 1e-4, 0.1, 1.0)),
            ("WCS", "abs_mean_update_ratio_lt", (0.0, 1e-9, 1e-4, 0.1, 1.0)),
        ):
            for t in ts:
                params = {key: t, "epsilon": eps}
                f = evaluate_values(cond, params, current=cur, previous=prev, row=2)
                if not c:
                    assert f is None
                    continue
                if naninf:
                    has_nan = any(math.isnan(x) for x in c + p)
                    assert f.error == ("nan_present" if has_nan else "inf_present") and f.hits == ()
                    assert f.unchecked == (key,)
                    continue
                r = o_ratio(cur, prev, eps)
                fired = r > t if cond == "WCL" else r < t
                if not fired:
                    assert f is None, (name, cond, t, eps, r)
                else:
                    assert f.row == 2 and f.error is None and f.hits[0][:2] == (key, t)
                    assert math.isclose(f.hits[0].actual, r, rel_tol=1e-9)


@pytest.mark.parametrize("name", list(PAIRS))
def test_weight_not_changed_matches_allclose(name):
    cur, prev = PAIRS[name]
    for rtol in (0.0, 1e-5, 1e-2):
        for atol in (0.0, 1e-8, 1e-2):
            for equal_nan in (False, True):
                f = weight_not_changed(cur, prev, rtol, atol, equal_nan, row=1)
                g = evaluate_values(
                    "WNC",
                    {"rtol": rtol, "atol": atol, "equal_nan": equal_nan},
                    current=cur,
                    previous=prev,
                    row=1,
                )
                assert f == g
                if cur.size == 0:
                    assert f is None
                    continue
                with np.errstate(all="ignore"):
                    want = bool(
                        np.allclose(
                            cur.astype(np.float64),
                            prev.astype(np.float64),
                            rtol=rtol,
                            atol=atol,
                            equal_nan=equal_nan,
                        )
                    )
                assert (f is not None) == want, (name, rtol, atol, equal_nan)
                if f is not None:
                    assert [h.param for h in f.hits] == ["rtol", "atol"]
                    assert f.hits[0].threshold == rtol and f.hits[1].threshold == atol
                    fin = [
                        abs(a - b)
                        for a, b in zip(elems(cur), elems(prev), strict=True)
                        if math.isfinite(a - b)
                    ]
                    assert math.isclose(f.hits[1].actual, max(fin, default=0.0), rel_tol=1e-12)


def test_change_shape_mismatch():
    with pytest.raises(ValueError, match="shape"):
        weight_not_changed(np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="shape"):
        evaluate_values("WCL", {}, current=np.ones(3), previous=np.ones((3, 1)))


@pytest.mark.parametrize("name", NAMES)
def test_weight_initialization_on_initial_value(name):
    a = TENSORS[name]
    xs = elems(a)
    for params in (
        {},
        {"max_gt": 1.0},
        {"min_lt": -1.0},
        {"zero_percentage_ge": 50.0, "max_gt": 0.0, "min_lt": 0.0},
    ):
        f = evaluate_values("WI", params, initial=a, current=np.ones(3), row=3)
        full = validate("WI", params)
        res = {p: oracle(xs, p, t, "propagate") for p, t in full.items()}
        hits = [p for p in full if res[p][0] == "hit"]
        bad = [p for p in full if res[p][0] == "error"]
        if not hits and not bad:
            assert f is None, (name, params)
        else:
            assert f.row == 3
            assert [h.param for h in f.hits] == hits and list(f.unchecked) == bad


def test_value_level_error_codes():
    x = np.ones(3)
    for cond in ("WCL", "WCS", "WNC"):
        f = evaluate_values(cond, {}, current=x, row=5)
        assert f == Firing(cond, 5, (), C.NO_PREVIOUS_STEP, f.unchecked)
        assert f.unchecked  # names the parameter(s) it could not check
        assert evaluate_values(cond, {}, previous=x).error == C.VALUE_NOT_RETAINED
    assert evaluate_values("WCL", {}).unchecked == ("abs_mean_update_ratio_gt",)
    assert evaluate_values("WI", {}).error == C.VALUE_NOT_RETAINED
    assert evaluate_values("TL", {"max_gt": 0}).error == C.VALUE_NOT_RETAINED
    assert evaluate_values("TL", {"max_gt": 0}).unchecked == ("max_gt",)
    assert evaluate_values("TR", {"max_min_gt": 1}).error == C.VALUE_NOT_RETAINED
    assert evaluate_values("TO").error == C.VALUE_NOT_RETAINED
    assert set(C.ERROR_CODES) == {
        "nan_present",
        "inf_present",
        "no_previous_step",
        "value_not_retained",
        "too_large_to_keep",
    }


@pytest.mark.parametrize("cond", ["TO", "TZ", "TL", "TS", "WO", "WL", "WS", "GE", "GL", "GV"])
@pytest.mark.parametrize("name", NAMES)
def test_evaluate_values_agrees_with_stats_path(cond, name):
    a = TENSORS[name]
    spec = CONDITIONS[cond]
    params = {spec.params[0].name: 0.5} if spec.params else {}
    if cond == "TZ":
        params = {"zero_percentage_ge": 50.0}
    f = evaluate_values(cond, params, current=a, row=11)
    rows = evaluate_stats(cond, params, np_stats(a)[None])
    assert f == (rows[0]._replace(row=11) if rows else None)


@pytest.mark.parametrize("name", NAMES)
def test_compute_stats_matches_numpy(name):
    a = TENSORS[name]
    got, want = compute_stats(a), np_stats(a)
    np.testing.assert_allclose(got, want, rtol=1e-12, equal_nan=True)


def test_compute_stats_rejects_complex():
    with pytest.raises(TypeError):
        compute_stats(np.array([1j]))


# --------------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------------

BAD = [
    ("TL", {"abs_mean_gt": -1}, ["'abs_mean_gt'", ">= 0", "-1"]),
    ("GV", {"abs_mean_lt": -1e-9}, ["'abs_mean_lt'", ">= 0"]),
    (
        "TR",
        {"range_percentage_lt": 150, "range_start_inclusive": 0, "range_end_inclusive": 1},
        ["'range_percentage_lt'", "[0, 100]", "150"],
    ),
    (
        "AR",
        {"range_percentage_gt": -0.1, "range_start_inclusive": 0, "range_end_inclusive": 1},
        ["'range_percentage_gt'", "[0, 100]"],
    ),
    ("TR", {"max_min_gt": 0}, ["'max_min_gt'", "> 0"]),
    ("AR", {"max_min_lt": -2.0}, ["'max_min_lt'", "> 0"]),
    ("TZ", {"zero_percentage_ge": 101}, ["'zero_percentage_ge'", "[0, 100]"]),
    ("WI", {"zero_percentage_ge": -5}, ["'zero_percentage_ge'", "[0, 100]"]),
    ("WCL", {"abs_mean_update_ratio_gt": -0.1}, ["'abs_mean_update_ratio_gt'", ">= 0"]),
    ("WCS", {"abs_mean_update_ratio_lt": -1}, ["'abs_mean_update_ratio_lt'", ">= 0"]),
    ("WCL", {"epsilon": -1e-9}, ["'epsilon'", ">= 0"]),
    ("WNC", {"rtol": -1}, ["'rtol'", ">= 0"]),
    ("WNC", {"atol": -1e-8}, ["'atol'", ">= 0"]),
    ("WNC", {"equal_nan": 1}, ["'equal_nan'", "true or false"]),
    ("TL", {"max_gt": NAN}, ["'max_gt'", "finite", "nan"]),
    ("TS", {"mean_lt": INF}, ["'mean_lt'", "finite"]),
    ("GL", {"abs_mean_gt": INF}, ["'abs_mean_gt'", "finite", ">= 0"]),
    ("WL", {"min_gt": "3"}, ["'min_gt'", "number"]),
    ("WS", {"max_lt": True}, ["'max_lt'", "number"]),
    (
        "TR",
        {"range_start_inclusive": NAN, "range_end_inclusive": 1, "range_percentage_lt": 1},
        ["'range_start_inclusive'", "finite"],
    ),
    ("WCL", {"abs_mean_update_ratio_gt": NAN}, ["'abs_mean_update_ratio_gt'", "finite"]),
    ("TL", {"max_gt": 10**400}, ["'max_gt'", "finite"]),
]


@pytest.mark.parametrize("cond,params,parts", BAD)
def test_validation_errors_name_parameter_and_range(cond, params, parts):
    with pytest.raises(ValueError) as e:
        validate(cond, params)
    msg = str(e.value)
    assert msg.startswith(f"{cond}: "), msg
    for p in parts:
        assert p in msg, (p, msg)
    # evaluation validates too
    with pytest.raises(ValueError):
        evaluate_stats(cond, params, matrix())


def test_validation_message_exact_example():
    with pytest.raises(ValueError, match=r"^TL: parameter 'abs_mean_gt' must be >= 0, got -1$"):
        validate("TL", {"abs_mean_gt": -1})


def test_range_needs_both_ends():
    for ends in ({}, {"range_start_inclusive": 0}, {"range_end_inclusive": 1}):
        with pytest.raises(
            ValueError,
            match=r"TR: range_percentage_\* needs both range_start_inclusive and "
            r"range_end_inclusive",
        ):
            validate("TR", {"range_percentage_lt": 5, **ends})
    with pytest.raises(ValueError, match="only used with range_percentage"):
        validate("AR", {"range_start_inclusive": 0, "range_end_inclusive": 1, "max_min_gt": 1})
    with pytest.raises(ValueError, match="range_start_inclusive.*<= range_end_inclusive"):
        validate("TR", {"range_start_inclusive": 2, "range_end_inclusive": 1, "range_percentage_gt": 5})
    assert validate("TR", {"range_start_inclusive": 1, "range_end_inclusive": 1, "range_percentage_gt": 5})


def test_unknown_parameter_lists_allowed():
    with pytest.raises(ValueError) as e:
        validate("TL", {"abs_mean_lt": 1})
    msg = str(e.value)
    assert "'abs_mean_lt'" in msg
    for p in ("abs_mean_gt", "max_gt", "min_gt", "mean_gt"):
        assert p in msg


def test_unknown_condition_lists_all_17():
    with pytest.raises(ValueError) as e:
        validate("XYZ", {})
    msg = str(e.value)
    assert "'XYZ'" in msg
    for a in ABBREVIATIONS:
        assert a in msg
    with pytest.raises(ValueError):
        evaluate_stats(None, {}, matrix())  # type: ignore[arg-type]


@pytest.mark.parametrize("cond", ["TL", "TS", "WL", "WS", "GL", "GV", "TR", "AR"])
def test_no_parameters_is_an_error(cond):
    with pytest.raises(ValueError, match=rf"^{cond}: at least one parameter is needed"):
        validate(cond, {})
    with pytest.raises(ValueError, match="at least one"):
        validate(cond, {"max_gt": None} if cond in ("TL", "WL", "GL") else None)


def test_defaults_filled():
    assert validate("TZ", {}) == {"zero_percentage_ge": 100.0}
    assert validate("WCL", {}) == {"abs_mean_update_ratio_gt": 0.1, "epsilon": 1e-9}
    assert validate("WCS", {"epsilon": 0}) == {"abs_mean_update_ratio_lt": 1e-4, "epsilon": 0.0}
    assert validate("WI", {}) == {"zero_percentage_ge": 100.0}
    # a given check replaces the default check (each parameter is a check of its own)
    assert validate("WI", {"max_gt": 2}) == {"max_gt": 2.0}
    assert validate("WNC", {}) == {"rtol": 1e-5, "atol": 1e-8, "equal_nan": False}
    assert validate("wnc", {"equal_nan": np.bool_(True)})["equal_nan"] is True
    assert validate("TL", {"max_gt": np.float32(2.5), "min_gt": np.int64(-3)}) == {
        "max_gt": 2.5,
        "min_gt": -3.0,
    }
    for c in ("OO", "TO", "WO", "GE"):
        assert validate(c, {}) == {} and validate(c) == {}


def test_registry():
    assert ABBREVIATIONS == (
        "OO",
        "TO",
        "TZ",
        "TR",
        "TL",
        "TS",
        "WCL",
        "WCS",
        "WI",
        "WNC",
        "WO",
        "WL",
        "WS",
        "AR",
        "GE",
        "GL",
        "GV",
    )
    cats = {a: c.category for a, c in CONDITIONS.items()}
    assert {a for a, c in cats.items() if c == "weight"} == {"WCL", "WCS", "WI", "WNC", "WO", "WL", "WS"}
    assert {a for a, c in cats.items() if c == "gradient"} == {"GE", "GL", "GV"}
    assert {a for a, c in cats.items() if c == "activation"} == {"AR"}
    needs = {a: c.needs for a, c in CONDITIONS.items() if c.needs}
    assert needs == {
        "OO": "inputs",
        "TR": "values",
        "AR": "values",
        "WCL": "previous",
        "WCS": "previous",
        "WNC": "previous",
        "WI": "initial",
    }
    assert (
        CONDITIONS["TR"].param_names
        == CONDITIONS["AR"].param_names
        == (
            "range_start_inclusive",
            "range_end_inclusive",
            "range_percentage_lt",
            "range_percentage_gt",
            "max_min_lt",
            "max_min_gt",
        )
    )
    for c in CONDITIONS.values():
        assert c.name and c.summary
        for p in c.params:
            assert p.range_text


# --------------------------------------------------------------------------------------------------
# Recommended set, guide, doctests, speed
# --------------------------------------------------------------------------------------------------


def test_recommended_content():
    base = recommended(set())
    assert [c for c, _, _ in base] == ["TO", "GE", "WNC", "GV", "WCL", "WI"]
    d = {c: (p, t) for c, p, t in base}
    assert d["TO"] == ({}, Target("tensor"))
    assert d["GE"] == ({}, Target("gradient"))
    assert (
        d["WNC"][0] == {"rtol": 1e-5, "atol": 1e-8, "equal_nan": False} and d["WNC"][1].category == "weight"
    )
    assert d["GV"] == ({"abs_mean_lt": 1e-9}, Target("gradient"))
    assert d["WCL"][0]["abs_mean_update_ratio_gt"] == 1.0
    assert d["WI"][0] == {"zero_percentage_ge": 100.0} and d["WI"][1].category == "weight"
    for c, p, _ in base:
        assert validate(c, p) == p

    ar = {
        next(iter(t.op_kinds)): p
        for c, p, t in recommended({"torch.nn.Tanh", "Sigmoid", "relu_", "GELU"})
        if c == "AR"
    }
    assert set(ar) == {"tanh", "sigmoid", "relu"}
    assert ar["tanh"] == {
        "range_start_inclusive": math.tanh(-8.8),
        "range_end_inclusive": math.tanh(8.8),
        "range_percentage_lt": 0.1,
    }
    sig = 1 / (1 + math.exp(-16.2))
    assert math.isclose(ar["sigmoid"]["range_start_inclusive"], 1 - sig, rel_tol=1e-6)
    assert math.isclose(ar["sigmoid"]["range_end_inclusive"], sig)
    assert ar["sigmoid"]["range_percentage_lt"] == 0.1
    assert ar["relu"] == {
        "range_start_inclusive": -1.0,
        "range_end_inclusive": 0.0,
        "range_percentage_gt": 99.9,
    }
    assert [c for c, _, _ in recommended({"Tanh"})].count("AR") == 1


def test_recommended_rules_fire_on_the_intended_tensors():
    rules = {next(iter(t.op_kinds)): p for c, p, t in recommended({"tanh", "sigmoid", "relu"}) if c == "AR"}
    x = np.linspace(-40, 40, 10001)
    assert evaluate_values("AR", rules["tanh"], current=np.tanh(x * 1000)) is not None  # saturated
    assert evaluate_values("AR", rules["tanh"], current=np.tanh(x / 10)) is None  # healthy
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-x * 1000))
    assert evaluate_values("AR", rules["sigmoid"], current=s) is not None
    assert evaluate_values("AR", rules["relu"], current=np.maximum(-np.abs(x), 0)) is not None  # all dead
    assert evaluate_values("AR", rules["relu"], current=np.maximum(x, 0)) is None


def test_target_matching():
    t = Target("weight", min_ndim=2)
    assert (
        t.matches("weight", ndim=2) and not t.matches("weight", ndim=1) and not t.matches("gradient", ndim=2)
    )
    assert Target("tensor").matches("activation", "ReLU")
    a = Target("activation", frozenset({"relu"}))
    assert a.matches("activation", "Functional.relu.0.forward") and not a.matches("activation", "gelu")
    with pytest.raises(ValueError):
        Target("optimizer")
    assert recommend.activation_kind("torch.nn.modules.activation.ReLU") == "relu"


def test_advice_non_empty_and_specific():
    texts = {a: advice(a) for a in ABBREVIATIONS}
    assert all(len(t) > 40 for t in texts.values())
    assert len(set(texts.values())) == 17
    ge = texts["GE"].lower()
    assert "learning rate" in ge and "clip" in ge and "loss scaling" in ge and "nan" in ge
    wnc = texts["WNC"]
    assert "requires_grad" in wnc and "param groups" in wnc and "learning rate is 0" in wnc
    relu = advice("TZ", node_op_type="ReLU")
    assert "LeakyReLU" in relu and "learning rate" in relu and "initialization" in relu
    assert relu != texts["TZ"]
    assert "vanishing" in texts["GV"].lower()
    for op in ("torch.log", "aten::sqrt", "Tensor.__truediv__.0.forward", "rsqrt"):
        t = advice("TO", node_op_type=op)
        assert t != texts["TO"] and ("zero" in t or "negative" in t), op
    assert "saturated" in advice("AR", node_op_type="nn.Tanh", fired_params=["range_percentage_lt"])
    assert "saturated" in advice("AR", node_op_type="Sigmoid")
    assert "constant" in advice("TR", fired_params=[Hit("max_min_lt", 1e-6, 0.0)])
    assert "symmetry" in advice("WI", fired_params=("zero_percentage_ge",))
    assert "exp" in advice("OO", node_op_type="exp")
    with pytest.raises(ValueError):
        advice("NOPE")


@pytest.mark.parametrize("module", [C, guide, recommend])
def test_doctests(module):
    res = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_all_17_over_10k_rows_is_fast():
    rng = np.random.default_rng(0)
    n = 10_000
    m = np.stack([np_stats(rng.normal(size=8) * rng.uniform(0.1, 10)) for _ in range(200)])
    m = np.tile(m, (n // 200, 1))
    m[::97] = np_stats(np.array([NAN, 1.0, INF]))
    rows = np.arange(n)
    params = {
        "OO": {},
        "TO": {},
        "TZ": {},
        "TR": {"max_min_gt": 50.0},
        "TL": {"abs_mean_gt": 20.0, "max_gt": 60.0},
        "TS": {"abs_mean_lt": 1e-3},
        "WCL": {},
        "WCS": {},
        "WI": {"max_gt": 60.0},
        "WNC": {},
        "WO": {},
        "WL": {"max_gt": 60.0},
        "WS": {"abs_mean_lt": 1e-3},
        "AR": {"max_min_lt": 1e-3},
        "GE": {},
        "GL": {"abs_mean_gt": 20.0},
        "GV": {"abs_mean_lt": 1e-9},
    }
    flags = np.ones(n, dtype=bool)
    best = INF
    for _ in range(3):
        t0 = time.perf_counter()
        for cond, p in params.items():
            evaluate_stats(cond, p, m, rows, inputs_finite=flags if cond == "OO" else None)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.5  # the budget is 50 ms; 10x slack for shared CI machines
