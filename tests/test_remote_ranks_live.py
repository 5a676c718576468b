"""A live ``torchrun`` job debugged from here: ``torchrun --nproc-per-node N -m nbdebug.run`` (gloo, CPU, 2 and 4
ranks) attached to a listener in this test; one rank produces NaN at step 3.

The watchpoint is set from the notebook side (``listener.job.watch("TO")``: every rank), before the ranks
train past step 0. The job — the model of ``listener.panel()`` — then names that rank, its ``fault`` node and
step 3 first; the rank that hit pauses at its step end and the listener lines the others up, so every rank
stands paused at the same step boundary (none inside a collective); ``terminate`` ends them all and torchrun
exits 0.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import NAN_STEP, free_port
from remote_procs import ROOT, SCRIPTS, kill_tree, until

import nbdebug
from nbdebug.ui.job_panel import JobPanel

FAULT = "Module.module.fault.Fault.forward.0"  # the DDP wrapper is the model the runner attached to


@pytest.mark.parametrize("nproc,nan_rank", [(2, 1), (4, 2)])
def test_live_torchrun_job_first_nonfinite_rank_and_group_pause(tmp_path, nproc, nan_rank):
    gate = tmp_path / "go"
    with nbdebug.listen(quiet=True) as listener:
        env = dict(os.environ, **listener.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        cmd = ["timeout", "300", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
               str(SCRIPTS / "ddp_nan.py"), str(gate), str(nan_rank), str(NAN_STEP), "400"]
        panel = JobPanel(listener.job, loop=None)  # listener.panel(), made before any rank connected
        assert panel.processes.value == f"<i>waiting for training processes on {listener.address}</i>"
        log = tmp_path / "torchrun.log"
        with open(log, "w") as out:  # a file, not a pipe: nothing blocks on a full pipe, or waits for its end
            proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # its own process group: killed whole on failure
        try:
            until(lambda: listener.live_count() == nproc or proc.poll() is not None, 180, "every rank")
            assert listener.live_count() == nproc, log.read_text()[-3000:]
            job = listener.job
            assert job.ranks == list(range(nproc)) and job.control is listener
            assert all(job.source(r).remote_info["world_size"] == nproc for r in job.ranks)
            panel.flush()  # the ranks joined the job and the panel as they connected
            assert panel.rank == 0 and panel.panel.source.obj is job.source(0)
            assert [o[1] for o in panel.rank_select.options] == list(range(nproc))
            assert all(f"<td>{r}</td>" in panel.processes.value for r in range(nproc))

            wps = job.watch("TO")  # from the notebook side, on every rank, while they wait at step 1
            assert sorted(wps) == job.ranks and all(w.condition == "TO" for w in wps.values())
            gate.write_text("go")

            until(lambda: job.first_nonfinite() is not None, 120, "a non-finite value")
            first = job.first_nonfinite()
            assert (first.rank, first.node, first.slot, first.step) == (nan_rank, FAULT, "output.0", NAN_STEP)
            assert all(job.summary(r, s).nonfinite_tensors == 0 for r in job.ranks for s in range(NAN_STEP))
            assert any(h.step == NAN_STEP and h.node == FAULT for h in job.hits[nan_rank])

            srcs = [job.source(r) for r in job.ranks]
            until(lambda: all(str(s.state) == "paused" for s in srcs)
                  and len({s.step_index for s in srcs}) == 1, 60, "every rank paused at one step")
            at = srcs[0].step_index
            assert at > NAN_STEP and all(s.current_node is None for s in srcs)  # at a step boundary
            assert all(s.step_index == at and str(s.state) == "paused" for s in srcs)  # still, a moment later

            panel.flush()
            assert f"first non-finite: rank {nan_rank}, node {FAULT}, step {NAN_STEP}" in panel.first.value
            assert panel.processes.value.count("<td>paused</td>") == nproc
            cmp = panel.compare(nan_rank, 0 if nan_rank else 1, NAN_STEP)  # the hit rank against a clean one
            fault_row = cmp.result.row(FAULT, "output.0")
            assert fault_row.status != "pass"

            panel.buttons["terminate"].click()  # the job's own TERMINATE: every rank
            assert proc.wait(120) == 0, log.read_text()[-3000:]
            until(lambda: all(str(s.state) == "terminated" for s in srcs), 20, "every rank terminated")
            panel.close()
        finally:
            kill_tree(proc.pid)  # torchrun and every rank, whatever happened above
            proc.wait()
