"""Benchmark: what a job of many ranks costs the notebook (the hub) per step, without the transport.

Each simulated rank produces, per step, what a rank sends in nbdebug's design: its
:class:`~nbdebug.job.summary.StepSummary` as JSON (computed from a real statistics table of ``--tensors``
rows with :func:`~nbdebug.job.summary.summarize_table`), plus — only when asked for — its full statistics
table (``tensors x 10`` float64). One rank in ``--ranks`` goes non-finite at ``--nan-step``.

What is measured (process CPU time, ``time.process_time``):

* ``rank side``: one rank summarising its step (``summarize_table`` over ``--tensors`` rows);
* ``hub/step``: for every rank, decoding its summary message and storing it, then
  ``Job.first_nonfinite(step)``, ``Job.overview([step])`` and ``Job.hit_counts()`` — what the job panel
  refreshes per step; mean and 95th percentile over the steps;
* ``first_nonfinite(all)``: ``Job.first_nonfinite()`` over the whole history (every step of every rank);
* message sizes: the summary JSON and the full table a rank would send if every statistic travelled.

That is what a job keeps in summary mode (more than 8 ranks: ``nbdebug.remote.hub.SUMMARY_ABOVE``). The job over
the wire is measured by ``bench/hub.py``, which this bench runs first: hub CPU per step and pause latency with
``--real`` torchrun jobs (2 and 4 ranks, full tables) and ``--simulated`` ranks speaking the protocol (1,000 by
default, at ``--period`` 1 s: summary mode, each rank's summary and a ``--series``-series monitor row per step),
then judged against the budget of issue 20: hub CPU per step ≤ 250 ms and ``pause_all`` → every rank paused
within 2 step periods (the worst of three phases of the step). The load average is printed beside: on a shared
machine the figures are CPU time (hub) and wall time (pause), the latter inflated by contention. Run:
``.venv/bin/python bench/ranks.py [--real 2 4] [--simulated 1000] [--period 1.0] [--hub-steps 10]
[--ranks 64 256] [--steps 200] [--tensors 1500]`` (``--real --simulated`` with no sizes: the summary part alone).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from nbdebug.job import Job, StepSummary, summarize_table
from nbdebug.session.stats import FIELDS, StatsTable
from nbdebug.watch.reader import Reader
from nbdebug.watch.watchpoints import WatchManager


def stats_table(tensors: int, rng: np.random.Generator, bad_from: int | None = None) -> StatsTable:
    """A step's statistics: ``tensors`` rows of one forward/backward pass; NaN from row ``bad_from`` on."""
    keys = [(f"Module.layer{i // 4}.Linear.{'forward' if i < tensors // 2 else 'backward'}.0",
             "input.0" if i % 2 == 0 else "output.0") for i in range(tensors)]
    values = np.zeros((tensors, len(FIELDS)))
    values[:, 0] = rng.random(tensors) * 4  # max
    values[:, 1] = -values[:, 0]  # min
    values[:, 2] = rng.normal(size=tensors) * 0.01  # mean
    values[:, 3] = values[:, 0] / 4  # abs_mean
    values[:, 4] = values[:, 0] * 30  # norm
    values[:, 9] = 4096  # count
    if bad_from is not None:
        values[bad_from:, [0, 1, 2, 3, 4]] = np.nan
        values[bad_from:, 6] = 4096  # nan_count
    return StatsTable.from_rows(keys, ["float32"] * tensors, [(64, 64)] * tensors, values)


class SimRank(Reader):
    """A rank as the job sees a remote one: its summaries arrive as messages, nothing else is local (the
    watchpoint methods are the Reader's, over an empty session)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.summaries: dict[int, StepSummary] = {}
        self.session = SimpleNamespace(steps={}, graph=SimpleNamespace(nodes={}), live=False, step_index=0)
        self.graph = self.session.graph
        self.watchpoints = WatchManager(self.session)

    def receive(self, message: bytes) -> None:
        s = StepSummary.from_dict(json.loads(message))
        self.summaries[s.step] = s
        self.session.steps[s.step] = None

    def step_summary(self, step: int) -> StepSummary | None:
        return self.summaries.get(step)

    @property
    def hits(self) -> list[Any]:
        return []

    def recheck(self, step: Any = None) -> list:
        return []

    def stats(self, node: str, slot: str, step: Any = "current") -> Any:
        raise KeyError(node)

    def tensor(self, node: str, slot: str, step: Any = "current") -> Any:
        raise KeyError(node)


def rank_messages(ranks: int, steps: int, tensors: int, nan_rank: int, nan_step: int,
                  seed: int = 0) -> tuple[list[list[bytes]], list[float], int]:
    """Per step, every rank's summary message; the rank-side CPU seconds per summary; one full table's bytes."""
    rng = np.random.default_rng(seed)
    clean = stats_table(tensors, rng)
    bad = stats_table(tensors, rng, bad_from=tensors // 3)
    origin = bad.keys[tensors // 3]
    out, cost = [], []
    for step in range(steps):
        msgs = []
        for r in range(ranks):
            broken = step > nan_step or (step == nan_step and r == nan_rank)
            t0 = time.process_time()
            s = summarize_table(bad if broken else clean, rank=r, step=step, origin=origin if broken else None)
            cost.append(time.process_time() - t0)
            msgs.append(json.dumps(s.to_dict()).encode())
        out.append(msgs)
    return out, cost, clean.values.nbytes + sum(len(k[0]) + len(k[1]) for k in clean.keys)


def run(ranks: int, steps: int, tensors: int) -> dict[str, Any]:
    nan_rank, nan_step = ranks // 3, steps // 2
    messages, rank_cost, full_bytes = rank_messages(ranks, steps, tensors, nan_rank, nan_step)
    sims = {r: SimRank(r) for r in range(ranks)}
    job = Job(sims)
    per_step = []
    for step, msgs in enumerate(messages):
        t0 = time.process_time()
        for r, m in enumerate(msgs):
            sims[r].receive(m)
        first = job.first_nonfinite(step)
        job.overview([step])
        job.hit_counts()
        per_step.append(time.process_time() - t0)
    t0 = time.process_time()
    first = job.first_nonfinite()
    whole = time.process_time() - t0
    assert first is not None and (first.rank, first.step) == (nan_rank, nan_step), first
    return {"ranks": ranks, "steps": steps, "tensors": tensors,
            "rank_summary_ms": statistics.mean(rank_cost) * 1e3,
            "hub_step_ms": statistics.mean(per_step) * 1e3,
            "hub_step_p95_ms": float(np.percentile(per_step, 95)) * 1e3,
            "first_all_ms": whole * 1e3,
            "summary_bytes": statistics.mean(len(m) for m in messages[-1]),
            "full_table_bytes": full_bytes}


#: issue 20's budget: hub CPU per step (ms) with 1,000 simulated ranks at 1 step/s, and pause_all latency (periods)
HUB_BUDGET_MS = 250.0
PAUSE_BUDGET_PERIODS = 2.0


def transport(real: list[int], simulated: list[int], period: float = 1.0, steps: int = 10,
              series: int = 200, pauses: int = 3) -> list[dict[str, Any]]:
    """``bench/hub.py``'s figures (it prints them): real torchrun jobs, then simulated ranks; each judged."""
    if not real and not simulated:
        return []
    with tempfile.TemporaryDirectory() as tmp:  # its own process: it spawns the simulated ranks by file name
        out = Path(tmp) / "hub.json"
        subprocess.run([sys.executable, str(Path(__file__).with_name("hub.py")), "--real", *map(str, real),
                        "--ranks", *map(str, simulated), "--period", str(period), "--steps", str(steps),
                        "--series", str(series), "--pauses", str(pauses), "--out", str(out)], check=True)
        rows = json.loads(out.read_text())
    for r in rows:
        each = ", ".join(f"{t / r['period_s']:.2f}" for t in r["pause_latencies_s"])
        ok = r["hub_cpu_ms_per_step"] <= HUB_BUDGET_MS and r["pause_periods"] <= PAUSE_BUDGET_PERIODS
        print(f"{r['ranks']} {'real' if r['real'] else 'simulated'} ranks at {1 / r['period_s']:g} step/s: hub CPU "
              f"{r['hub_cpu_ms_per_step']:.0f} ms/step (budget {HUB_BUDGET_MS:.0f}), pause_all "
              f"{r['pause_periods']:.2f} periods worst (budget {PAUSE_BUDGET_PERIODS:g}; each: "
              f"{each}), load average "
              f"{r['load_average'][0]:.1f} on {r['cpus']} CPUs: {'within budget' if ok else 'OVER BUDGET'}")
    return rows


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--real", type=int, nargs="*", default=[2, 4], help="torchrun jobs of these sizes (bench/hub.py)")
    ap.add_argument("--simulated", type=int, nargs="*", default=[1000],
                    help="ranks simulated over the protocol (bench/hub.py)")
    ap.add_argument("--period", type=float, default=1.0, help="seconds per step of the simulated ranks")
    ap.add_argument("--hub-steps", type=int, default=10, help="steps measured over the wire")
    ap.add_argument("--series", type=int, default=200, help="monitor series per rank (summary mode)")
    ap.add_argument("--pauses", type=int, default=3,
                    help="pause_all measurements over the wire, at phases 0.05, 0.5, 0.9 of the step in turn")
    ap.add_argument("--ranks", type=int, nargs="*", default=[64, 256], help="ranks of the summary-mode part")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tensors", type=int, default=1500, help="captured tensors per rank and step")
    args = ap.parse_args(argv)
    transport(args.real, args.simulated, args.period, args.hub_steps, args.series, args.pauses)
    if not args.ranks:
        return []
    rows = [run(r, args.steps, args.tensors) for r in args.ranks]
    head = ("ranks", "steps", "tensors/rank", "rank: summary ms", "hub ms/step", "hub p95 ms", "first(all) ms",
            "summary B/rank/step", "full table B/rank/step")
    print(" | ".join(head))
    for row in rows:
        print(" | ".join([f"{row['ranks']}", f"{row['steps']}", f"{row['tensors']}", f"{row['rank_summary_ms']:.3f}",
                          f"{row['hub_step_ms']:.2f}", f"{row['hub_step_p95_ms']:.2f}", f"{row['first_all_ms']:.1f}",
                          f"{row['summary_bytes']:.0f}", f"{row['full_table_bytes']}"]))
    return rows


if __name__ == "__main__":
    main()
