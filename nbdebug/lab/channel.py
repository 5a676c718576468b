"""The comm that carries the active debugger's status to the JupyterLab extension.

When a :class:`~nbdebug.Debugger` is created in an IPython kernel (or ``%load_ext nbdebug`` finds
one), :func:`announce` opens one comm per kernel with target ``nbdebug.status``. Its open message
and every later message carry ``{"status": {state, step, hits, current_node, reason, framework}}``
(see :func:`nbdebug.lab.commands.status`).

A small sender thread sends the status whenever it changes: the debugger's ``state``, ``step`` and
``hit`` events wake it at once (EventHub already coalesces them to ~10/s on the kernel loop), and it
also looks every :data:`POLL` seconds, so the status stays live while the kernel's main thread is
busy (``dbg.run(..., block=True)``, a long cell) and when a debugger is closed. Messages are sent at
most every :data:`MIN_INTERVAL` seconds and only when something changed. A frontend that attaches
later (page reload) finds the comm with a ``comm_info_request`` and sends ``{"request": "status"}``.

Outside a kernel :func:`announce` does nothing.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import Any

from .commands import active_debugger, remember, status

TARGET = "nbdebug.status"
PROTOCOL = 1
POLL = 0.5
MIN_INTERVAL = 0.1


def in_kernel() -> bool:
    """True inside an IPython kernel (where comms reach a frontend)."""
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


class StatusChannel:
    """One per process: the ``nbdebug.status`` comm and the thread that feeds it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._comm: Any = None
        self._thread: threading.Thread | None = None
        self._last: dict[str, Any] | None = None
        self._force = False
        self._announced: weakref.WeakSet[Any] = weakref.WeakSet()
        self.sent = 0  # messages sent (for tests and diagnostics)

    @property
    def open(self) -> bool:
        return self._comm is not None

    def announce(self, dbg: Any) -> None:
        """Make ``dbg``'s status reach the frontend (no-op outside a kernel; idempotent)."""
        remember(dbg)
        if not in_kernel():
            return
        if dbg not in self._announced:
            self._announced.add(dbg)
            for event in ("state", "step", "hit"):
                dbg.on(event, self._on_event)
        self._ensure_open()
        self.wake()

    def wake(self) -> None:
        """Send the status now if it changed."""
        self._wake.set()

    def close(self) -> None:
        """Close the comm (the frontend hides the status item); the next announce reopens it."""
        with self._lock:
            comm, self._comm = self._comm, None
        if comm is not None:
            comm.close()

    # -- internals --------------------------------------------------------------------------------
    def _on_event(self, _payload: Any) -> None:
        self._wake.set()

    def _ensure_open(self) -> None:
        with self._lock:
            if self._comm is None:
                from comm import create_comm

                snapshot = status()
                comm = create_comm(target_name=TARGET, data={"protocol": PROTOCOL, "status": snapshot})
                comm.on_msg(self._on_msg)
                comm.on_close(self._on_close)
                self._comm, self._last = comm, snapshot
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="nbdebug-lab-status", daemon=True)
                self._thread.start()

    def _on_msg(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data", {}) or {}
        if data.get("request") == "status":
            self._force = True
            self._wake.set()

    def _on_close(self, _msg: dict[str, Any]) -> None:
        # The frontend closed it (no extension there, or the kernel connection went away).
        with self._lock:
            self._comm = None

    def _loop(self) -> None:
        while True:
            self._wake.wait(POLL if self._comm is not None else None)
            self._wake.clear()
            comm = self._comm
            if comm is None:
                continue
            try:
                snapshot = status()
            except Exception:  # a debugger being torn down mid-read: look again next time
                continue
            if snapshot == self._last and not self._force:
                continue
            self._force = False
            self._last = snapshot
            try:
                comm.send({"status": snapshot})
                self.sent += 1
            except Exception:  # kernel shutting down
                return
            time.sleep(MIN_INTERVAL)


CHANNEL = StatusChannel()


def announce(dbg: Any) -> None:
    """Show ``dbg`` in JupyterLab's status bar and let the extension's commands control it.

    Called when a Debugger is created; cheap and silent outside an IPython kernel.
    """
    CHANNEL.announce(dbg)


def _post_execute() -> None:
    dbg = active_debugger()
    if dbg is not None:
        CHANNEL.announce(dbg)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbdebug.lab``: announce the active debugger now and after every cell."""
    if _post_execute not in ipython.events.callbacks["post_execute"]:
        ipython.events.register("post_execute", _post_execute)
    _post_execute()


def unload_ipython_extension(ipython: Any) -> None:
    if _post_execute in ipython.events.callbacks["post_execute"]:
        ipython.events.unregister("post_execute", _post_execute)
