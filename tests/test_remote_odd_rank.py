"""ODD_RANK over the wire: a live 4-rank ``torchrun`` job (gloo, CPU, ``-m nbdebug.run``) attached to a listener
here; rank 2's data is ×1e3 from step k (issue 20). ``job.watch("ODD_RANK", field=..., z=6)`` from the notebook
side names rank 2 at step k — on a monitor series (each step's monitor row travels with the step,
:mod:`nbdebug.remote.monitor_wire`) and on a statistic of the module outputs (the step's table) — nothing fires
before k, and the job pauses at one step boundary."""

from __future__ import annotations

import os
import subprocess
import sys

import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import free_port
from remote_procs import ROOT, SCRIPTS, kill_tree, until

import nbdebug

NPROC, ODD, K = 4, 2, 5


def test_odd_rank_names_the_scaled_rank_at_its_step(tmp_path):
    gate = tmp_path / "go"
    with nbdebug.listen(quiet=True) as listener:
        env = dict(os.environ, **listener.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        cmd = ["timeout", "300", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
               str(SCRIPTS / "ddp_odd.py"), str(gate), str(ODD), str(K), "400"]
        log = tmp_path / "torchrun.log"
        with open(log, "w") as out:  # a file, not a pipe: nothing blocks on a full pipe
            proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: killed whole on failure
        try:
            until(lambda: listener.live_count() == NPROC or proc.poll() is not None, 180, "every rank")
            assert listener.live_count() == NPROC, log.read_text()[-3000:]
            job = listener.job
            monitor = job.watch("ODD_RANK", field="output_norm", z=6)
            stats = job.watch("ODD_RANK", "Module.*.forward.*", field="norm", z=6)
            assert sorted(monitor) == job.ranks == list(range(NPROC))
            assert all(w.condition == "ODD_RANK" for w in (*monitor.values(), *stats.values()))
            gate.write_text("go")

            def odd_hits():
                return [(r, h) for r, hs in job.hits.items() for h in hs if h.condition == "ODD_RANK"]

            until(lambda: any(h.watchpoint == stats[r].id for r, h in odd_hits())
                  and any(h.watchpoint == monitor[r].id for r, h in odd_hits()), 120, "ODD_RANK hits")
            found = odd_hits()
            for wps in (monitor, stats):
                mine = [(r, h) for r, h in found if h.watchpoint == wps[r].id]
                first = min(h.step for _r, h in mine)
                assert first == K, [(r, h.describe()) for r, h in mine]
                assert {r for r, h in mine if h.step == K} == {ODD}, [(r, h.describe()) for r, h in mine]
            at_k = [h for r, h in found if h.step == K]
            assert any(h.slot == "output_norm" and h.node.startswith("Module.") for h in at_k)
            assert any(h.slot.startswith("output") and ".forward." in h.node for h in at_k)
            assert all("ranks' median" in h.advice and "rank 2" in h.advice for h in at_k)
            # every rank's monitor series came over the wire, one row per step
            mon = job.source(0).session.monitor
            # (no Run loss: the script gives none and its model's output is no scalar, so the series is absent)
            assert mon.last_step is not None and mon.last_step >= K and ("Run", "grad_norm_total") in mon
            srcs = [job.source(r) for r in job.ranks]
            until(lambda: all(str(s.state) == "paused" for s in srcs)
                  and len({s.step_index for s in srcs}) == 1, 60,
                  lambda: f"the job paused at one step: {[(str(s.state), s.step_index) for s in srcs]}")
            job.terminate()  # every rank at once: a rank ended alone would leave the others in a collective
            assert proc.wait(120) == 0, log.read_text()[-3000:]
        finally:
            kill_tree(proc.pid)  # torchrun and every rank, whatever happened above
            proc.wait()
