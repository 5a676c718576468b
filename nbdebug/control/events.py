"""Thread-safe event subscription for views.

Callbacks registered with :meth:`EventHub.on` are called with the event's payload. Outside a Jupyter
kernel they run synchronously in the emitting thread. Inside a kernel (an asyncio loop was running
when the callback was registered) they are delivered on that loop, and bursts are coalesced: each
callback receives the latest payload at most ``rate`` times per second.

>>> hub = EventHub()
>>> got = []
>>> off = hub.on("state", got.append)
>>> hub.emit("state", "paused")
>>> got
['paused']
>>> off()
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from ..session.handle import Handle

EVENTS = ("state", "step", "hit", "node", "error")


class _Subscription:
    __slots__ = ("event", "fn", "loop", "pending", "scheduled", "last", "min_interval")

    def __init__(self, event: str, fn: Callable[[Any], Any], loop: asyncio.AbstractEventLoop | None,
                 rate: float) -> None:
        self.event, self.fn, self.loop = event, fn, loop
        self.pending: Any = None
        self.scheduled = False
        self.last = 0.0
        self.min_interval = 1.0 / rate if rate > 0 else 0.0


class EventHub:
    """Events from the training thread to any number of observers."""

    def __init__(self, rate: float = 10.0) -> None:
        self.rate = rate
        self._subs: dict[str, list[_Subscription]] = {}
        self._lock = threading.Lock()

    def on(self, event: str, fn: Callable[[Any], Any]) -> Handle:
        """Subscribe ``fn`` to ``event`` (one of :data:`EVENTS`); returns its
        :class:`~nbdebug.session.handle.Handle` (``.remove()``, ``with``, or called to unsubscribe)."""
        if event not in EVENTS:
            raise ValueError(f"unknown event {event!r}; events are {', '.join(EVENTS)}")
        loop: asyncio.AbstractEventLoop | None = None
        try:
            running = asyncio.get_running_loop()
            # only a loop that is executing us (a coroutine, as a kernel's cell is) will deliver later;
            # a loop merely parked in this thread (e.g. by a sync library built on greenlets) would not
            if asyncio.current_task(running) is not None:
                loop = running
        except RuntimeError:
            pass
        if loop is None:
            loop = _kernel_loop()
        sub = _Subscription(event, fn, loop, self.rate)
        with self._lock:
            self._subs.setdefault(event, []).append(sub)

        def off() -> None:
            with self._lock:
                subs = self._subs.get(event, [])
                if sub in subs:
                    subs.remove(sub)

        return Handle(off)

    def wanted(self, event: str) -> bool:
        return bool(self._subs.get(event))

    def emit(self, event: str, payload: Any = None) -> None:
        for sub in list(self._subs.get(event, ())):
            if sub.loop is None or sub.loop.is_closed():
                _call(sub.fn, payload)
                continue
            with self._lock:
                sub.pending = payload
                if sub.scheduled:
                    continue  # coalesced: the scheduled delivery will carry the latest payload
                sub.scheduled = True
                delay = max(0.0, sub.last + sub.min_interval - time.monotonic())
            try:
                sub.loop.call_soon_threadsafe(_deliver_later, sub, delay, self._lock)
            except RuntimeError:  # loop closed meanwhile
                with self._lock:
                    sub.scheduled = False
                _call(sub.fn, payload)


def _deliver_later(sub: _Subscription, delay: float, lock: threading.Lock) -> None:
    if delay > 0:
        assert sub.loop is not None
        sub.loop.call_later(delay, _deliver, sub, lock)
    else:
        _deliver(sub, lock)


def _deliver(sub: _Subscription, lock: threading.Lock) -> None:
    # Taking the payload and clearing ``scheduled`` is one step under the emitter's lock: an event emitted
    # in between would otherwise see ``scheduled`` still set, count on this delivery, and be lost (the
    # last hits of a step, or ``paused``, never reached the panels).
    with lock:
        payload = sub.pending
        sub.scheduled = False
        sub.last = time.monotonic()
    _call(sub.fn, payload)


def _call(fn: Callable[[Any], Any], payload: Any) -> None:
    try:
        fn(payload)
    except Exception:  # an observer's bug must never stop training
        import traceback

        traceback.print_exc()


def _kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The IPython kernel's asyncio loop, when called from the kernel's main thread."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return None
    ip = get_ipython()
    kernel = getattr(ip, "kernel", None)
    if kernel is None or threading.current_thread() is not threading.main_thread():
        return None
    io_loop = getattr(kernel, "io_loop", None)
    loop = getattr(io_loop, "asyncio_loop", None)
    if loop is not None:
        return loop
    try:
        return asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return None
