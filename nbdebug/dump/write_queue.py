"""The writer thread's plumbing: a queue bounded by items and bytes between the training thread and the
writer, no temporary file left after a failed save, and a readable cause for failed writes (a full disk said
as such).

>>> q = WriteQueue(max_items=2, max_bytes=10); q.put("a", 4); q.get()
'a'
>>> write_cause(["OSError: boom"], "/tmp")
'OSError: boom'
"""

from __future__ import annotations

import errno
import glob
import os
import threading
import weakref
from collections import deque
from typing import Any


class WriteQueue:
    """FIFO between the training thread and the writer thread, bounded by item count and bytes."""

    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.items: deque[tuple[Any, int]] = deque()
        self.bytes = 0
        self.max_items, self.max_bytes = max_items, max_bytes
        self.busy = 0
        self.cv = threading.Condition()

    def put(self, item: Any, nbytes: int = 0) -> None:
        with self.cv:
            while self.items and (len(self.items) >= self.max_items or self.bytes + nbytes > self.max_bytes):
                self.cv.wait()
            self.items.append((item, nbytes))
            self.bytes += nbytes
            self.cv.notify_all()

    def get(self) -> Any:
        with self.cv:
            self.busy = 0
            while not self.items:
                self.cv.wait()
            item, nbytes = self.items.popleft()
            self.bytes -= nbytes
            self.busy = 1  # until the next get(): the item is being written
            self.cv.notify_all()
            return item


class no_leftovers:  # noqa: N801 - a context manager used like a function
    """On a failed save, remove the temporary files of ``path`` (``path.tmp*``) the saver left."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            for tmp in glob.glob(glob.escape(self.path) + ".tmp*"):
                try:
                    os.remove(tmp)
                except OSError:
                    pass


def write_cause(errors: list[str], where: str) -> str:
    """A readable cause for writer errors: a full disk is said as such (torch's serializer reports it as
    "PytorchStreamWriter failed writing file ..."), other errors are shown shortened."""
    uniq = list(dict.fromkeys(e.splitlines()[0][:300] for e in errors if e))
    text = "; ".join(uniq[:2]) + (f" ({len(errors)} failed writes in all)" if len(errors) > 2 else "") \
        if uniq else "unknown error"
    probe = where
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    free = None
    try:
        st = os.statvfs(probe or ".")
        free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    full = (os.strerror(errno.ENOSPC) in text or "ENOSPC" in text or os.strerror(errno.EDQUOT) in text
            or (free is not None and free < 1 << 20))
    if full:
        return (f"the disk holding {probe or where} is full ({free if free is not None else '?'} bytes free); "
                f"free some space or dump elsewhere (cause: {text})")
    return text


def close_at_exit(writer: Any) -> Any:
    """An ``atexit`` function closing ``writer`` (held weakly) if it is still open: what was produced is written."""
    ref = weakref.ref(writer)

    def at_exit() -> None:  # the interpreter is ending: write what was produced (as msProbe does)
        w = ref()
        if w is not None and not w.closed:
            try:
                w.close()
            except Exception:
                pass

    return at_exit
