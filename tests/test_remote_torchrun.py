"""``torchrun --nproc-per-node 2 -m nbdebug.run`` (gloo on CPU): both ranks attach through the runner, are
keyed by rank, pause together at the end of one step, step together and terminate cleanly."""

from __future__ import annotations

import os
import subprocess
import sys

import torch  # noqa: F401 - the job needs torch.distributed (tests/torch_only.py reads the imports)
import zmq  # noqa: F401
from remote_procs import ROOT, SCRIPTS, finish, until

import nbdebug


def test_two_gloo_ranks_pause_step_and_terminate_together():
    with nbdebug.listen(quiet=True) as listener:
        env = dict(os.environ, **listener.env, PYTHONPATH=str(ROOT))
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        proc = subprocess.Popen([torchrun, "--nproc-per-node", "2", "-m", "nbdebug.run",
                                 str(SCRIPTS / "ddp_train.py"), "5000"], env=env, cwd=str(ROOT),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            until(lambda: listener.live_count() == 2 or proc.poll() is not None, 120, "both ranks")
            assert listener.live_count() == 2, proc.communicate()[1][-3000:]
            assert list(listener.sources) == [0, 1]
            a, b = listener.sources[0], listener.sources[1]
            assert a.remote_info["world_size"] == b.remote_info["world_size"] == 2
            until(lambda: a.session.steps and b.session.steps, 60, "first steps")
            assert "Module.module.0.Linear.forward.0" in a.graph.nodes  # the DDP model was found
            a.pause()  # the panel's PAUSE on one rank pauses the job
            until(lambda: str(a.state) == str(b.state) == "paused", 30, "both ranks paused")
            assert a.step_index == b.step_index and a.current_node is None and b.current_node is None
            at = a.step_index
            b.cont(1)
            until(lambda: a.step_index == b.step_index == at + 1 and str(a.state) == str(b.state) == "paused",
                  30, "one step of both")
            listener.terminate_all()
            code, _out, err = finish(proc, 120)
            assert code == 0, err[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
