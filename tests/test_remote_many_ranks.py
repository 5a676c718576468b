"""Many ranks, bounded and fast (issue 20 item 4): 96 simulated ranks speaking the real protocol (bench/hub.py's
``_rank_loop``, one worker process, loopback) stepping together every 0.5 s join a real listener in summary mode
(96 > ``SUMMARY_ABOVE``); ``pause_all`` asked just after a step boundary (the worst phase) and mid-step lands
every rank at one step boundary within 2 step periods. ``bench/ranks.py`` measures the same with 1,000 ranks."""

from __future__ import annotations

import sys
from pathlib import Path

import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_pause_all_on_many_simulated_ranks_lands_within_two_periods():
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the spawned worker imports bench/hub.py by name (it gets this path)
    import hub as bench
    period = 0.5
    r = bench.measure(96, rows=20, steps=2, period=period, workers=1, series=40, pauses=2)
    assert r["summary_mode"] and r["all_paused_at_one_step"], r
    assert len(r["pause_latencies_s"]) == 2
    assert r["pause_periods"] <= 2.0, r  # each pause_all: every rank paused within 2 step periods
    assert 0 < r["hub_cpu_ms_per_step"] < 1000 * period, r  # the hub keeps up
