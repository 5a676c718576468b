"""ODD_RANK set on a listener's job before any rank connects (issue 20): the ranks of a live 4-rank ``torchrun``
job (gloo, CPU, ``remote_scripts/ddp_odd.py``: rank 2's data ×1e3 from step K) join afterwards, each gets the
watchpoint in its welcome, and the job's ODD_RANK finds it among the rank's own (mirrored) watchpoints — it
names rank 2 at step K and pauses the job at one step; ``job.unwatch()`` then ends ODD_RANK too, and the job
runs to its end."""

from __future__ import annotations

import os
import subprocess
import sys

import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import free_port
from remote_procs import ROOT, SCRIPTS, kill_tree, until

import nbdebug

NPROC, ODD, K, STEPS = 4, 2, 5, 14


def test_odd_rank_set_before_the_ranks_join_names_the_scaled_rank(tmp_path):
    gate = tmp_path / "go"
    gate.write_text("go")  # the ranks do not wait: the watchpoint must reach them as they join
    with nbdebug.listen(quiet=True) as listener:
        job = listener.job
        assert job.watch("ODD_RANK", field="output_norm", z=6) == {}  # no rank yet
        env = dict(os.environ, **listener.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        cmd = ["timeout", "300", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(NPROC),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
               str(SCRIPTS / "ddp_odd.py"), str(gate), str(ODD), str(K), str(STEPS)]
        log = tmp_path / "torchrun.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            def odd_hits():
                return [(r, h) for r, hs in job.hits.items() for h in hs if h.condition == "ODD_RANK"]

            until(lambda: odd_hits() or proc.poll() is not None, 180,
                  lambda: f"ODD_RANK hits; {log.read_text()[-2000:]}")
            assert job.ranks == list(range(NPROC)), log.read_text()[-3000:]
            wps = job.odd_rank.watches[0]
            assert sorted(wps) == job.ranks  # every joined rank's own watchpoint, found
            assert all(job.source(r).watchpoints.watchpoints.get(w.id) is w for r, w in wps.items())
            found = odd_hits()
            assert min(h.step for _r, h in found) == K, [(r, h.describe()) for r, h in found]
            assert {r for r, h in found if h.step == K} == {ODD}
            srcs = [job.source(r) for r in job.ranks]
            until(lambda: all(str(s.state) == "paused" for s in srcs) and len({s.step_index for s in srcs}) == 1,
                  60, lambda: f"the job paused at one step: {[(str(s.state), s.step_index) for s in srcs]}")
            job.unwatch()
            assert job.odd_rank.watches == [] and all(not s.watchpoints.watchpoints for s in srcs)
            before = len(odd_hits())
            job.cont()
            assert proc.wait(180) == 0, log.read_text()[-3000:]
            assert len(odd_hits()) == before  # rank 2 stayed odd; nothing watched it any more
        finally:
            kill_tree(proc.pid)
            proc.wait()
