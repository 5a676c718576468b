"""What a panel reads and drives: the small *source* protocol, and adapters for it.

A panel works on any object with these members (a live :class:`nbdebug.Debugger` has all of them; an
offline session loaded from a dump has the first group)::

    # every source
    session       # .framework .framework_version .device .pid .live .step_index .steps
    graph         # nbdebug.session.graph.Graph
    watchpoints   # WatchManager: .watchpoints {id: Watchpoint}, .selected_nodes(wp), .watch/.update/.delete/.clear
    hits          # list of HitRecord, in execution order
    recheck()     # re-evaluate the watchpoints on the current step
    stats(node, slot, step="current") -> mapping;  tensor(node, slot, step="current") -> np.ndarray
    watch(cond, nodes=None, **params); update_watch(wp, **changes); unwatch(wp=None)
    recommend(); watch_recommended()

    # live sources (``session.live`` is True) add training control and events
    state; current_node; pause_reason; error
    cont(steps=None); pause(); terminate(); run_to(node); next_node()
    on(event, callback) -> unsubscribe      # events: state, step, hit, node, error

:class:`~nbdebug.watch.reader.Reader` gives these members to :class:`nbdebug.Debugger`,
:class:`nbdebug.offline.OfflineSession` and :class:`SessionSource` (which makes a bare
:class:`~nbdebug.session.session.Session`, e.g. one built by an offline loader, a source);
:class:`SourceView` turns any source into the one interface the views use.

>>> from nbdebug.session.session import Session
>>> s = Session(framework="pytorch", framework_version="2", live=False)
>>> view = SourceView(s)          # a bare Session is wrapped in a SessionSource
>>> view.live, view.state, view.hits
(False, 'offline', [])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..session.handle import Handle
from ..session.steps import current_step
from ..watch.reader import Reader, SortedHits
from ..watch.watchpoints import HitRecord, WatchManager, Watchpoint

#: Events a live source emits (``source.on(event, callback)``).
EVENTS = ("state", "step", "hit", "node", "error")


@runtime_checkable
class Source(Protocol):
    """The members every panel source has (the module docstring lists them all; live sources add control)."""

    session: Any
    graph: Any
    watchpoints: WatchManager

    @property
    def hits(self) -> list[HitRecord]: ...

    def recheck(self) -> list[HitRecord]: ...

    def stats(self, node: str, slot: str, step: int | str = "current") -> Mapping[str, Any]: ...

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray: ...


def last_step(session: Any) -> int:
    """The step whose statistics are "current" (:func:`nbdebug.session.steps.current_step`): the step chosen
    with ``goto``, else the step in progress if it captured anything, else the last finished one (-1 when
    there is none)."""
    return current_step(session)


class SessionSource(Reader):
    """A source over a bare session (offline): its own WatchManager, no training control; the reading and
    watchpoint methods are :class:`~nbdebug.watch.reader.Reader`'s.

    >>> from nbdebug.session.session import Session
    >>> src = SessionSource(Session(framework="mindspore", live=False))
    >>> src.watch("TO").condition
    'TO'
    """

    def __init__(self, session: Any, watchpoints: WatchManager | None = None) -> None:
        self.session = session
        self.watchpoints = watchpoints if watchpoints is not None else WatchManager(session)

    @property
    def graph(self) -> Any:
        return self.session.graph

    @property
    def step_index(self) -> int:
        """An offline source has no step in progress: ``AttributeError`` naming :attr:`current_step`."""
        raise AttributeError("an offline source has no step in progress (step_index); the step 'current' "
                             "means is current_step")

    def goto(self, step: int) -> None:
        """Make ``step`` the "current" one."""
        self.session.goto(int(step))


#: what a source has: :class:`~nbdebug.watch.reader.Reader`'s surface, plus ``graph``
SOURCE_MEMBERS = ("session", "graph", "watchpoints", "hits", "recheck", "stats", "tensor", "watch", "update_watch",
                  "unwatch", "recommend", "watch_recommended")


def as_source(obj: Any) -> Any:
    """``obj`` if it is a source; a :class:`SessionSource` if it is a bare session; else ``TypeError``."""
    if all(hasattr(obj, a) for a in SOURCE_MEMBERS):
        return obj
    if hasattr(obj, "graph") and hasattr(obj, "steps") and hasattr(obj, "stats"):
        return SessionSource(obj)
    raise TypeError(
        f"a panel needs a Debugger, an offline session (with .session, .graph, .watchpoints, .hits, .recheck(), "
        f".stats(), .tensor()) or a Session; got {type(obj).__name__}")


class SourceView:
    """One interface over a live debugger or an offline session, as the views use it."""

    def __init__(self, obj: Any) -> None:
        self.obj = as_source(obj)
        self._hits_by_order = SortedHits()

    # -- what it is -------------------------------------------------------------------------------
    @property
    def session(self) -> Any:
        return self.obj.session

    @property
    def graph(self) -> Any:
        return self.obj.graph

    @property
    def live(self) -> bool:
        """True for a live debugger (training control shown); False for offline sessions."""
        return bool(getattr(self.obj.session, "live", False)) and hasattr(self.obj, "cont")

    @property
    def state(self) -> str:
        """The training state as a string (``"offline"`` for an offline session)."""
        if not self.live:
            return "offline"
        if getattr(self.obj, "closed", False):
            return "closed"
        return str(getattr(self.obj, "state", "idle"))

    @property
    def current_node(self) -> str | None:
        return getattr(self.obj, "current_node", None) if self.live else None

    @property
    def pause_reason(self) -> str:
        return str(getattr(self.obj, "pause_reason", "") or "") if self.live else ""

    @property
    def error(self) -> str | None:
        """The traceback that ended training: the worker's (or ``block=True``'s), else a foreground one
        (:meth:`foreground_failed`) while the session has not moved on since."""
        if not self.live:
            return None
        err = getattr(self.obj, "error", None)
        if err is None and self._foreground is not None:
            text, sig = self._foreground
            if sig == self._progress():
                return text
            self._foreground = None
        return err

    _foreground: tuple[str, tuple[int, int]] | None = None

    def _progress(self) -> tuple[int, int]:
        s = self.obj.session
        return int(s.step_index), len(getattr(s, "recorder", ()))

    def foreground_failed(self, traceback_text: str) -> bool:
        """A cell that trained in the foreground (a plain loop, not ``dbg.run``) raised: remember it when
        training was inside a step (its statistics are open) and no worker runs; True when taken."""
        if not self.live or self.state not in ("idle", "finished", "terminated", "failed"):
            return False
        if getattr(self.obj, "error", None) is not None or not len(getattr(self.obj.session, "recorder", ())):
            return False
        self._foreground = (traceback_text, self._progress())
        return True

    def foreground_settled(self) -> None:
        """The step the failed cell left open was closed (``end_abandoned_step``): the failure stays shown
        until the session moves on from here."""
        if self._foreground is not None:
            self._foreground = (self._foreground[0], self._progress())

    @property
    def step(self) -> int:
        """The step whose data is shown (the header's "Step", the hits' and pause reasons' step): live, the
        step in progress once it recorded something, else the last finished one (-1 before any);
        offline, the chosen step (:meth:`goto`) or the last one."""
        cur = current_step(self.obj.session)
        return cur if self.live else max(cur, 0)

    @property
    def running_step(self) -> int:
        """The step training runs (or, paused at a step boundary, runs next); offline: :attr:`step`."""
        return int(self.obj.session.step_index) if self.live else self.step

    @property
    def steps(self) -> list[int]:
        """The steps with statistics, ascending."""
        return sorted(getattr(self.obj.session, "steps", {}) or {})

    def goto(self, step: int) -> None:
        """Offline: make ``step`` the one every view shows (the source's ``goto``)."""
        if self.live:
            raise RuntimeError("a live panel shows the step training is at")
        self.obj.goto(step)

    @property
    def failed_node(self) -> str | None:
        """The node that ran last before the training function raised (None when unknown or not failed)."""
        where = self._failure_point()
        return where[1] if where else None

    @property
    def failed_step(self) -> int | None:
        where = self._failure_point()
        return where[0] if where else None

    def _failure_point(self) -> tuple[int, str | None] | None:
        if self.error is None:
            return None
        s = self.obj.session
        keys = getattr(getattr(s, "recorder", None), "keys", None)
        if keys:  # the failing step is still open
            return int(s.step_index), self._last_executed(keys)
        step = last_step(s)  # the step was closed when the training thread ended
        try:
            table_keys = s.table(step).keys if step >= 0 else []
        except KeyError:
            table_keys = []
        return step, self._last_executed(table_keys)

    def _last_executed(self, keys: Any) -> str | None:
        """The last op or module call recorded: the inputs, parameters and constants a failing op was given
        are recorded just before it, and are not what failed."""
        nodes = self.graph.nodes
        for name, _slot in reversed(list(keys)):
            node = nodes.get(name)
            if node is None or node.kind in ("op", "module"):
                return name
        return keys[-1][0] if len(keys) else None

    # -- reading ----------------------------------------------------------------------------------
    @property
    def hits(self) -> list[HitRecord]:
        """Hits in execution order: by step, then order within the step."""
        return self._hits_by_order(self.obj.hits)

    @property
    def watchpoints(self) -> WatchManager:
        return self.obj.watchpoints

    def stats(self, node: str, slot: str, step: int | str = "current") -> Mapping[str, Any]:
        return self.obj.stats(node, slot, step)

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        return self.obj.tensor(node, slot, step)

    def keep(self, node: str) -> frozenset[str]:
        """Keep ``node``'s values from its next execution on (live sources)."""
        return self.obj.keep(node)

    def kept(self, node: str) -> bool:
        return node in getattr(self.obj.session, "kept", ())

    # -- watchpoints (every source is a Reader: watch, update_watch, unwatch, recheck, recommend...) --
    def watch(self, condition: str, nodes: Any = None, **params: Any) -> Watchpoint:
        return self.obj.watch(condition, nodes, **params)

    def update_watch(self, wp: int | Watchpoint, **changes: Any) -> Watchpoint:
        return self.obj.update_watch(wp, **changes)

    def unwatch(self, wp: int | Watchpoint | None = None) -> None:
        self.obj.unwatch(wp)

    def recheck(self) -> list[HitRecord]:
        return self.obj.recheck()

    def recommend(self) -> list[tuple[str, dict[str, Any], Any]]:
        return self.obj.recommend()

    def watch_recommended(self) -> list[Watchpoint]:
        return self.obj.watch_recommended()

    # -- control (live only) ----------------------------------------------------------------------
    def command(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Call a control command (``cont``, ``pause``, ``terminate``, ``run_to``, ``next_node``)."""
        if not self.live:
            raise RuntimeError(f"{name}: an offline session has no training to control")
        getattr(self.obj, name)(*args, **kwargs)

    def on(self, event: str, callback: Callable[[Any], Any]) -> Handle:
        """Subscribe to the source's events (an offline session may emit ``hit`` and ``step`` too); its
        :class:`~nbdebug.session.handle.Handle`, an empty one for sources without events or without this one."""
        fn = getattr(self.obj, "on", None)
        if fn is None:
            return Handle()
        try:
            got = fn(event, callback)
        except ValueError:  # an event this source does not know
            return Handle()
        return got if isinstance(got, Handle) else Handle(got)
