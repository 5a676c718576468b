"""Keep a native library's known noise out of the user's output, and nothing else.

MindSpore's C++ core logs to file descriptor 2 directly (a notebook shows it in the cell). While GRAPH
mode compiles a network defined in a notebook cell it logs two lines per traced function because the
cell's source file (``/tmp/ipykernel_*/….py``) does not exist on disk — 256 lines of ``[ERROR] CORE …
GetRealPath`` / ``ReadSectionDebugInfoFromFile`` for a LeNet, with nothing wrong.

:func:`native_stderr` points fd 2 at a temporary file for the duration of a ``with`` block (one capture
for the whole process: concurrent or nested blocks share it). At the end, every captured line that the
``noise`` pattern does not match is written back to fd 2; the matching lines are kept back — unless a block
raised, then everything captured is written back, as it may explain the failure. The last 1000 lines kept
back stay readable in :data:`dropped`.

>>> import os, re
>>> with native_stderr(re.compile("harmless")):
...     _ = os.write(2, b"harmless noise\\nreal problem\\n")   # "real problem" goes on to fd 2
>>> dropped[-1]
'harmless noise'
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

#: the most recent lines kept back (captures that ended without an error)
dropped: deque[str] = deque(maxlen=1000)

_lock = threading.Lock()
_state: dict = {"users": 0, "saved": None, "file": None, "failed": False, "noise": []}
#: the capture file, reused by every capture of the process (a graph run captures twice a step)
_spool: list = []


def _start(noise: re.Pattern) -> None:
    with _lock:
        _state["noise"].append(noise)
        if _state["users"] == 0:
            try:
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - a closed or odd stderr must not stop training
                pass
            if not _spool:
                _spool.append(tempfile.TemporaryFile())
            f = _spool[0]
            f.seek(0)
            f.truncate()
            _state.update(saved=os.dup(2), file=f, failed=False)
            os.dup2(f.fileno(), 2)
        _state["users"] += 1


def _stop(noise: re.Pattern, failed: bool) -> None:
    with _lock:
        _state["users"] -= 1
        _state["failed"] = _state["failed"] or failed
        if _state["users"]:
            return
        patterns = _state["noise"]
        saved, f = _state["saved"], _state["file"]
        os.dup2(saved, 2)
        os.close(saved)
        _state.update(saved=None, file=None, noise=[])
        if not os.fstat(f.fileno()).st_size:
            return
        f.seek(0)
        text = f.read().decode("utf-8", "replace")
        keep = text
        if not _state["failed"]:
            lines = text.splitlines(keepends=True)
            noisy = [any(p.search(ln) for p in patterns) for ln in lines]
            dropped.extend(ln.rstrip("\n") for ln, n in zip(lines, noisy, strict=True) if n)
            keep = "".join(ln for ln, n in zip(lines, noisy, strict=True) if not n)
        if keep:
            os.write(2, keep.encode("utf-8", "replace"))


@contextmanager
def native_stderr(noise: re.Pattern) -> Iterator[None]:
    """Capture fd 2 while the block runs; write back what ``noise`` does not match (all of it on error)."""
    _start(noise)
    failed = True
    try:
        yield
        failed = False
    finally:
        _stop(noise, failed)
