"""A real MindSpore data-parallel job (``msrun``, 2 ranks, CPU, PyNative) debugged offline from its per-rank
dumps: ``tests/ranks_train_ms.py`` averages the gradients over the ranks with an AllReduce
(``nn.DistributedGradReducer``) and dumps through ``nbdebug.PrecisionDebugger``; rank 1 produces NaN in its
``fault`` cell at step 3. The same checks as the ``torchrun`` job (``tests/ranks_checks.py``)."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import mindspore  # noqa: F401 - the job runs MindSpore in its processes (tests/torch_only.py reads this)
from ranks_checks import NAN_STEP, STEPS, check_job, free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "ranks_train_ms.py")


def test_msrun_job(tmp_path):
    nproc, nan_rank = 2, 1
    dump, logs = str(tmp_path / "dump"), str(tmp_path / "logs")
    bindir = os.path.dirname(sys.executable)  # msrun starts its workers with "python" from PATH
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = ["timeout", "300", os.path.join(bindir, "msrun"), "--worker_num", str(nproc), "--local_worker_num",
           str(nproc), "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "--log_dir", logs,
           "--join", "True", SCRIPT, dump, str(nan_rank), str(NAN_STEP), str(STEPS)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=360)
    worker_logs = "".join(open(f, errors="replace").read() for f in sorted(glob.glob(os.path.join(logs, "*.log"))))
    assert proc.returncode == 0, f"msrun failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{worker_logs[-5000:]}"
    results = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", worker_logs)]
    check_job(dump, nproc, nan_rank, results, "Cell", "Dense")
