"""Coalesced view refreshes: mark parts dirty from any thread, redraw at most ``rate`` times a second.

Events from the training thread only *mark* what changed (cheap, no widget touched). Inside a Jupyter
kernel the redraw runs on the kernel's event loop, at most ``rate`` times per second however many
events arrive, so a widget never gets more than ``rate`` updates a second. Without an event loop (plain
Python, tests) nothing is scheduled: the owner calls :meth:`Coalescer.flush` (a panel does so after
each of its own actions), which keeps kernel-level tests deterministic.

>>> done = []
>>> c = Coalescer(done.append, loop=None)
>>> c.mark("header"); c.mark("hits", "header")
>>> sorted(c.pending)
['header', 'hits']
>>> c.flush(); [sorted(parts) for parts in done]
[['header', 'hits']]
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

_AUTO: Any = object()


def kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The running asyncio loop (a Jupyter kernel runs cells inside it), else None."""
    try:
        loop = asyncio.get_running_loop()
        if asyncio.current_task(loop) is not None:  # a loop executing us (not merely parked here)
            return loop
    except RuntimeError:
        pass
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    kernel = getattr(get_ipython(), "kernel", None)
    if kernel is None or threading.current_thread() is not threading.main_thread():
        return None
    loop = getattr(getattr(kernel, "io_loop", None), "asyncio_loop", None)
    return loop


class Coalescer:
    """Collects dirty parts and calls ``redraw(parts)`` at most ``rate`` times per second."""

    def __init__(self, redraw: Callable[[set[str]], Any], rate: float = 10.0,
                 loop: asyncio.AbstractEventLoop | None | Any = _AUTO) -> None:
        self._redraw = redraw
        self.min_interval = 1.0 / rate if rate > 0 else 0.0
        self.loop = kernel_loop() if loop is _AUTO else loop
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._scheduled = False
        self._last = 0.0
        self.redraws = 0  # how many redraws ran (for tests and benches)

    @property
    def pending(self) -> set[str]:
        with self._lock:
            return set(self._dirty)

    @property
    def automatic(self) -> bool:
        """True when redraws are scheduled on an event loop (inside a kernel)."""
        return self.loop is not None and not self.loop.is_closed()

    def mark(self, *parts: str) -> None:
        """Mark ``parts`` dirty (any thread); schedules a redraw when running on an event loop."""
        promised = False
        try:
            with self._lock:
                self._dirty.update(parts)
                if self._scheduled or not self.automatic:
                    return
                promised = self._scheduled = True
                delay = max(0.0, self._last + self.min_interval - time.monotonic())
            self.loop.call_soon_threadsafe(self._schedule, delay)
        except RuntimeError:  # loop closed meanwhile
            self._unpromise(promised)
        except BaseException:  # the kernel's Interrupt in a foreground training loop, which marks on each step:
            self._unpromise(promised)  # a redraw promised and never scheduled stopped every later one
            raise

    def _unpromise(self, promised: bool) -> None:
        if promised:
            with self._lock:
                self._scheduled = False

    def _schedule(self, delay: float) -> None:
        if delay > 0:
            self.loop.call_later(delay, self._run)
        else:
            self._run()

    def _run(self) -> None:
        with self._lock:
            self._scheduled = False
        self.flush()

    def flush(self) -> None:
        """Redraw everything pending now (call from the thread that owns the widgets)."""
        with self._lock:
            parts, self._dirty = self._dirty, set()
            self._last = time.monotonic()
        if parts:
            self.redraws += 1
            self._redraw(parts)
