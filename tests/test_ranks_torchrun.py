"""A real ``torchrun`` job (gloo backend, CPU, 2 and 4 ranks) debugged offline from its per-rank dumps.

``tests/ranks_train.py`` trains a small model under DDP with one ``nbdebug.Debugger`` (4 ranks) or msProbe's
``PrecisionDebugger`` API (2 ranks) per rank dumping ``step{N}/rank{R}`` (tensor task); rank ``NAN_RANK``
produces NaN in its ``fault`` module at step 3. ``tests/ranks_checks.py`` asserts the loaded job: that rank
and node first at step 3, per-rank hits, and what DDP guarantees across ranks.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch  # noqa: F401 - the job runs torch in its processes (tests/torch_only.py reads this import)
from ranks_checks import NAN_STEP, STEPS, check_job, free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "ranks_train.py")


def _torchrun(nproc: int, dump: str, nan_rank: int, tool: str) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = ["timeout", "240", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), SCRIPT, dump, str(nan_rank),
           str(NAN_STEP), str(STEPS), tool]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-5000:]}")
    return [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", proc.stdout)]


@pytest.mark.parametrize("nproc,nan_rank,tool", [(2, 1, "precision"), (4, 2, "debugger")])
def test_torchrun_job(tmp_path, nproc, nan_rank, tool):
    dump = str(tmp_path / "dump")
    results = _torchrun(nproc, dump, nan_rank, tool)
    check_job(dump, nproc, nan_rank, results, "Module", "Linear")
