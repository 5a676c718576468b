"""Smoke test of bench/ranks.py: small sizes, the table it prints, the first non-finite rank it finds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench" / "ranks.py"


def test_ranks_bench_smoke(capsys):
    spec = importlib.util.spec_from_file_location("nbdebug_bench_ranks", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--real", "--simulated", "--ranks", "3", "6", "--steps", "8", "--tensors", "40"])
    assert [r["ranks"] for r in rows] == [3, 6]
    for r in rows:
        assert r["hub_step_ms"] > 0 and r["summary_bytes"] < r["full_table_bytes"]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ranks | steps") and len(out) == 3
