"""``RemoteSource``: one connected training process, as a panel source (see :mod:`nbdebug.ui.source`).

It holds a mirror of the process's session (graph, the statistics window, the partial step when paused
inside one, hits, watchpoints) fed by the agent's messages, so the panel reads statistics, hits and the
graph locally; tensor values, watchpoint edits and control commands go to the process and wait for its
answer. Events (``state``, ``step``, ``hit``, ``error``) are re-emitted on an
:class:`~nbdebug.control.events.EventHub`, so a panel's callbacks arrive on the kernel loop as with a
local Debugger.

Group rule: while several processes are connected to the same listener (ranks of one job), ``pause``,
``cont`` and ``terminate`` act on all of them together at a step boundary (one rank paused alone would
block the others in their next collective); ``run_to`` and ``next_node`` need exactly one process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..control import EventHub, State
from ..job.summary import StepSummary
from ..session.graph import Graph
from ..session.monitor import Monitor
from ..watch.reader import Reader
from ..watch.watchpoints import HitRecord, WatchManager, Watchpoint
from . import protocol as P
from .mirror import MirrorSession
from .monitor_wire import MonitorReceiver

#: seconds a request waits for the process to answer
REQUEST_TIMEOUT = 30.0
#: summary mode: the latest steps whose summaries a rank keeps here; older ones stay only when notable (a
#: non-finite origin or hits), up to :data:`NOTABLE_KEPT` (the monitor series keep the whole run)
SUMMARIES_KEPT = 128
NOTABLE_KEPT = 1024
#: summary mode: full-resolution steps of each rank's monitor series kept here (min/max blocks before them;
#: :class:`~nbdebug.session.monitor.Monitor`): 1,000 ranks x 200 series take ~256 MB, not the 12.8 GB of the
#: default 10,000-step horizon (the rank's own Debugger keeps its whole horizon)
SUMMARY_HORIZON = 256


class RemoteSource(Reader):
    """The notebook's handle on one attached process (created by the listener on its hello)."""

    def __init__(self, listener: Any, ident: bytes, hello: Mapping[str, Any]) -> None:
        self._listener = listener
        self.ident = ident
        self.info = {k: hello.get(k) for k in ("host", "pid", "rank", "world_size", "local_rank", "argv",
                                                 "level", "check", "framework", "framework_version", "device")}
        window = hello.get("stats_window")
        self.session = MirrorSession(framework=str(hello.get("framework", "?")),
                                     framework_version=str(hello.get("framework_version", "")),
                                     device=str(hello.get("device", "?")), live=True,
                                     stats_window=int(window) if isinstance(window, int) else 8)
        self.session.pid = hello.get("pid")
        self.watchpoints = WatchManager(self.session)
        self.hub = EventHub()
        self.level = hello.get("level")
        self.check = hello.get("check")
        self.closed = False  # a remote process is never "closed" from here; it ends or disconnects
        self.connected = True
        #: False from a hello until the process's first ``state`` message on that connection (its ``sync``
        #: comes first): meanwhile :attr:`state` says ``connecting``, not a state it may not be in, and the
        #: listener does not count the process as live (group commands wait for it: ``Listener.live``)
        self.synced = False
        #: the listener's group command (its generation) this process still has to get when its state arrives
        #: (it was connecting or away when the command was given), and until when (``Listener._owe``)
        self.owed: tuple[int, float] | None = None
        self.connects = 1
        self.last_heard = time.monotonic()
        self._state = "idle"
        self._ended: str | None = None
        self.current_node: str | None = None
        self.pause_reason = ""
        self.error: str | None = None
        self._names: dict[int, tuple[str, str, str, Any]] = {}
        self._monitor = MonitorReceiver()  # the monitor series' names by id on this connection
        #: ``"summary"`` when the listener asked this process for step summaries instead of full tables (a job
        #: of many ranks; :meth:`full_tables` asks for the tables), else ``"full"``
        self.detail = "full"
        #: summary mode: whether full tables were asked for (:meth:`full_tables`)
        self.full = False
        self._summaries: dict[int, StepSummary] = {}
        self._notable: dict[int, StepSummary] = {}
        self._lock = threading.RLock()

    # -- identity -----------------------------------------------------------------------------------
    @property
    def key(self) -> int | str:
        """How the listener's ``sources`` names this process: its rank, else ``host:pid``."""
        rank = self.info.get("rank")
        return int(rank) if isinstance(rank, int) else f"{self.info.get('host')}:{self.info.get('pid')}"

    @property
    def remote_info(self) -> dict[str, Any]:
        """What the panel header shows about the process: host, pid, rank/world size, device, step,
        connection."""
        return {"host": self.info.get("host"), "pid": self.info.get("pid"), "rank": self.info.get("rank"),
                "world_size": self.info.get("world_size"), "device": self.session.device,
                "step": self.session.step_index, "connected": self.connected}

    @property
    def peers(self) -> list[RemoteSource]:
        """The processes connected to the same listener, this one included (the ranks of its job)."""
        return list(self._listener.live())

    # -- the source protocol --------------------------------------------------------------------------
    @property
    def graph(self) -> Graph:
        return self.session.graph

    @property
    def step_index(self) -> int:
        return self.session.step_index

    @property
    def state(self) -> State | str:
        """The process's training state; ``disconnected`` while it is away (it may come back), ``connecting``
        from its hello until its state arrives (what the notebook held before is not shown as true)."""
        if self._ended is not None:
            return State(self._ended) if self._ended in State._value2member_map_ else self._ended
        if not self.connected:
            return "disconnected"
        if not self.synced:
            return "connecting"
        return State(self._state) if self._state in State._value2member_map_ else self._state

    @property
    def hits(self) -> list[HitRecord]:
        return sorted(self.watchpoints.hits, key=lambda h: (h.step, h.order, h.node, h.slot, h.watchpoint))

    def stats(self, node: str, slot: str, step: int | str = "current", fields: Any = None) -> Mapping[str, Any]:
        return self.session.stats(node, slot, step, fields)

    def timeline(self, node: str, slot: str, field: str = "norm") -> tuple[list[int], list[float]]:
        return self.session.timeline(node, slot, field)

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        """The value the process used, fetched from it (``NotRetainedError`` says why when it cannot)."""
        meta, frames = self._request("tensor", node=node, slot=slot, step=step,
                                     max_bytes=self._listener.tensor_budget)
        if not frames:
            raise P.ProtocolError("a tensor reply without its data frame")
        return P.frame_array(meta, frames[0])

    # -- summary mode ---------------------------------------------------------------------------------
    def step_summary(self, step: int) -> StepSummary | None:
        """The :class:`~nbdebug.job.summary.StepSummary` the process sent for ``step`` (summary mode), or None
        (a full-mode process sends none: the job summarises its tables)."""
        return self._summaries.get(step) or self._notable.get(step)

    def summary_steps(self) -> list[int]:
        """The steps with a summary kept here (the latest :data:`SUMMARIES_KEPT`, and notable older ones)."""
        return sorted({*self._notable, *self._summaries})

    def set_detail(self, detail: str) -> None:
        """What the listener asked the process to send: ``"summary"`` or ``"full"``; a rank in summary mode
        keeps :data:`SUMMARY_HORIZON` full-resolution monitor steps (set before its first row arrives)."""
        self.detail = detail
        mon = self.session.monitor
        if detail == "summary" and mon.last_step is None and mon.horizon > SUMMARY_HORIZON:
            self.session.monitor = Monitor(horizon=SUMMARY_HORIZON)

    def full_tables(self, on: bool = True) -> list[int]:
        """Summary mode: have the process send its full statistics tables — the window it holds now (they are
        here when this returns) and every step's from then on (``on=False``: summaries alone again; the
        tables received stay). Returns the steps of the window sent. A no-op in full mode."""
        if self.detail != "summary" or (self.full and on):
            return sorted(self.session.steps)
        result, _ = self._request("tables", on=bool(on))
        self.full = bool(result.get("full"))
        return [int(s) for s in result.get("steps", ())]

    def _put_summary(self, rec: Any, step: int) -> None:
        summary = StepSummary.from_dict(rec)
        if summary.step != step:
            raise P.ProtocolError(f"the summary of step {summary.step} in step {step}'s message")
        self._summaries[step] = summary
        while len(self._summaries) > SUMMARIES_KEPT:
            old = next(iter(self._summaries))  # the earliest received
            gone = self._summaries[old]
            if gone.origin is not None or gone.hits:  # kept as notable before it leaves: never in neither
                self._notable[old] = gone
                if len(self._notable) > NOTABLE_KEPT:
                    del self._notable[next(iter(self._notable))]
            del self._summaries[old]

    def recheck(self) -> list[HitRecord]:
        result, _ = self._request("recheck")
        self.apply_hits(result)
        steps = set(result.get("steps", ()))
        return [h for h in self.watchpoints.hits if h.step in steps]

    def watch(self, condition: str, nodes: Any = None, *, target: Any = None, **params: Any) -> Watchpoint:
        import warnings

        result, _ = self._request("watch", condition=condition, nodes=nodes, params=params,
                                  target=P.target_record(target))
        for text in result.get("warnings", ()):
            warnings.warn(text, UserWarning, stacklevel=2)
        return self._apply_watch(result)

    def update_watch(self, wp: int | Watchpoint, **changes: Any) -> Watchpoint:
        wid = wp.id if isinstance(wp, Watchpoint) else int(wp)
        result, _ = self._request("update_watch", wp=wid, changes=changes)
        return self._apply_watch(result)

    def unwatch(self, wp: int | Watchpoint | None = None) -> None:
        wid = None if wp is None else (wp.id if isinstance(wp, Watchpoint) else int(wp))
        result, _ = self._request("unwatch", wp=wid)
        self._apply_watch(result)

    def keep(self, nodes: Any, on: bool = True) -> frozenset[str]:
        """Keep the values of ``nodes`` in the process from their next execution on (see
        :meth:`nbdebug.Debugger.keep`); returns every kept node."""
        result, _ = self._request("keep", nodes=nodes, on=bool(on))
        self.session.keep_values(frozenset(result.get("kept", ())))
        return self.session.kept

    def recommend(self) -> list[tuple[str, dict[str, Any], Any]]:
        return self.watchpoints.recommend()

    def watch_recommended(self) -> list[Watchpoint]:
        return [self.watch(c, target=t, **p) for c, p, t in self.recommend()]

    # -- control --------------------------------------------------------------------------------------
    def cont(self, steps: int | None = None) -> None:
        """Continue (``steps`` more steps); every connected process of the job together."""
        if self._grouped():
            self._listener.cont_all(steps)
        else:
            self._request("cont", steps=steps)

    def pause(self) -> None:
        """Pause at the next node; with several processes, all of them at one step boundary."""
        if self._grouped():
            self._listener.pause_all()
        else:
            self._request("pause")

    def terminate(self) -> None:
        if self._grouped():
            self._listener.terminate_all()
        else:
            self._request("terminate")

    def run_to(self, node: str) -> None:
        self._single("run_to")
        if node not in self.graph.nodes:
            raise KeyError(f"no node named {node!r} to run to")
        self._request("run_to", node=node)

    def next_node(self) -> None:
        self._single("next_node")
        self._request("next_node")

    def on(self, event: str, callback: Any) -> Any:
        return self.hub.on(event, callback)

    def wait(self, timeout: float | None = None, until: Any = None) -> Any:
        """Block until the process is paused or over, or disconnected (or ``timeout`` seconds)."""
        end = None if timeout is None else time.monotonic() + timeout
        done = until or (lambda s: str(s.state) not in ("running", "idle", "connecting"))
        while not done(self):
            if end is not None and time.monotonic() >= end:
                break
            time.sleep(0.02)
        return self.state

    def _grouped(self) -> bool:
        return self._listener.joined_count() > 1

    def _single(self, what: str) -> None:
        n = self._listener.joined_count()
        if n > 1:
            raise RuntimeError(f"{what}: node-level control needs exactly one process, and {n} are connected "
                               "(ranks of a job would block each other in their collectives); use pause, "
                               "continue and step, which act on all of them at a step boundary")

    def _request(self, op: str, **args: Any) -> tuple[Any, list[Any]]:
        if not self.connected:
            raise RuntimeError(f"{op}: process {self.key} is {self.state}; it is not connected")
        return self._listener.request(self, op, args)

    # -- display --------------------------------------------------------------------------------------
    def panel(self) -> Any:
        from ..ui.panel import Panel

        return Panel(self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel())

    def __repr__(self) -> str:
        return (f"<nbdebug.RemoteSource {self.key} {self.session.framework} {self.state} "
                f"step={self.step_index} nodes={len(self.graph)}>")

    # -- messages from the process (listener thread) --------------------------------------------------
    def apply(self, head: dict[str, Any], frames: list[Any]) -> None:
        kind = head["type"]
        with self._lock:
            self.last_heard = time.monotonic()
            if kind == "sync":
                self._apply_sync(head)
            elif kind == "step":
                self._apply_graph(head)
                step = int(head["step"])
                if head.get("monitor") is not None:  # the step's monitor row: the last two frames
                    self._monitor.apply(head["monitor"], frames[-2:], step, self.session.monitor)
                if head.get("summary") is not None:  # summary mode (hub.py's SUMMARY_ABOVE)
                    self._put_summary(head["summary"], step)
                if head.get("table") is not None:
                    self.session.put_step(step, P.read_table(head["table"], frames, self._names))
                else:  # a step with no statistics (level="monitor")
                    self.session.step_index = max(self.session.step_index, step + 1)
                hit = self.apply_hits(head.get("hits"))
                self.hub.emit("step", int(head["step"]))
                if hit:
                    self.hub.emit("hit", hit)
            elif kind == "monitor":  # monitor rows the notebook lacked after a (re)connect (monitor_wire.py)
                if self._monitor.apply_rows(head, frames, self.session.monitor):
                    self.hub.emit("step", int(self.session.monitor.last_step))
            elif kind == "state":
                self._apply_state(head, frames)
            elif kind == "hits":
                hit = self.apply_hits(head.get("hits"))
                if hit:
                    self.hub.emit("hit", hit)
            elif kind == "bye":
                hit = self.apply_hits(head.get("hits"))
                self._ended = str(head.get("state") or "finished")
                self.error = head.get("error") or self.error
                self.current_node, self.pause_reason = None, ""
                self.connected = False
                if hit:
                    self.hub.emit("hit", hit)
                self.hub.emit("state", self.state)
                if self.error:
                    self.hub.emit("error", self.error)

    def _apply_sync(self, head: dict[str, Any]) -> None:
        self.session.reset()
        self._names.clear()
        self._monitor.reset()  # the monitor's rows stay: the run's series go on
        self.full = False  # the process forgot a request for full tables (summaries stay: they describe the past)
        self._apply_graph(head)
        self._replace_watchpoints(head.get("watchpoints", ()))
        self.watchpoints.hits = ([h for h in self.watchpoints.hits if h.condition == "ODD_RANK"]  # the job's
                                 + [P.read_hit(r) for r in head.get("hits", ())])
        self.session.step_index = int(head.get("step_index", self.session.step_index))
        self._ended = None
        self.connected = True

    def _apply_graph(self, head: dict[str, Any]) -> None:
        graph = head.get("graph")
        if graph and P.apply_graph(self.session.graph, graph, getattr(self._listener, "nodes", None)):
            self.hub.emit("node", None)

    def _apply_state(self, head: dict[str, Any], frames: list[Any]) -> None:
        self._apply_graph(head)
        if head.get("partial") is not None:
            self.session.set_partial(P.read_table(head["partial"], frames, self._names))
        elif int(head.get("step_index", -1)) == self.session.step_index:
            self.session.set_partial(None)
        self.session.step_index = max(self.session.step_index, int(head.get("step_index", 0)))
        hit = self.apply_hits(head.get("hits"))
        self._state = str(head.get("state", "running"))
        self.synced = True
        self.current_node = head.get("current_node")
        self.pause_reason = str(head.get("pause_reason") or "")
        failed = head.get("error") and head.get("error") != self.error
        self.error = head.get("error")
        if hit:
            self.hub.emit("hit", hit)
        self.hub.emit("state", self.state)
        if failed:
            self.hub.emit("error", self.error)

    def apply_hits(self, rec: Any) -> HitRecord | None:
        """Replace the hits of the steps ``rec`` names with its records; returns the last new hit."""
        if not rec:
            return None
        steps = {int(s) for s in rec.get("steps", ())}
        new = [P.read_hit(r) for r in rec.get("records", ())]
        with self._lock:
            self.watchpoints.hits = [h for h in self.watchpoints.hits  # ODD_RANK's are the notebook's own
                                     if h.step not in steps or h.condition == "ODD_RANK"] + new
        return new[-1] if new else None

    def _apply_watch(self, result: Mapping[str, Any]) -> Watchpoint:
        with self._lock:
            self._replace_watchpoints(result.get("watchpoints", ()))
            self.watchpoints.hits = [h for h in self.watchpoints.hits if h.watchpoint in self.watchpoints.watchpoints]
        rec = result.get("watchpoint")
        return self.watchpoints.watchpoints[int(rec["id"])] if rec else None  # type: ignore[return-value]

    def _replace_watchpoints(self, records: Any) -> None:
        wps = self.watchpoints.watchpoints
        fresh = {int(r["id"]): P.read_watchpoint(r) for r in records}
        for wid in list(wps):
            if wid not in fresh:
                del wps[wid]
        for wid, wp in fresh.items():
            old = wps.get(wid)
            if old is None:
                wps[wid] = wp
            else:
                old.__dict__.update(wp.__dict__)
