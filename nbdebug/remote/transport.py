"""One ZeroMQ socket owned by one I/O thread: other threads queue messages, the thread sends them and hands
received ones to a callback; a periodic tick drives timers (pings, reconnects, timeouts).

ZeroMQ sockets are not thread-safe, so only the pump thread touches its socket; :meth:`Pump.send` only
appends to a bounded queue and wakes the thread through a pipe (polled beside the socket). A queue
that is full, or a socket that would block, never blocks the caller: the message is dropped and
``on_overflow`` says so (the agent then re-synchronizes the notebook).

>>> import zmq
>>> ctx = zmq.Context()
>>> a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
>>> _ = a.bind("inproc://pump-doc"), b.connect("inproc://pump-doc")
>>> got = []
>>> pump = Pump(a, lambda parts: got.append(parts), name="doc")
>>> pump.send([b"hi"])
True
>>> b.recv()
b'hi'
>>> pump.close(); b.close(); ctx.term()
"""

from __future__ import annotations

import collections
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import zmq

TICK_S = 0.1


class Pump:
    """The I/O thread of one socket."""

    def __init__(self, sock: Any, on_message: Callable[[list[Any]], Any], *,
                 on_tick: Callable[[], Any] = lambda: None, on_overflow: Callable[[], Any] = lambda: None,
                 max_queue: int = 512, name: str = "nbdebug-remote") -> None:
        self.sock = sock
        self._on_message = on_message
        self._on_tick = on_tick
        self._on_overflow = on_overflow
        self._max = max_queue
        self._queue: collections.deque[list[Any]] = collections.deque()
        self._lock = threading.Lock()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._stop = False
        self._poller: Any = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    # -- any thread -------------------------------------------------------------------------------
    def send(self, parts: list[Any]) -> bool:
        """Queue a multipart message; False (and ``on_overflow``) when the queue is full."""
        with self._lock:
            if len(self._queue) >= self._max:
                overflow = True
            else:
                self._queue.append(parts)
                overflow = False
        if overflow:
            self._on_overflow()
            return False
        self.wake()
        return True

    def wake(self) -> None:
        try:
            os.write(self._w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (the thread will wake anyway) or closed

    def pending(self) -> int:
        return len(self._queue)

    def drain(self, timeout: float) -> bool:
        """Wait until the queue is sent (or ``timeout`` seconds); True when empty."""
        end = time.monotonic() + timeout
        while self._queue and time.monotonic() < end and self.thread.is_alive():
            time.sleep(0.01)
        return not self._queue

    def close(self, timeout: float = 2.0) -> None:
        self._stop = True
        self.wake()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout)
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass

    # -- the pump thread --------------------------------------------------------------------------
    def replace(self, sock: Any) -> None:
        """Swap the socket (pump thread only: from ``on_tick`` or ``on_message``); the old one is closed."""
        old, self.sock = self.sock, sock
        if self._poller is not None:
            if old is not None:
                self._poller.unregister(old)
            if sock is not None:
                self._poller.register(sock, zmq.POLLIN)
        if old is not None:
            old.close(linger=0)
        with self._lock:
            self._queue.clear()

    def send_now(self, parts: list[Any]) -> bool:
        """Send at once without queueing (pump thread only); False when the socket would block."""
        if self.sock is None:
            return False
        try:
            self.sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
            return True
        except zmq.Again:
            return False

    def _run(self) -> None:
        self._poller = poller = zmq.Poller()
        if self.sock is not None:
            poller.register(self.sock, zmq.POLLIN)
        poller.register(self._r, zmq.POLLIN)
        next_tick = 0.0
        while not self._stop:
            try:
                events = dict(poller.poll(TICK_S * 1000))
                if self._r in events:
                    try:
                        while os.read(self._r, 4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                if self.sock is not None and self.sock in events:
                    self._receive()
                self._flush()
                now = time.monotonic()
                if now >= next_tick:
                    next_tick = now + TICK_S
                    self._on_tick()
            except zmq.ContextTerminated:
                return
            except Exception:  # noqa: BLE001 - the I/O thread must outlive any one bad message
                traceback.print_exc()
        if self.sock is not None:
            try:
                self._flush()
            finally:
                self.sock.close(linger=0)

    def _receive(self) -> None:
        for _ in range(1000):  # then let the queue and the tick have a turn
            try:
                parts = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                self._on_message([p.buffer for p in parts])
            except Exception:  # noqa: BLE001
                traceback.print_exc()
            if self.sock is None:
                return

    def _flush(self) -> None:
        while self._queue and self.sock is not None:
            with self._lock:
                if not self._queue:
                    return
                parts = self._queue[0]
            try:
                self.sock.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                with self._lock:
                    self._queue.clear()
                self._on_overflow()
                return
            with self._lock:
                if self._queue and self._queue[0] is parts:
                    self._queue.popleft()
