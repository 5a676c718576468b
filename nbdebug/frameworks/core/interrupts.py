"""A Ctrl-C (the kernel's Interrupt) held back while a step's boundary is written, then raised.

A ``KeyboardInterrupt`` is raised between any two bytecodes of the main thread. Landing inside the step end
(the step's table stored, the recorder not yet replaced, the monitor row half built), it left the session
between two steps: the step was in :attr:`Session.steps` but its monitor row was missing, and what was
recorded next went into a recorder of the step before. :func:`interrupts_deferred` takes SIGINT for the
few milliseconds of the boundary and raises the interrupt once the boundary is whole — on the main thread
only (Python delivers signals there; other threads are not interrupted by Ctrl-C).

>>> import os, signal
>>> try:
...     with interrupts_deferred():
...         os.kill(os.getpid(), signal.SIGINT)  # arrives inside: held back
...         held = "inside"
... except KeyboardInterrupt:
...     raised = "after"
>>> held, raised
('inside', 'after')
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["interrupts_deferred"]


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back SIGINT for the block; the handler in force before it runs after it (default: raises
    ``KeyboardInterrupt``). Off the main thread, or when SIGINT is not Python's to handle, a plain block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    if not callable(before):  # SIG_IGN / SIG_DFL / set outside Python: nothing of ours to defer
        yield
        return
    got: list[tuple[int, object]] = []
    signal.signal(signal.SIGINT, lambda signum, frame: got.append((signum, frame)))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        if got:
            before(*got[0])
