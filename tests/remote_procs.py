"""Helpers for the remote-attach tests: start a training script as a real process attached to a listener,
read its progress file, wait for conditions."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "remote_scripts"


def start(script: str, args: list[str], env: dict[str, str], *, runner: bool = False) -> subprocess.Popen:
    """``python [-m nbdebug.run] SCRIPT ARGS`` with ``env`` added; this worktree's nbdebug first on the path."""
    full = dict(os.environ, **env)
    full["PYTHONPATH"] = str(ROOT) + os.pathsep + full.get("PYTHONPATH", "")
    cmd = [sys.executable, *(["-m", "nbdebug.run"] if runner else []), str(SCRIPTS / script), *args]
    return subprocess.Popen(cmd, env=full, cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def progress(out: Path) -> int:
    """Steps the script finished (it writes them after each step)."""
    try:
        return int((out / "progress").read_text() or 0)
    except (FileNotFoundError, ValueError):
        return 0


def until(cond, timeout: float = 30.0, what: Any = "condition") -> None:
    """Wait for ``cond()``; ``what`` (a text, or a function giving one at the time out) says what was awaited."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what() if callable(what) else what}")
        time.sleep(0.02)


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str, str]:
    """Wait for the process (killed after ``timeout``); ``(returncode, stdout, stderr)``."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the training process did not end within {timeout} s:\n{err[-3000:]}") from None
    return proc.returncode, out, err


def kill_tree(pid: int) -> None:
    """SIGKILL process ``pid``, its process group and every descendant (torchrun starts each rank in a session
    of its own, so killing the launcher's group alone leaves the ranks training after a failed test)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, ()))
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for p in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, signal.SIGKILL)


@contextlib.contextmanager
def ddp_nan_job(env: dict[str, str], tmp_path: Path, gate: Path, steps: int, nan_rank: int, nan_step: int):
    """``torchrun --nproc-per-node 2 -m nbdebug.run ddp_nan.py`` (``nan_rank`` makes a NaN at ``nan_step``; a
    step past ``steps`` makes none) with ``env`` (a listener's); yields ``(process, log path)``; the launcher
    and every process it started are killed on the way out (:func:`kill_tree`)."""
    from ranks_checks import free_port

    full = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    cmd = ["timeout", "200", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
           str(SCRIPTS / "ddp_nan.py"), str(gate), str(nan_rank), str(nan_step), str(steps)]
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=full, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc, log
    finally:
        kill_tree(proc.pid)
        proc.wait()
