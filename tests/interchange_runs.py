"""The interchange tests' shared machinery: one training script run per (tool, case, level) in subprocesses,
and the ``data`` of one step of a run's dump.

Each run is a process of its own, forked from a parent that has imported what that tool's runs import (torch,
and msProbe or nbdebug): a fresh interpreter per run spent most of its ~6 s of CPU importing them. The parent
imports nothing else, runs no torch op before forking (no thread is started), and the run's script then
executes as ``__main__`` with its own ``sys.argv``, its own output, and its exit code.

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


#: what the runs of each tool (a key's first word) import anyway: imported once, in the parent of its runs
#: script lines writing the statistics ``config.json`` both tools read (``out`` and ``level`` defined before)
WRITE_CONFIG = r'''os.makedirs(out, exist_ok=True)
cfg = os.path.join(out, "config.json")
with open(cfg, "w") as f:
    json.dump({"task": "statistics", "dump_path": os.path.join(out, "dump"), "rank": [], "step": [],
               "level": level, "async_dump": False,
               "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}, f)
'''

TOOL_IMPORTS = {"msprobe": ("torch", "msprobe.pytorch"), "nbdebug": ("torch", "nbdebug"), "plain": ("torch",)}

#: the parent of one tool's runs: ``python -c FORK_PARENT imports jobs``, one job ``[script, args..., log]``
#: after the other, each in a forked child; the children's exit codes, one a line (``exit N``)
FORK_PARENT = r"""
import atexit, json, os, runpy, sys, traceback
imports, jobs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for name in imports:
    __import__(name)
assert len(os.listdir("/proc/self/task")) == 1, "a thread before fork"
for script, *args, log in jobs:
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1); os.dup2(fd, 2); os.close(fd)
        sys.path[0] = os.path.dirname(script)  # as for `python script.py`
        sys.argv, code = [script, *args], 0
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        try:
            atexit._run_exitfuncs()  # what the interpreter's exit would run
        finally:
            sys.stdout.flush(); sys.stderr.flush()
            os._exit(code)
    print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


def run_scripts(root: Path, script: str, runs: list[tuple[str, ...]], imports: tuple[str, ...] = ()
                ) -> dict[tuple[str, ...], str]:
    """Write ``script`` under ``root`` and run it once per key (its words as arguments, then the output
    folder); ``{key: output folder}``. A run that fails fails the caller with its output.

    The runs of one tool (a key's first word) are forked one after the other from one parent that imported
    ``TOOL_IMPORTS[tool]`` and ``imports`` (modules every run of the script imports); two tools at a time."""
    path = root / "train.py"
    path.write_text(script)
    outs = {key: str(root / "_".join(key)) for key in runs}
    by_tool: dict[str, list[tuple[str, ...]]] = {}
    for key in runs:
        by_tool.setdefault(key[0], []).append(key)
    codes = run_forked({tool: (TOOL_IMPORTS.get(tool, ()) + tuple(imports),
                                     [[str(path), *key, outs[key], outs[key] + ".log"] for key in keys])
                              for tool, keys in by_tool.items()}, cwd=root)
    for key in runs:
        log = Path(outs[key] + ".log").read_text(errors="replace")
        assert codes[key[0]][by_tool[key[0]].index(key)] == 0, f"{key}:\n{log[-4000:]}"
    return outs


def run_forked(groups: dict[str, tuple[tuple[str, ...], list[list[str]]]], cwd: Path) -> dict[str, list[int]]:
    """Run each job (``[script, args..., log path]``: a script, its arguments, and the file that gets its
    stdout and stderr), each group's jobs forked one after the other from one parent that imported the group's
    modules first, two groups at a time; ``{group: exit codes, in job order}``."""
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")

    def run(group):
        imports, jobs = groups[group]
        proc = subprocess.run([sys.executable, "-c", FORK_PARENT, json.dumps(list(imports)), json.dumps(jobs)],
                              cwd=str(cwd), env=env, capture_output=True, text=True,
                              timeout=300 * len(jobs))
        codes = [int(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("exit ")]
        assert proc.returncode == 0 and len(codes) == len(jobs), f"{group}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
        return codes

    with ThreadPoolExecutor(2) as pool:
        return dict(zip(groups, pool.map(run, groups), strict=True))


def step_data(out: str, step: int) -> dict:
    """The ``data`` of step ``step``'s ``dump.json`` under ``out``."""
    (path,) = glob.glob(os.path.join(out, "dump", f"step{step}", "*", "dump.json"))
    with open(path) as f:
        return json.load(f)["data"]
