"""Public values are plain Python numbers (numpy arrays only where documented), on numpy 1.26 and 2.x.

numpy 2 prints a leaked scalar as ``np.float64(50.0)``; these tests walk what the public API returns and
name every numpy scalar they find, so a leak fails here on either numpy.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
import torch.nn as nn

import nbdebug
from nbdebug.watch.conditions import evaluate_values, percentage_in_range, tensor_range, validate
from nbdebug.watch.recommend import recommended


def _leaks(x, where="value"):
    """Paths (``value['max']``, ``value[0].actual`` …) inside ``x`` that hold numpy scalars."""
    if isinstance(x, np.generic):
        return [f"{where} is {type(x).__name__}"]
    if isinstance(x, (str, bytes, bool, int, float, type(None), np.ndarray, torch.Tensor)):
        return []
    if isinstance(x, dict):
        return [p for k, v in x.items() for p in _leaks(k, f"{where} key") + _leaks(v, f"{where}[{k!r}]")]
    if hasattr(x, "_fields"):  # NamedTuple
        return [p for k in x._fields for p in _leaks(getattr(x, k), f"{where}.{k}")]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [p for f in dataclasses.fields(x) for p in _leaks(getattr(x, f.name), f"{where}.{f.name}")]
    if isinstance(x, (list, tuple, set, frozenset)):
        return [p for i, v in enumerate(x) for p in _leaks(v, f"{where}[{i}]")]
    return []


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _train(dbg_kwargs=None, steps=2, scale=1.0):
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.fc1.weight.mul_(scale)
    dbg = nbdebug.Debugger(model, level="mix", **(dbg_kwargs or {}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    return model, dbg, opt, g


def _steps(model, opt, g, n):
    for _ in range(n):
        opt.zero_grad()
        model(torch.randn(16, 4, generator=g) * 50).pow(2).mean().backward()
        opt.step()


def test_percentage_in_range_and_value_hits_are_floats():
    pct = percentage_in_range(np.array([-2.0, -0.5, 0.0, 3.0], dtype=np.float32), -1, 0)
    assert type(pct) is float and pct == 50.0
    assert type(percentage_in_range(np.arange(4), 0, 1)) is float
    x = np.tanh(np.array([20.0, -20.0, 30.0, 0.5]))
    params = {"range_percentage_lt": 30, "range_start_inclusive": np.tanh(np.float64(-8.8)),
              "range_end_inclusive": np.tanh(np.float64(8.8))}
    (hit,) = tensor_range("AR", params, x).hits
    assert type(hit.actual) is float and hit.actual == 25.0
    assert type(hit.threshold) is float
    assert _leaks(validate("AR", params)) == []
    (hit,) = tensor_range("TR", {"max_min_gt": np.float32(1.0)}, x).hits
    assert type(hit.actual) is float and type(hit.threshold) is float



# One parameter set per condition that fires on the float32 values below (thresholds as numpy scalars too).
FIRING = {
    "OO": {}, "TO": {}, "GE": {},
    "TZ": {"zero_percentage_ge": np.float32(10)},
    "TR": {"max_min_gt": np.float64(1)},
    "TL": {"max_gt": 1, "abs_mean_gt": np.float32(0.5)},
    "TS": {"min_lt": np.float32(0)},
    "WCL": {"abs_mean_update_ratio_gt": 0.01},
    "WCS": {"abs_mean_update_ratio_lt": 100.0},
    "WI": {"zero_percentage_ge": 10.0},
    "WNC": {},
    "WO": {},
    "WL": {"max_gt": 1.0},
    "WS": {"min_lt": 0.0},
    "AR": {"range_percentage_gt": 10, "range_start_inclusive": -10, "range_end_inclusive": 10},
    "GL": {"max_gt": 1.0},
    "GV": {"abs_mean_lt": 100.0},
}


def test_every_condition_reports_plain_numbers():
    current = np.array([0.0, -3.0, 5.0, np.inf], np.float32)
    finite = np.array([0.0, -3.0, 5.0, 2.0], np.float32)
    fired = set()
    for cond, params in FIRING.items():
        valid = validate(cond, params)
        assert _leaks(valid, cond) == []
        data = current if cond in ("OO", "TO", "GE", "WO") else finite
        previous = finite if cond == "WNC" else finite * 0.5
        f = evaluate_values(cond, valid, current=data, previous=previous, initial=finite, inputs=[finite])
        if f is not None and f.hit:
            fired.add(cond)
            assert _leaks(f, cond) == []
            assert all(type(h.actual) is float and type(h.threshold) is float for h in f.hits), f
    assert fired == set(FIRING), set(FIRING) - fired


def test_recommend_values_are_plain():
    for cond, params, _target in recommended({"tanh", "sigmoid", "relu"}):
        assert _leaks(params, cond) == []


def test_debugger_stats_hits_and_recommendations_are_plain_numbers():
    model, dbg, opt, g = _train(scale=100.0)
    dbg.watch("TL", max_gt=np.float32(1.0))
    dbg.watch("AR", range_percentage_gt=np.float64(1.0), range_start_inclusive=-1, range_end_inclusive=-0.9)
    dbg.watch("WNC")
    dbg.watch("WCL", abs_mean_update_ratio_gt=1e-9)
    dbg.watch("TZ", zero_percentage_ge=0)
    try:
        _steps(model, opt, g, 2)
        stats = dbg.stats("Module.fc1.Linear.forward.0", "output.0")
        assert stats["count"] == 128 and _leaks(stats, "stats") == []
        assert type(stats["max"]) is float and type(stats["nan_count"]) is int
        assert all(type(s) is int for s in stats["shape"])
        assert {h.condition for h in dbg.hits} >= {"TL", "AR", "WNC", "WCL", "TZ"}, [h.describe() for h in dbg.hits]
        assert _leaks(dbg.hits, "hits") == []
        assert all(type(h.actual) is float and type(h.threshold) is float for r in dbg.hits for h in r.hits)
        assert _leaks(dbg.recheck(), "recheck") == []
        assert _leaks(dbg.recommend(), "recommend") == []
        assert _leaks([(w.condition, w.params) for w in dbg.watch_recommended()], "watch_recommended") == []
        assert _leaks(dbg.first_nonfinite(), "first_nonfinite") == []
    finally:
        dbg.close()


def test_compare_rows_and_records_are_plain_numbers():
    runs = []
    for scale in (1.0, 1.001):
        model, dbg, opt, g = _train(scale=scale)
        _steps(model, opt, g, 1)
        runs.append((dbg, model))
    try:
        for mode in ("tensor", "statistics"):
            res = nbdebug.compare(runs[0][0], runs[1][0], mode=mode)
            assert len(res) > 0
            assert _leaks(list(res), f"{mode} rows") == []
            assert _leaks(res.records(), f"{mode} records") == []
            assert _leaks(res.counts(), "counts") == []
            row = next(r for r in res if r.target_stats is not None)
            assert all(type(v) is float for v in row.target_stats + row.stat_diff + row.stat_rel_pct)
            metrics = row.metrics()
            assert all(type(v) is float for v in metrics.values()), metrics
            if mode == "tensor":
                assert not math.isnan(metrics["cosine"])
    finally:
        for dbg, _ in runs:
            dbg.close()
