"""A live MindSpore data-parallel job (``msrun``, 2 ranks, CPU, PyNative, AllReduce over the ranks) debugged
from here: each rank attaches to a listener in this test (``nbdebug.attach`` with the listener's environment);
rank 1 produces NaN in its ``fault`` cell at step 3. The job names that rank, cell and step first; every rank
stands paused at one step boundary; terminate ends them all and msrun exits 0.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import mindspore  # noqa: F401 - the job runs MindSpore in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import NAN_STEP, free_port
from remote_procs import ROOT, SCRIPTS, kill_tree, until

import nbdebug

FAULT = "Cell.fault.Fault.forward.0"


def test_live_msrun_job_first_nonfinite_rank_and_group_pause(tmp_path):
    nproc, nan_rank = 2, 1
    gate, logs = tmp_path / "go", tmp_path / "logs"
    bindir = os.path.dirname(sys.executable)  # msrun starts its workers with "python" from PATH
    with nbdebug.listen(quiet=True) as listener:
        env = dict(os.environ, **listener.env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
                   PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
        cmd = ["timeout", "300", os.path.join(bindir, "msrun"), "--worker_num", str(nproc), "--local_worker_num",
               str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--log_dir", str(logs),
               "--join", "True", str(SCRIPTS / "ms_ranks_nan.py"), str(gate), str(nan_rank), str(NAN_STEP), "400"]
        out = open(tmp_path / "msrun.log", "w")  # noqa: SIM115 - closed below, whatever happens
        proc = subprocess.Popen(cmd, env=env, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)

        def worker_logs() -> str:
            return "".join(open(f, errors="replace").read()[-3000:] for f in sorted(glob.glob(str(logs / "*.log"))))

        try:
            until(lambda: listener.live_count() == nproc or proc.poll() is not None, 180, "every rank")
            assert listener.live_count() == nproc, worker_logs()
            job = listener.job
            assert job.ranks == [0, 1]
            assert all(job.source(r).remote_info["world_size"] == nproc for r in job.ranks)
            assert all(job.source(r).session.framework == "mindspore" for r in job.ranks)
            job.watch("TO")
            gate.write_text("go")

            until(lambda: job.first_nonfinite() is not None, 120, "a non-finite value")
            first = job.first_nonfinite()
            assert (first.rank, first.node, first.slot, first.step) == (nan_rank, FAULT, "output.0", NAN_STEP)
            assert all(job.summary(r, s).nonfinite_tensors == 0 for r in job.ranks for s in range(NAN_STEP))

            srcs = [job.source(r) for r in job.ranks]
            until(lambda: all(str(s.state) == "paused" for s in srcs)
                  and len({s.step_index for s in srcs}) == 1, 60, "every rank paused at one step")
            assert srcs[0].step_index > NAN_STEP and all(s.current_node is None for s in srcs)

            job.terminate()
            assert proc.wait(120) == 0, worker_logs()
            until(lambda: all(str(s.state) == "terminated" for s in srcs), 20, "every rank terminated")
        finally:
            kill_tree(proc.pid)  # msrun and every worker, whatever happened above
            proc.wait()
            out.close()
