"""Held-out trials of a multi-rank job driven as from a notebook: a real 3-rank ``torchrun`` job (gloo, CPU,
``-m nbdebug.run``) of a tiny GPT-2 built from a config (``remote_scripts/ddp_gpt2_odd.py``) at the MONITOR level
(``NBDEBUG_LEVEL=monitor``), attached to a listener here; rank 1's input embeddings are ×100 from step K (a bad
shard), and in the second trial hold a NaN at step N.

1. ODD_RANK and SPIKE over the job name rank 1 at step K (nothing before K, no other rank at K); the job's
   ranks × steps timeline shows rank 1 far above the others there; ``pause_all`` / ``cont_all(2)`` keep the
   ranks at one step boundary; ``terminate_all`` ends the job and torchrun exits 0.
2. The notebook's kernel restarts (the listener closes; a new one listens on the same port and token): every
   rank comes back with its monitor series complete from step 0 (the values the first notebook had, bitwise),
   and ``job.first_nonfinite()`` names rank 1 at step N.

Before ``protocol.array_frame`` flattened its array, no step of a monitor-level process ever reached the notebook
(a monitor-level step's statistics table is empty, 0 rows × FIELDS, and a memoryview of such an array cannot be
cast to bytes: the agent's step handler raised on every step), so no remote watchpoint over the monitor series
could fire. Before the job read a monitor-level rank's steps and summaries from its monitor rows
(``job/summary.py``'s ``monitor_origin``), ``job.first_nonfinite()`` answered None for such a job.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import transformers  # noqa: F401 - the job builds a GPT-2 from a config
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import free_port
from remote_procs import ROOT, SCRIPTS, kill_tree, until

import nbdebug
from nbdebug.remote import protocol as P

pytestmark = [pytest.mark.subprocess, pytest.mark.slow]

NPROC, ODD, K = 3, 1, 8


def _job(listener, tmp_path, gate, nan_step, steps):
    env = dict(os.environ, **listener.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), NBDEBUG_LEVEL="monitor")
    cmd = ["timeout", "200", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
           str(SCRIPTS / "ddp_gpt2_odd.py"), str(gate), str(ODD), str(K), str(nan_step), str(steps)]
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:  # a file, not a pipe: nothing blocks on a full pipe
        proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: killed whole on failure
    return proc, log


def _states(srcs):
    return [(s.key, str(s.state), s.step_index) for s in srcs]


def test_empty_table_travels():
    """A monitor-level step's table (no rows) encodes and decodes; it raised in ``array_frame``."""
    from nbdebug.session.stats import FIELDS, StatsTable

    table = StatsTable()
    table.values = np.zeros((0, len(FIELDS)))
    head, frames = P.table_header(table, P.KeyBook())
    decoded, got = P.decode(P.encode({"type": "step", "table": head}, frames))
    back = P.read_table(decoded["table"], got, {})
    assert back.keys == [] and back.values.shape == (0, len(FIELDS))


def test_monitor_level_job_odd_rank_spike_timeline_and_lockstep(tmp_path):
    from nbdebug.ui.job_timeline import RankTimeline

    gate = tmp_path / "go"
    with nbdebug.listen(quiet=True) as listener:
        proc, log = _job(listener, tmp_path, gate, -1, 400)
        try:
            until(lambda: listener.live_count() == NPROC or proc.poll() is not None, 180, "every rank")
            assert listener.live_count() == NPROC, log.read_text()[-3000:]
            job = listener.job
            srcs = [job.source(r) for r in job.ranks]
            assert job.ranks == [0, 1, 2] and {s.level for s in srcs} == {"monitor"}
            odd = job.watch("ODD_RANK", field="output_norm", z=6)
            spike = job.watch("SPIKE", field="output_norm", factor=10, window=10)
            gate.write_text("go")

            def hits(wps):
                return [(r, h) for r, hs in job.hits.items() for h in hs if h.watchpoint == wps[r].id]

            until(lambda: hits(odd) and hits(spike), 120,
                  lambda: f"ODD_RANK and SPIKE hits; {_states(srcs)}\n{log.read_text()[-2000:]}")
            for wps in (odd, spike):
                found = hits(wps)
                assert min(h.step for _r, h in found) == K, [(r, h.describe()) for r, h in found]
                assert {r for r, h in found if h.step == K} == {ODD}, [(r, h.describe()) for r, h in found]
            at_k = [h for _r, h in hits(odd) if h.step == K]
            assert any(h.node == "Module.module.transformer.drop.Dropout" for h in at_k)  # the scaled embeddings
            assert all("rank 1" in h.advice for h in at_k)
            # the job pauses at one step boundary (a hit, then the others lined up)
            until(lambda: all(str(s.state) == "paused" for s in srcs) and len({s.step_index for s in srcs}) == 1,
                  60, lambda: f"the job paused at one step: {_states(srcs)}")
            # the ranks × steps timeline of the scaled module's output norm: rank 1 stands out from step K
            tl = RankTimeline(job)
            assert tl.field == "loss" and tl.names() == ["Run"]  # the model's own loss, on every rank
            tl.field, tl.name = "output_norm", "Module.module.transformer.drop.Dropout"
            msg, bufs = tl.message()
            assert [r[0] for r in msg["rows"]] == ["0", "1", "2"] and msg["series"] == tl.name
            for r in job.ranks:
                steps, values = job.source(r).session.monitor.series(tl.name, "output_norm")
                assert steps.tolist()[: K + 1] == list(range(K + 1))
                ratio = values[K] / values[K - 1]
                assert (ratio > 50) == (r == ODD), (r, values[: K + 2])
            # pause_all / cont_all(2) keep the ranks in lockstep
            job.unwatch()
            job.cont()
            until(lambda: min(s.step_index for s in srcs) > K + 5, 60, lambda: _states(srcs))
            at = listener.pause_all()
            until(lambda: all(str(s.state) == "paused" for s in srcs), 60, lambda: _states(srcs))
            assert {s.step_index for s in srcs} == {at + 1}, (at, _states(srcs))
            listener.cont_all(2)
            until(lambda: all(str(s.state) == "paused" and s.step_index == at + 3 for s in srcs), 60,
                  lambda: f"two more steps of every rank from {at + 1}: {_states(srcs)}")
            listener.terminate_all()  # every rank at once; none is left in an allreduce
            assert proc.wait(120) == 0, log.read_text()[-3000:]
        finally:
            kill_tree(proc.pid)
            proc.wait()


def test_monitor_level_job_restart_gives_back_every_series_and_first_nonfinite(tmp_path):
    nan_step = 14
    gate = tmp_path / "go"
    gate.write_text("go")  # no watchpoints: train on at once
    first = nbdebug.listen(quiet=True)
    port, token = first.port, first.token
    proc, log = _job(first, tmp_path, gate, nan_step, 400)
    second = None
    try:
        until(lambda: first.live_count() == NPROC or proc.poll() is not None, 180, "every rank")
        assert first.live_count() == NPROC, log.read_text()[-3000:]
        srcs = [first.job.source(r) for r in first.job.ranks]
        until(lambda: all((s.session.monitor.last_step or -1) >= 6 for s in srcs), 60, "monitor rows")
        before = {s.key: s.session.monitor for s in srcs}
        first.close()  # the kernel restarts: everything the notebook had of the job is gone
        second = nbdebug.listen(port, token=token, quiet=True)
        second.wait_for(NPROC, 60)
        job = second.job
        assert job.ranks == [0, 1, 2]
        again = [job.source(r) for r in job.ranks]
        until(lambda: all((s.session.monitor.last_step or -1) > nan_step + 2 for s in again), 60,
              lambda: f"the rows re-sent and new ones: {_states(again)}")
        key = ("Module.module.transformer.drop.Dropout", "output_norm")
        for s in again:
            mon, had = s.session.monitor, before[s.key]
            assert mon is not had
            steps, values = mon.series(*key)
            assert steps.tolist() == list(range(int(steps[-1]) + 1)), (s.key, steps.tolist())
            old = list(had.keys)
            assert set(old) <= set(mon.keys)
            n = had.last_step + 1  # the steps the first notebook had: the same values, bitwise
            got, kept = mon.columns(old), had.columns(old)
            assert got[0][:n].tolist() == kept[0][:n].tolist()
            assert np.array_equal(got[1][:n], kept[1][:n], equal_nan=True)
            assert np.isnan(values[nan_step]) == (s.key == ODD), (s.key, values[nan_step - 1: nan_step + 1])
        first_nan = job.first_nonfinite()
        assert first_nan is not None and (first_nan.rank, first_nan.step) == (ODD, nan_step), first_nan
        assert first_nan.node == "Module.module.transformer.drop.Dropout"  # where the NaN was made
        second.terminate_all()
        assert proc.wait(120) == 0, log.read_text()[-3000:]
    finally:
        first.close()
        if second is not None:
            second.close()
        kill_tree(proc.pid)
        proc.wait()
