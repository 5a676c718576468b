"""Group commands and the processes of a job that are not there when one is given (:class:`AbsentProcesses`, a
part of :class:`~nbdebug.remote.hub.Listener`).

A process is *connecting* from its hello until its state arrives on that connection (its ``sync`` comes first,
at once), *away* when it said nothing for ``LOST_AFTER`` seconds (it reconnects when it can), or has *never
connected* (a rank below the world size another rank announced). A group command (``pause_all``,
``cont_all``, ``terminate_all``) waits up to :data:`CONNECTING_WAIT_S` for the connecting ones and the ranks
not connected yet, reaches the live ones at once, and is kept for the others: a process connecting or away
gets the latest group command when its state arrives (within :data:`OWED_S`); ranks that never connected do
not, and the listener says so (``notice`` and a warning). Requests a process will not answer (it reconnected,
went silent, ended) fail at once with the reason, instead of at the request's time-out.

>>> name_keys([0, 1]), name_keys([1]), name_keys([2, 3], "rank")
('processes 0, 1', 'process 1', 'ranks 2, 3')
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .source import RemoteSource

#: seconds a group command waits for processes whose hello came and whose state has not yet (it follows their
#: sync at once: milliseconds), so that it reaches them directly
CONNECTING_WAIT_S = 2.0
#: seconds a group command given while a process was still connecting or away is kept for it: it gets the
#: command when its state arrives on its (re)connection within that time (:meth:`AbsentProcesses._deliver_owed`)
OWED_S = 60.0
ENDED = ("finished", "terminated", "failed")


class AbsentProcesses:
    """The listener's handling of processes that are not there for a group command (see the module docstring).
    Uses the listener's ``sources``, ``live()``, ``request``, ``_pending``, ``_lock``, ``_pausing``,
    ``_pause_live``, ``pump``, ``notice`` and ``_job``."""

    _intent: tuple[int, str, Any] | None = None
    _generation = 0

    def _settle(self) -> None:
        """Wait (at most :data:`CONNECTING_WAIT_S`) for the processes whose hello came and whose state has not,
        and for ranks of the job not connected yet (after a kernel restart the ranks come back within about a
        second of each other): a group command then reaches them directly. Not on the listener's thread (their
        messages arrive there)."""
        if threading.current_thread() is self.pump.thread:
            return
        end = time.monotonic() + CONNECTING_WAIT_S
        while (any(s.connected and not s.synced and str(s.state) not in ENDED for s in list(self.sources.values()))
               or self._missing_ranks()):
            if time.monotonic() >= end or self.closed:
                return
            time.sleep(0.01)

    def _intend(self, op: str, arg: Any) -> list[RemoteSource]:
        """Record the group command ``op`` and return the processes it reaches now (:meth:`live`); every
        other process of the job that has not ended (still connecting, or away) owes it until its state
        arrives (:meth:`_deliver_owed`, within :data:`OWED_S`). Said (``notice``, a warning): those processes,
        and ranks of the job that never connected here (the world size a rank announced), which do not get it."""
        with self._lock:  # against a state arriving meanwhile (_on_message reads ``owed`` under this lock)
            self._generation += 1
            self._intent = (self._generation, op, arg)
            until = time.monotonic() + OWED_S
            live, away = self.live(), []
            for src in list(self.sources.values()):
                if src in live:
                    src.owed = None
                elif str(src.state) not in ENDED:
                    away.append(src)
                    src.owed = (self._generation, until)
        missing = self._missing_ranks()
        said = []
        if away:
            said.append(f"{name_keys(away)} {'is' if len(away) == 1 else 'are'} connecting or away: "
                        f"{'it gets' if len(away) == 1 else 'they get'} it when back (within {OWED_S:g} s)")
        if missing:
            said.append(f"{name_keys(missing, 'rank')} of the job never connected here: not sent")
        if said:
            self.notice = f"{op}: " + "; ".join(said)
            warnings.warn(f"nbdebug: {self.notice}", RuntimeWarning, stacklevel=3)
            if self._job is not None:
                self._job.hub.emit("state", "notice")
        return live

    def _intent_owed(self) -> bool:
        intent = self._intent
        return intent is not None and any(s.owed is not None and s.owed[0] == intent[0]
                                          for s in list(self.sources.values()))

    def _missing_ranks(self) -> list[int]:
        """Ranks ``0..world_size-1`` (the largest world size a process announced) with no process here."""
        sizes = [w for s in list(self.sources.values()) if isinstance(w := s.info.get("world_size"), int)]
        return [r for r in range(max(sizes, default=0)) if r not in self.sources]

    def _deliver_owed(self, src: RemoteSource) -> None:
        """``src``'s state arrived on its connection: give it the latest group command, if it was connecting or
        away when that was given (on a thread of its own: the replies arrive on this listener's thread)."""
        with self._lock:
            owed, src.owed = src.owed, None
            intent = self._intent
        if owed is None or intent is None or owed[0] != intent[0] or time.monotonic() > owed[1]:
            return
        _gen, op, arg = intent

        def run() -> None:
            try:
                if op == "terminate":
                    self.request(src, "terminate", {})
                elif op == "pause":
                    with self._pausing:
                        live = self.live()
                        if self._intent is intent and live:  # no later group command meanwhile
                            self._pause_live(live)
                else:  # cont: the boundary left from a line-up is forgotten; resumed when paused
                    self.request(src, "pause_at_step", {"step": None})
                    if str(src.state) == "paused":
                        self.request(src, "cont", {"steps": arg})
            except Exception as e:  # noqa: BLE001 - a process that went away again meanwhile
                self.notice = f"{op}: could not be given to {src.key} when it was back: {e}"
                warnings.warn(f"nbdebug: {self.notice}", RuntimeWarning, stacklevel=1)
                if self._job is not None:
                    self._job.hub.emit("state", "notice")

        threading.Thread(target=run, name="nbdebug-owed", daemon=True).start()

    def _fail_pending(self, src: RemoteSource, why: str) -> None:
        """The requests ``src`` has not answered will not be answered (it reconnected, went silent or ended):
        their callers get a clear error now, not a time-out."""
        with self._lock:
            slots = [slot for slot in self._pending.values() if slot[4] is src and not slot[0].is_set()]
        for slot in slots:
            slot[1] = {"ok": False, "error": {"type": "RuntimeError", "message": (
                f"{slot[5]}: process {src.key} {why} before answering; the request may not have been carried out")}}
            slot[0].set()


def name_keys(sources: list[Any], word: str = "process") -> str:
    """``process 1`` / ``processes 0, 1`` (``rank`` / ``ranks`` for ``word="rank"``) of sources or keys."""
    keys = [str(getattr(s, "key", s)) for s in sources]
    many = len(keys) > 1
    return f"{word}{('es' if word == 'process' else 's') if many else ''} {', '.join(keys)}"
