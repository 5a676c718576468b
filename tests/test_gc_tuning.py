"""While a Debugger is attached the collector's young threshold is raised (fewer collections of the
capture's short-lived records); the user's thresholds come back when the last Debugger goes.

Each case runs in a fresh interpreter: Debuggers other tests leave attached in this process would hold
the threshold up and hide what is checked here."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch  # noqa: F401 - the cases attach to torch models (tests/torch_only.py reads the imports)

PRELUDE = """
import gc
import os
import torch
import nbdebug
from nbdebug.frameworks.core.gc_tuning import YOUNG
gc.set_threshold(700, 10, 10)
def model():
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
"""

CASES = {
    "raised while attached, restored after the last close": """
        a = nbdebug.Debugger(model())
        assert gc.get_threshold() == (YOUNG, 10, 10), gc.get_threshold()
        m2 = model()
        b = nbdebug.Debugger(m2, level="mix")
        a.close()
        assert gc.get_threshold() == (YOUNG, 10, 10)  # b still captures
        m2(torch.ones(2, 3)).sum().backward()
        b.close()
        b.close()  # a second close changes nothing
        assert gc.get_threshold() == (700, 10, 10), gc.get_threshold()
    """,
    "a Debugger collected without close lets go": """
        dbg = nbdebug.Debugger(model())
        assert gc.get_threshold()[0] == YOUNG
        del dbg
        gc.collect()
        assert gc.get_threshold() == (700, 10, 10), gc.get_threshold()
    """,
    "thresholds the user set meanwhile are kept": """
        dbg = nbdebug.Debugger(model())
        gc.set_threshold(1234, 5, 5)
        dbg.close()
        assert gc.get_threshold() == (1234, 5, 5), gc.get_threshold()
    """,
    "disabled automatic collection stays disabled": """
        gc.set_threshold(0, 10, 10)
        dbg = nbdebug.Debugger(model())
        assert gc.get_threshold() == (0, 10, 10), gc.get_threshold()
        dbg.close()
    """,
    "NBDEBUG_GC_TUNE=0 leaves the collector alone": """
        os.environ["NBDEBUG_GC_TUNE"] = "0"
        dbg = nbdebug.Debugger(model())
        assert gc.get_threshold() == (700, 10, 10), gc.get_threshold()
        dbg.close()
    """,
}


@pytest.mark.parametrize("case", list(CASES))
def test_collector_threshold(case):
    env = {k: v for k, v in os.environ.items() if k != "NBDEBUG_GC_TUNE"}
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(CASES[case]) + "\nprint('ok')\n"],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
