"""The interchange tests' shared machinery: one training script run per (tool, case, level) in subprocesses,
and the ``data`` of one step of a run's dump.

>>> import tempfile, pathlib
>>> root = pathlib.Path(tempfile.mkdtemp())
>>> outs = run_scripts(root, "import sys, os; os.makedirs(sys.argv[-1])", [("a", "b")])
>>> sorted(outs) == [("a", "b")] and os.path.isdir(outs[("a", "b")])
True
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_scripts(root: Path, script: str, runs: list[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """Write ``script`` under ``root`` and run it once per key (its words as arguments, then the output
    folder), two at a time; ``{key: output folder}``. A run that fails fails the caller with its output."""
    path = root / "train.py"
    path.write_text(script)
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")

    def run(key):
        out = str(root / "_".join(key))
        proc = subprocess.run([sys.executable, str(path), *key, out], cwd=str(root), env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{key}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        return out

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(runs, pool.map(run, runs), strict=True))


def step_data(out: str, step: int) -> dict:
    """The ``data`` of step ``step``'s ``dump.json`` under ``out``."""
    (path,) = glob.glob(os.path.join(out, "dump", f"step{step}", "*", "dump.json"))
    with open(path) as f:
        return json.load(f)["data"]
