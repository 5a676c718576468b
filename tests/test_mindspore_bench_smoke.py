"""Smoke test of bench/overhead_mindspore.py: it runs, detaches cleanly and writes its JSON (no timing assertion)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import ms_fixtures  # noqa: F401 - the shared MindSpore import
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "overhead_mindspore.py"


@pytest.mark.timeout(120)
def test_overhead_mindspore_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("nbdebug_bench_overhead_ms", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        out = tmp_path / "overhead_mindspore.json"
        mod.main(["--models", "mlp", "--no-msprobe", "--rounds", "1", "--steps", "2", "--warmup", "1",
                  "--out", str(out)])
    finally:
        sys.modules.pop(spec.name, None)
    data = json.loads(out.read_text())
    rows = data["models"]["mlp"]
    assert set(rows) == set(mod.NBDEBUG)
    assert rows["baseline"]["ratio"] == 1.0
    assert all(math.isfinite(r["ratio"]) and r["ratio"] > 0 for r in rows.values())
    assert data["meta"]["rounds"] == 1 and data["meta"]["mindspore"]


@pytest.mark.timeout(300)
def test_graph_mode_rows_smoke():
    """GRAPH-mode rows: each configuration in a fresh process; nbdebug records every step's kernels."""
    rows_path = BENCH.parent / "mindspore_graph_rows.py"
    spec = importlib.util.spec_from_file_location("nbdebug_bench_ms_graph_rows", rows_path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        rows = mod.graph_rows(("regressor",), rounds=1, warmup=1, steps=2)
    finally:
        sys.modules.pop(spec.name, None)
    row = rows["regressor"]
    assert row["baseline_ms"] > 0 and math.isfinite(row["ratio"]) and row["ratio"] > 0
    assert row["floor_ms"] > 0 and row["floor_ratio"] == row["floor_ms"] / row["baseline_ms"]
    # warm-up + timed steps (their mean, then one by one), every kernel a node
    assert row["steps_recorded"] == 1 + 2 + 2 and row["nodes"] > 10
    assert 0 < row["best_ms"]["nbdebug"] and row["best_ratio"] > 0
    assert "regressor" in mod.format_rows(rows)
    # a dump setting's floor (outputs only) runs in its own process too
    assert mod.measure("regressor", "floor:outputs_only", 1, 2)["best_ms"] > 0
    # sampled capture: 1 + 2 * 5 runs, MindSpore dumps runs 0, 5 and 10
    sampled = mod.measure("regressor", "nbdebug:every=5", 1, 5)
    assert (sampled["steps_recorded"], sampled["steps_captured"]) == (11, 3)
