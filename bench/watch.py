"""Benchmark: all 17 watch conditions over a 10k-row statistics matrix.

What is timed (median of 7 runs, each run evaluating everything once):

* ``stats``: :func:`evaluate_stats` for all 17 conditions over all 10,000 rows, with representative
  thresholds (few rows fire). OO gets an ``inputs_finite`` flag per row; WI reads the same matrix as if it
  were the step-0 table; TR/AR use their ``max_min_*`` parameters. WCL/WCS/WNC have no statistics-level
  part, so their ``evaluate_stats`` calls return at once; they are measured in ``values`` below.
* ``values``: :func:`evaluate_values` on 64 watched tensors of 4,096 float32 elements each, for the
  conditions that need tensor values: WCL, WCS, WNC (current vs. previous step), TR/AR range percentages,
  WI (initial value) and OO (input and output arrays): 7 x 64 = 448 calls.
* ``all_fire``: the worst case for building results, TL with two parameters firing on every row
  (10,000 firings of two hits each).

Run: ``.venv/bin/python bench/watch.py``; writes ``bench/results/watch.json``.

``--temporal [MODEL ...]`` (issue 20): the watchpoints over time against their level's own cost, on the zoo's
small models (``bench/zoo.py``) at ``level="monitor"`` with the recommended temporal set (SPIKE on
grad_norm_total and every update_ratio, STALL on every update_ratio). Per model, ``RUNS`` interleaved runs of
``STEPS`` steps each of: no debugger, monitor, monitor + the set; reported: the median step times, the level's
cost (monitor - plain), the step-time ratio (monitor + set) / monitor, and — steadier on a shared machine —
the time spent in the temporal engine itself per step (``TemporalEngine.check``, timed around the call) as a
share of the monitor step. Writes ``bench/results/watch_temporal.json``. Target: the set adds <= 2%.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from nbdebug.session.stats import FIELDS
from nbdebug.watch.conditions import ABBREVIATIONS, compute_stats, evaluate_stats, evaluate_values

ROWS = 10_000
RUNS = 7
WATCHED = 64
WATCHED_SIZE = 4096

PARAMS: dict[str, dict] = {
    "OO": {},
    "TO": {},
    "TZ": {},
    "TR": {"max_min_gt": 1e4, "max_min_lt": 1e-12},
    "TL": {"abs_mean_gt": 100.0, "max_gt": 1e3, "min_gt": 1e3, "mean_gt": 100.0},
    "TS": {"abs_mean_lt": 1e-10, "max_lt": -1e3, "min_lt": -1e3, "mean_lt": -100.0},
    "WCL": {"abs_mean_update_ratio_gt": 1.0},
    "WCS": {"abs_mean_update_ratio_lt": 1e-4},
    "WI": {"zero_percentage_ge": 100.0, "max_gt": 1e3, "min_lt": -1e3},
    "WNC": {},
    "WO": {},
    "WL": {"abs_mean_gt": 100.0, "max_gt": 1e3},
    "WS": {"abs_mean_lt": 1e-10},
    "AR": {"max_min_lt": 1e-12},
    "GE": {},
    "GL": {"abs_mean_gt": 10.0},
    "GV": {"abs_mean_lt": 1e-9},
}

RANGE = {"range_start_inclusive": -1.0, "range_end_inclusive": 0.0, "range_percentage_gt": 99.9}


def stats_matrix(rng: np.random.Generator) -> np.ndarray:
    """10k rows: stats of random tensors at scales 1e-12..1e3, with ~2% adversarial rows mixed in."""
    rows = []
    for _ in range(ROWS):
        n = int(rng.integers(1, 257))
        scale = 10.0 ** rng.uniform(-12, 3)
        rows.append(compute_stats(rng.normal(size=n) * scale))
    m = np.stack(rows)
    adversarial = [
        compute_stats([np.nan, 1.0, 2.0]),
        compute_stats([np.inf, 1.0]),
        compute_stats([-np.inf, 0.0, np.nan]),
        compute_stats(np.zeros(64)),
        compute_stats(np.zeros(0)),
        compute_stats(np.full(32, 7.0)),
        compute_stats([1e300, -1e300, 5e299]),
        compute_stats([1e-30, -1e-30]),
        np.array([np.nan] * 5 + [0.0, 0.0, 0.0, 0.0, 12.0]),  # an "unsupported dtype" row
    ]
    where = rng.choice(ROWS, size=ROWS // 50, replace=False)
    for i, r in enumerate(where):
        m[r] = adversarial[i % len(adversarial)]
    assert m.shape == (ROWS, len(FIELDS))
    return m


def watched_tensors(rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    out = []
    for i in range(WATCHED):
        prev = rng.normal(size=WATCHED_SIZE).astype(np.float32)
        cur = prev if i % 8 == 0 else prev - np.float32(1e-3) * rng.normal(size=WATCHED_SIZE).astype(np.float32)
        act = np.maximum(rng.normal(size=WATCHED_SIZE).astype(np.float32) - (i % 4), 0)
        out.append({"cur": cur, "prev": prev, "act": act, "inp": rng.normal(size=WATCHED_SIZE)})
    return out


def run_stats(m: np.ndarray, rows: np.ndarray, flags: np.ndarray) -> dict[str, tuple[float, int]]:
    res = {}
    for cond in ABBREVIATIONS:
        t0 = time.perf_counter()
        fired = evaluate_stats(cond, PARAMS[cond], m, rows, inputs_finite=flags if cond == "OO" else None)
        res[cond] = (time.perf_counter() - t0, len(fired))
    return res


def run_values(watched: list[dict[str, np.ndarray]]) -> int:
    fired = 0
    for w in watched:
        calls = [
            evaluate_values("WCL", PARAMS["WCL"], current=w["cur"], previous=w["prev"]),
            evaluate_values("WCS", PARAMS["WCS"], current=w["cur"], previous=w["prev"]),
            evaluate_values("WNC", {}, current=w["cur"], previous=w["prev"]),
            evaluate_values("AR", RANGE, current=w["act"]),
            evaluate_values("TR", {**RANGE, "max_min_lt": 1e-6}, current=w["act"]),
            evaluate_values("WI", PARAMS["WI"], initial=w["prev"]),
            evaluate_values("OO", current=np.log(np.abs(w["inp"]) * 0.0 + 1.0), inputs=[w["inp"]]),
        ]
        fired += sum(f is not None for f in calls)
    return fired


def main() -> None:
    rng = np.random.default_rng(20240607)
    m = stats_matrix(rng)
    rows = np.arange(ROWS)
    flags = rng.random(ROWS) < 0.95
    watched = watched_tensors(rng)

    run_stats(m, rows, flags)  # warm-up
    run_values(watched)
    stats_runs, per_cond, values_runs, heavy_runs = [], {c: [] for c in ABBREVIATIONS}, [], []
    fired_counts: dict[str, int] = {}
    values_fired = heavy_fired = 0
    for _ in range(RUNS):
        t0 = time.perf_counter()
        res = run_stats(m, rows, flags)
        stats_runs.append(time.perf_counter() - t0)
        for c, (dt, k) in res.items():
            per_cond[c].append(dt)
            fired_counts[c] = k
        t0 = time.perf_counter()
        values_fired = run_values(watched)
        values_runs.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        heavy_fired = len(evaluate_stats("TL", {"max_gt": -1e300, "min_gt": -1e300}, m, rows))
        heavy_runs.append(time.perf_counter() - t0)

    def ms(xs: list[float]) -> float:
        return round(statistics.median(xs) * 1e3, 3)

    result = {
        "rows": ROWS,
        "runs": RUNS,
        "stats_all_17_median_ms": ms(stats_runs),
        "stats_per_condition_median_ms": {c: ms(v) for c, v in per_cond.items()},
        "stats_firings": fired_counts,
        "values_median_ms": ms(values_runs),
        "values_calls": 7 * WATCHED,
        "values_tensor_elements": WATCHED_SIZE,
        "values_firings": values_fired,
        "all_fire_median_ms": ms(heavy_runs),
        "all_fire_firings": heavy_fired,
        "budget_ms": 50.0,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
    }
    out = Path(__file__).resolve().parent / "results" / "watch.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"all 17 conditions over {ROWS} stats rows: {result['stats_all_17_median_ms']} ms (median of {RUNS})")
    print(f"value-level, {7 * WATCHED} calls on {WATCHED_SIZE}-element tensors: {result['values_median_ms']} ms")
    print(f"worst case, every row fires (TL, 2 hits each): {result['all_fire_median_ms']} ms")
    print(f"wrote {out}")


TEMPORAL_MODELS = ("gpt2", "resnet", "bert")
TEMPORAL_STEPS, TEMPORAL_RUNS = 30, 5


def _temporal_run(wl, mode: str, steps: int) -> tuple[float, float]:
    """Median step time of ``steps`` steps in ``mode`` (plain / monitor / temporal), and the median time per
    step spent in the temporal engine (0 unless ``temporal``)."""
    import nbdebug
    from nbdebug.watch.recommend import recommended_temporal

    opt = wl.reset()
    dbg = nbdebug.Debugger(wl.model, level="monitor") if mode != "plain" else None
    spent: list[float] = []
    try:
        if mode == "temporal":
            for c, p, _t in recommended_temporal():
                dbg.watch(c, **p)
            engine = dbg.watchpoints.temporal
            check = engine.check

            def timed_check(*a, **k):
                t0 = time.perf_counter()
                try:
                    return check(*a, **k)
                finally:
                    spent.append(time.perf_counter() - t0)
            engine.check = timed_check
        for _ in range(3):  # warm-up
            wl.step(opt)
        spent.clear()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            wl.step(opt)
            times.append(time.perf_counter() - t0)
    finally:
        if dbg is not None:
            dbg.close()
    return statistics.median(times), (statistics.median(spent) if spent else 0.0)


def temporal_main(models: list[str]) -> dict:
    import torch

    sys_path = str(Path(__file__).resolve().parent)
    import sys
    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from zoo import make_zoo_workload

    torch.set_num_threads(1)
    out: dict = {"steps": TEMPORAL_STEPS, "runs": TEMPORAL_RUNS, "threads": 1, "models": {}}
    for name in models:
        wl = make_zoo_workload(name)
        runs: dict[str, list[float]] = {"plain": [], "monitor": [], "temporal": []}
        engine: list[float] = []
        for _ in range(TEMPORAL_RUNS):  # interleaved
            for mode in runs:
                t, e = _temporal_run(wl, mode, TEMPORAL_STEPS)
                runs[mode].append(t)
                if mode == "temporal":
                    engine.append(e)
        med = {m: statistics.median(v) for m, v in runs.items()}
        row = {f"{m}_ms": round(v * 1e3, 3) for m, v in med.items()}
        row["level_cost_ms"] = round((med["monitor"] - med["plain"]) * 1e3, 3)
        row["temporal_ratio"] = round(med["temporal"] / med["monitor"], 4)
        row["engine_ms_per_step"] = round(statistics.median(engine) * 1e3, 4)
        row["engine_share_of_monitor_step"] = round(statistics.median(engine) / med["monitor"], 5)
        out["models"][name] = row
        print(name, row, flush=True)
    path = Path(__file__).resolve().parent / "results" / "watch_temporal.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")
    return out


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "--temporal":
        temporal_main(sys.argv[2:] or list(TEMPORAL_MODELS))
    else:
        main()
