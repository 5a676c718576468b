"""Smoke test of bench/hub.py: simulated ranks attach, step, pause together; the JSON it promises is written
(no timing assertion)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)

ROOT = Path(__file__).resolve().parent.parent


def test_hub_bench_smoke(tmp_path):
    out = tmp_path / "hub.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "hub.py"), "--ranks", "6", "--rows", "50",
                          "--steps", "3", "--period", "0.2", "--out", str(out)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["ranks"] == 6 and row["rows"] == 50 and not row["real"]
    assert row["all_paused_at_one_step"] and row["hub_cpu_ms_per_step"] > 0 and row["pause_latency_s"] > 0
    assert "6 simulated ranks × 50 rows" in run.stdout
