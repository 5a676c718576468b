"""Helpers for the remote-attach tests: start a training script as a real process attached to a listener,
read its progress file, wait for conditions."""

from __future__ import annotations

import os
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
