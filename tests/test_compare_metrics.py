"""Tensor metrics (msProbe's definitions) and statistics differences, on hand-checked values."""

import math

import numpy as np
import pytest

from nbdebug.compare.metrics import close_report, relative_error, stats_diff, tensor_metrics


def test_metrics_on_hand_computed_values():
    n = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    b = np.array([[1.0, 2.0], [3.0, 4.01]], dtype=np.float32)
    m = tensor_metrics(n, b)
    nf, bf = n.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    assert m.cosine == pytest.approx(nf @ bf / (np.linalg.norm(nf) * np.linalg.norm(bf)))
    assert m.euc_dist == pytest.approx(np.linalg.norm(nf - bf))
    assert m.max_abs_err == pytest.approx(0.01, rel=1e-4)
    assert m.max_rel_err == pytest.approx(0.01 / 4.01, rel=1e-4)
    assert m.one_thousandth == 0.75  # 3 of 4 elements have RE < 0.1%
    assert m.five_thousandths == 1.0
    assert m.message == ""


def test_relative_error_adds_eps_where_golden_is_zero():
    re32 = relative_error(np.array([0.0, 1.0], np.float32), np.array([0.0, 0.0], np.float32))
    eps32 = np.finfo(np.float32).eps
    assert re32.dtype == np.float32 and re32[0] == 0.0
    assert re32[1] == pytest.approx((1 + eps32 - eps32) / eps32)
    re64 = relative_error(np.array([1.0]), np.array([0.0]))
    assert re64[0] == pytest.approx(1 / np.finfo(np.float64).eps)
    assert relative_error(np.array([3]), np.array([2])).dtype == np.float64  # ints: float64


def test_nan_inf_positions():
    same = tensor_metrics(np.array([1.0, np.nan, np.inf]), np.array([1.0, np.nan, np.inf]))
    assert same.cosine == pytest.approx(1.0) and same.max_abs_err == 0.0 and "same positions" in same.message
    differ = tensor_metrics(np.array([1.0, np.nan, 2.0]), np.array([1.0, 2.0, np.nan]))
    assert all(math.isnan(v) for v in differ.as_tuple()) and "positions differ" in differ.message


def test_degenerate_tensors():
    zeros = tensor_metrics(np.zeros(4), np.zeros(4))
    assert zeros.cosine == 1.0 and zeros.max_abs_err == 0.0
    one_zero = tensor_metrics(np.zeros(4), np.ones(4))
    assert math.isnan(one_zero.cosine) and "target tensor is all zero" in one_zero.message
    scalar = tensor_metrics(np.array(2.0), np.array(1.0))
    assert math.isnan(scalar.cosine) and math.isnan(scalar.euc_dist) and scalar.max_abs_err == 1.0
    single = tensor_metrics(np.array([2.0]), np.array([1.0]))  # squeezed to 0-d, as msProbe does
    assert math.isnan(single.cosine) and single.max_rel_err == 1.0
    shape = tensor_metrics(np.ones((2, 3)), np.ones((3, 2)))
    assert math.isnan(shape.cosine) and "shapes differ" in shape.message
    empty = tensor_metrics(np.ones((0, 3)), np.ones((0, 3)))
    assert "empty" in empty.message
    dtype = tensor_metrics(np.ones(3, np.float16), np.ones(3, np.float32))
    assert "dtypes differ" in dtype.message and dtype.cosine == pytest.approx(1.0)


def test_stats_diff_rules():
    t = np.array([[2.0, 0.0, np.nan, np.inf, 1.0]])
    g = np.array([[1.0, 0.0, np.nan, np.inf, 0.0]])
    diff, rel = stats_diff(t, g)
    assert diff.tolist() == [[1.0, 0.0, 0.0, 0.0, 1.0]]
    assert rel[0, :4].tolist() == [100.0, 0.0, 0.0, 0.0] and rel[0, 4] == np.inf
    d2, r2 = stats_diff(np.array([[np.nan]]), np.array([[1.0]]))
    assert math.isnan(d2[0, 0]) and math.isnan(r2[0, 0])


def test_close_report():
    rep = close_report(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.1]), rtol=1e-4, atol=1e-4)
    assert rep["allclose"] is False and rep["close_pct"] == pytest.approx(200 / 3)
    assert rep["max_abs_diff"] == pytest.approx(0.1) and rep["mean_abs_diff"] == pytest.approx(0.1 / 3)
    nan = close_report(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]), equal_nan=True)
    assert nan["allclose"] is True
    assert close_report(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))["allclose"] is False
