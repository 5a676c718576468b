"""The training side of a remote session: serves one :class:`~nbdebug.Debugger` to a notebook's listener.

The agent connects to ``host:port`` (a ZeroMQ DEALER socket), says hello with the token, and then
forwards the debugger's events — one ``step`` message per step (its statistics rows, the graph delta,
the step's hits), ``state`` changes (with the partial statistics of a step paused inside), hits — and
answers the notebook's requests (tensor values, watchpoints, control commands) by calling the
debugger. The protocol is in ``PROTOCOL.md``.

Never in training's way:

- the training thread only builds messages and queues them; a queue that fills (a slow or stalled
  notebook) is dropped and the notebook re-synchronized later;
- the notebook going away is noticed within :data:`LOST_AFTER` seconds (it answers every ping);
  training goes on, and the agent reconnects with backoff (0.5 s doubling to 10 s), sending the
  graph, the statistics window, watchpoints, hits and state again;
- paused while no notebook is connected, training stays paused at most ``pause_timeout`` seconds
  (``NBDEBUG_PAUSE_TIMEOUT``, default 300), then continues with a warning, and nothing pauses it again
  (hits are still recorded) until a notebook connects;
- a refused hello (wrong token, other protocol version) is reported once; training continues.

>>> Agent.parse_address("127.0.0.1:5555")
('127.0.0.1', 5555)
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
import traceback
import warnings
from dataclasses import replace
from typing import Any

import zmq

from ..control import State
from . import protocol as P
from .monitor_wire import MonitorSender
from .transport import Pump

PING_S = 1.0
#: seconds without a word from the notebook after which it counts as gone
LOST_AFTER = 5.0
HELLO_TIMEOUT = 3.0
BACKOFF = (0.5, 10.0)
REFUSED_RETRY_S = 30.0
PAUSE_TIMEOUT_S = 300.0


def process_info() -> dict[str, Any]:
    """Who this process is: host, pid, and rank / world size from the launcher's environment
    (``RANK``/``WORLD_SIZE`` as torchrun sets them, ``RANK_ID``/``RANK_SIZE`` as msrun does)."""
    def env_int(*names: str) -> int | None:
        for n in names:
            v = os.environ.get(n)
            if v is not None and v.strip().lstrip("-").isdigit():
                return int(v)
        return None

    return {"host": socket.gethostname(), "pid": os.getpid(), "rank": env_int("RANK", "RANK_ID"),
            "world_size": env_int("WORLD_SIZE", "RANK_SIZE"), "local_rank": env_int("LOCAL_RANK", "DEVICE_ID"),
            "argv": list(sys.argv)}


def _computed_forward(node: Any) -> bool:
    """An op or module call of the forward section (where a step summary looks for the loss)."""
    return node is not None and node.section == "forward" and node.kind in ("op", "module")


class Agent:
    """Connects ``dbg`` to the listener at ``address``; see the module docstring."""

    def __init__(self, dbg: Any, address: str, token: str, *, pause_timeout: float = PAUSE_TIMEOUT_S,
                 foreground: bool = True) -> None:
        self.dbg = dbg
        self.host, self.port = self.parse_address(address)
        self.token = str(token)
        self.pause_timeout = float(pause_timeout)
        self.info = process_info()
        self.status = "connecting"  # connecting, connected, refused, closed
        self.refused: str | None = None
        self.connects = 0  # how many times a notebook welcomed us
        self._ctx = zmq.Context()
        self._lock = threading.RLock()  # the key book, the graph delta and the hit steps
        self._book = P.KeyBook()
        self._delta = P.GraphDelta()
        self._monitor = MonitorSender()  # monitor series named on this connection
        self._hit_steps: set[int] = set()
        self._backoff = BACKOFF[0]
        self._next_try = 0.0
        self._hello_at = 0.0
        self._last_heard = 0.0
        self._last_ping = 0.0
        self._lost_since: float | None = time.monotonic()
        self._warned: set[str] = set()
        self._answered = threading.Event()  # the first welcome or refusal
        self._closed = False
        self._subs = [dbg.on("step", self._on_step), dbg.on("hit", self._on_hit), dbg.on("state", self._on_state)]
        self.pump = Pump(None, self._on_message, on_tick=self._tick, on_overflow=self._overflow,
                         name="nbdebug-agent")
        if foreground:
            self._install_excepthook()

    @staticmethod
    def parse_address(address: str) -> tuple[str, int]:
        host, sep, port = str(address).strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"connect must be 'host:port' (e.g. '127.0.0.1:5555'), got {address!r}")
        return host.strip("[]"), int(port)

    @property
    def connected(self) -> bool:
        return self.status == "connected"

    def first_contact(self, timeout: float) -> bool:
        """Wait (at attach) up to ``timeout`` seconds for the notebook's first answer; True when welcomed.
        When nothing answered, say so once: training goes on, and connects when a notebook listens."""
        self._answered.wait(timeout)
        if not self._answered.is_set():
            self._warn_once("silent", f"no notebook answered at {self.host}:{self.port} within {timeout:g} s; "
                            "training goes on without it (it connects when nbdebug.listen() runs there)")
        return self.connected

    # -- events from the debugger (training thread, or whoever changed the state) ------------------
    def _on_step(self, step: int) -> None:
        now = time.monotonic()
        if not self.connected:
            return
        with self._lock:
            table = self.dbg.session.steps.get(step)
            mon, mon_frames = self._monitor.part(getattr(self.dbg.session, "monitor", None), step)
            if table is None and mon is None and not self.summary_mode:
                return
            msg = {"type": "step", "step": step, "graph": self._delta.take(self.dbg.graph),
                   "step_index": self.dbg.session.step_index, **self._hits_of({step})}
            frames: list[Any] = []
            if self.summary_mode:  # many ranks: the step in a few numbers (job/summary.py)
                msg["summary"] = self._step_summary(step, table, now).to_dict()
            if table is not None and (not self.summary_mode or self._full):  # the full table: asked for
                msg["table"], frames = P.table_header(table, self._book)
            if mon is not None:  # the step's monitor row (monitor_wire.py): its two frames after the table's
                msg["monitor"], frames = mon, [*frames, *mon_frames]
            self.pump.send(P.encode(msg, frames))

    def _step_summary(self, step: int, table: Any, now: float) -> Any:
        """``step``'s :class:`~nbdebug.job.summary.StepSummary`: the table's counts and non-finite origin (searched
        only when the step holds a NaN/Inf), the step's hits, the monitor's loss and total gradient norm, and
        the time since the previous step ended (None for the first one seen)."""
        from ..job.summary import summarize_table
        from ..session.stats import StatsTable
        from ..watch.watchpoints import count_hits

        dbg = self.dbg
        nodes = dbg.graph.nodes
        hits = count_hits(h for h in list(dbg.watchpoints.hits) if h.step == step)
        s = summarize_table(table if table is not None else StatsTable(), rank=self.info.get("rank") or 0, step=step,
                            hits=hits, computed_forward=lambda n: _computed_forward(nodes.get(n)),
                            backward=lambda n: (node := nodes.get(n)) is not None and node.section == "backward")
        if s.nonfinite_tensors and table is not None:
            found = dbg.first_nonfinite(step)
            if found is not None:
                s = replace(s, origin=(found[0], found[1], int(table.index.get((found[0], found[1]), -1))))
        mon = getattr(dbg.session, "monitor", None)
        if mon is not None and dbg.level == "monitor":  # no table: the step's monitor row (origin too)
            from ..job.summary import summarize_monitor_row

            s = summarize_monitor_row(mon.row(step), rank=self.info.get("rank") or 0, step=step, hits=hits)
        loss = mon.value(step, "Run", "loss") if mon is not None else None
        grad = mon.value(step, "Run", "grad_norm_total") if mon is not None else None
        last, self._last_step_end = self._last_step_end, (step, now)
        took = now - last[1] if last is not None and last[0] == step - 1 else None
        return replace(s, loss=s.loss if loss is None else float(loss),
                       grad_norm_total=None if grad is None else float(grad), step_time=took)

    def _on_hit(self, hit: Any) -> None:
        with self._lock:
            self._hit_steps.add(int(getattr(hit, "step", -1)))

    def _on_state(self, _state: Any) -> None:
        if self.connected:
            with self._lock:
                self.pump.send(self._state_message())

    def _state_message(self) -> list[Any]:
        dbg = self.dbg
        s = dbg.session
        msg: dict[str, Any] = {"type": "state", "state": str(dbg.state), "current_node": dbg.current_node,
                               "pause_reason": dbg.pause_reason, "error": dbg.error, "step_index": s.step_index,
                               "graph": self._delta.take(s.graph), **self._hits_of(set())}
        frames: list[Any] = []
        if dbg.state is State.PAUSED and len(s.recorder):
            head, frames = P.table_header(s.table(s.step_index), self._book)
            msg["partial"] = head
        return P.encode(msg, frames)

    def _hits_of(self, steps: set[int]) -> dict[str, Any]:
        steps = steps | self._hit_steps
        self._hit_steps = set()
        if not steps:
            return {}
        records = [P.hit_record(h) for h in list(self.dbg.watchpoints.hits) if h.step in steps]
        return {"hits": {"steps": sorted(steps), "records": records}}

    def _overflow(self) -> None:
        """Messages were dropped (a full queue, or a socket that would block): the notebook is slow, or gone.
        Which one shows next: "not keeping up" is said when it answers again, "stopped answering" when it
        counts as lost (:data:`LOST_AFTER`) — not "not keeping up" for a notebook that went away."""
        if self._dropped_at is None:
            self._dropped_at = time.monotonic()
        self._resync_due = True

    _dropped_at: float | None = None
    #: the notebook asked for step summaries instead of full tables (its welcome's ``detail``: a job of many
    #: ranks); ``_full``: full tables asked for on top (the ``tables`` request, a rank selected in the panel)
    summary_mode = False
    _full = False
    _last_step_end: tuple[int, float] | None = None

    _resync_due = False
    #: the notebook's welcome: the first monitor step it lacks (its mirror's last + 1; 0 after a kernel restart)
    _monitor_from: int | None = None
    _terminating = False
    _hello_sent = False
    _hello_parts: list[Any] = []

    # -- the connection (pump thread) ---------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        if self._closed:
            return
        if self.status == "connected":
            if now - self._last_heard > LOST_AFTER:
                self._lose(f"the notebook at {self.host}:{self.port} stopped answering; training continues and "
                           "reconnects when it is back")
            else:
                if now - self._last_ping >= PING_S:
                    self._last_ping = now
                    self.pump.send_now(P.encode({"type": "ping", "step_index": self.dbg.session.step_index,
                                                 "state": str(self.dbg.state)}))
                if self._resync_due:
                    self._resync_due = False
                    self._sync()
        elif self.status == "hello" and now - self._hello_at > HELLO_TIMEOUT:
            self._drop_socket(now)  # no connection within HELLO_TIMEOUT, or no answer that long after the hello
        elif self.status == "hello" and not self._hello_sent:
            self._hello_sent = self.pump.send_now(self._hello_parts)  # once the TCP connection is up
            if self._hello_sent:  # the notebook gets its full time to answer (not what the connection took)
                self._hello_at = now
        elif self.status in ("connecting", "refused") and now >= self._next_try:
            self._hello(now)
        self._pause_watchdog(now)

    def _hello(self, now: float) -> None:
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.IMMEDIATE, 1)  # queue nothing for a peer that is not there
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        where = f"[{self.host}]" if ":" in self.host else self.host
        try:
            sock.connect(f"tcp://{where}:{self.port}")
        except zmq.ZMQError as e:
            sock.close(linger=0)
            self._warn_once("connect", f"cannot connect to {self.host}:{self.port} ({e}); training continues, "
                            "retrying")
            self._drop_socket(now)
            return
        self.pump.replace(sock)
        dbg = self.dbg
        hello = {"type": "hello", "token": self.token, **self.info, "framework": dbg.session.framework,
                 "framework_version": dbg.session.framework_version, "device": dbg.session.device,
                 "level": dbg.level, "check": dbg.check, "stats_window": dbg.session.stats_window}
        self._hello_parts = P.encode(hello)
        self._hello_sent = self.pump.send_now(self._hello_parts)
        self.status = "hello"
        self._hello_at = now

    def _drop_socket(self, now: float) -> None:
        self.pump.replace(None)
        self.status = "refused" if self.refused else "connecting"
        wait = REFUSED_RETRY_S if self.refused else self._backoff
        self._next_try = now + wait
        self._backoff = min(self._backoff * 2, BACKOFF[1])

    def _lose(self, why: str) -> None:
        self._dropped_at = None
        warnings.warn(f"nbdebug: {why}", RuntimeWarning, stacklevel=1)
        now = time.monotonic()
        self._lost_since = now
        self._backoff = BACKOFF[0]
        self._drop_socket(now)

    def _pause_watchdog(self, now: float) -> None:
        if self.status == "connected" or self.dbg.state is not State.PAUSED:
            if self.status == "connected":
                self._lost_since = None
            return
        if self._lost_since is None:
            self._lost_since = now
        if now - self._lost_since > self.pause_timeout:
            self._lost_since = now
            self.dbg.pausing = False  # nobody to resume it: later hits would each wait the timeout again
            warnings.warn(f"nbdebug: paused with no notebook connected for {self.pause_timeout:g} s "
                          "(NBDEBUG_PAUSE_TIMEOUT); training continues, and hits no longer pause it until a "
                          "notebook connects", RuntimeWarning, stacklevel=1)
            try:
                self.dbg.cont()
            except Exception:  # noqa: BLE001
                traceback.print_exc()

    def _on_message(self, parts: list[Any]) -> None:
        try:
            head, frames = P.decode(parts)
        except P.ProtocolError as e:
            self._warn_once("protocol", f"dropped a malformed message from the notebook: {e}")
            return
        self._last_heard = time.monotonic()
        if self._dropped_at is not None and self._last_heard - self._dropped_at > PING_S and self.connected:
            self._dropped_at = None  # it answers after the drop: slow, not gone
            self._warn_once("overflow", "the notebook is not keeping up; it will be re-synchronized")
        kind = head["type"]
        if kind == "welcome" and self.status == "hello":
            self.status = "connected"
            self.refused = None
            self.connects += 1
            self._backoff = BACKOFF[0]
            self._lost_since = None
            self.dbg.pausing = True  # someone can resume a pause again
            self._resync_due = False  # the full sync follows now (one scheduled while away would redo it)
            self._job_watches(head.get("watch"))
            with self._lock:
                self.summary_mode, self._full = head.get("detail") == "summary", False
                start = head.get("monitor_from")  # the first monitor step the notebook lacks (None: send none)
                self._monitor_from = start if isinstance(start, int) and not isinstance(start, bool) else None
            self._answered.set()
            self._sync()
        elif kind == "refused":
            self.refused = str(head.get("reason", "refused"))
            self._warn_once("refused:" + self.refused, f"the notebook at {self.host}:{self.port} refused this "
                            f"process: {self.refused}; training continues without it")
            self._answered.set()
            self._drop_socket(time.monotonic())
        elif kind == "request" and self.connected:
            self._serve(head)

    def _job_watches(self, specs: Any) -> None:
        """The watchpoints the notebook set on the job before this process joined (its welcome carries
        them), unless this debugger already has the same one (a process that reconnects keeps its own)."""
        if not isinstance(specs, list):
            return
        def key(condition: Any, nodes: Any) -> tuple[str, Any]:
            return str(condition).strip().upper(), repr([nodes] if isinstance(nodes, str) else nodes)

        have = {key(w.condition, w.nodes) for w in list(self.dbg.watchpoints.watchpoints.values())}
        for spec in specs:
            if not isinstance(spec, dict) or key(spec.get("condition"), spec.get("nodes")) in have:
                continue
            try:
                P.check_request({"id": 0, "op": "watch", "args": spec})
                self._op_watch(**spec)
            except Exception as e:  # noqa: BLE001 - a bad spec: said, and the others still set
                self._warn_once("job-watch", f"the job's watchpoint {spec.get('condition')!r} was not set here: {e}")

    def _sync(self) -> None:
        """Everything the notebook needs after a (re)connect: graph, watchpoints, hits, the statistics
        window, then the state."""
        dbg = self.dbg
        for attempt in range(20):  # training may change a dict under us while it runs: read again
            try:
                with self._lock:
                    self._book, self._delta = P.KeyBook(), P.GraphDelta()
                    self._monitor.reset()
                    msgs = [P.encode({"type": "sync", "graph": self._delta.take(dbg.graph),
                                      "watchpoints": [P.watchpoint_record(w)
                                                      for w in list(dbg.watchpoints.watchpoints.values())],
                                      "hits": [P.hit_record(h) for h in list(dbg.watchpoints.hits)],
                                      "step_index": dbg.session.step_index})]
                    for step in sorted(dbg.session.steps) if not self.summary_mode else ():
                        head, frames = P.table_header(dbg.session.steps[step], self._book)
                        msgs.append(P.encode({"type": "step", "step": step, "table": head, "replay": True}, frames))
                    if self._monitor_from is not None:  # the monitor rows the notebook lacks (after a restart: all)
                        for head, frames in self._monitor.replay(getattr(dbg.session, "monitor", None),
                                                                 self._monitor_from):
                            msgs.append(P.encode({"type": "monitor", **head}, frames))
                    msgs.append(self._state_message())
                    for m in msgs:  # queued under the lock: no step message (new names, ids) slips in between
                        self.pump.send(m)
                break
            except (RuntimeError, KeyError):
                if attempt == 19:
                    raise
                time.sleep(0.01)

    # -- requests (pump thread) ---------------------------------------------------------------------
    def _serve(self, head: dict[str, Any]) -> None:
        try:
            rid, op, args = P.check_request(head)
        except P.ProtocolError as e:
            rid = head.get("id") if isinstance(head.get("id"), int) else -1
            self.pump.send(P.encode({"type": "reply", "re": rid, "ok": False,
                                     "error": {"type": "ValueError", "message": str(e)}}))
            return
        frames: list[Any] = []
        try:
            result, frames = getattr(self, "_op_" + op)(**args)
            reply = {"type": "reply", "re": rid, "ok": True, "result": result}
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the notebook
            reply = {"type": "reply", "re": rid, "ok": False, "error": P.error_record(e)}
        self.pump.send(P.encode(reply, frames))

    def _op_tensor(self, node: str, slot: str, step: Any = "current", max_bytes: int = 512 * 2**20) -> Any:
        from ..session.store import NotRetainedError

        arr = self.dbg.tensor(str(node), str(slot), step if isinstance(step, int) else str(step))
        if arr.dtype.kind not in P.TENSOR_KINDS:
            raise NotRetainedError(f"{node} {slot}: a {arr.dtype} value cannot travel (plain numbers only)")
        if arr.nbytes > int(max_bytes):
            raise NotRetainedError(f"{node} {slot}: the value is {arr.nbytes} bytes, over the transfer budget of "
                                   f"{int(max_bytes)} bytes (nbdebug.listen(tensor_budget=...) raises it)")
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        return P.array_meta(arr), [P.array_frame(arr)]

    def _watch_result(self, wp: Any) -> tuple[dict[str, Any], list[Any]]:
        wps = [P.watchpoint_record(w) for w in list(self.dbg.watchpoints.watchpoints.values())]
        return {"watchpoint": None if wp is None else P.watchpoint_record(wp), "watchpoints": wps}, []

    def _op_watch(self, condition: str, nodes: Any = None, params: Any = None, target: Any = None) -> Any:
        params = dict(params or {})
        if target is not None:
            params["target"] = P.read_target(target)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wp = self.dbg.watch(str(condition), nodes, **params)
        result, frames = self._watch_result(wp)
        result["warnings"] = [str(c.message) for c in caught]
        return result, frames

    def _op_update_watch(self, wp: int, changes: Any = None) -> Any:
        return self._watch_result(self.dbg.update_watch(int(wp), **dict(changes or {})))

    def _op_unwatch(self, wp: Any = None) -> Any:
        self.dbg.unwatch(None if wp is None else int(wp))
        return self._watch_result(None)

    def _op_keep(self, nodes: Any, on: Any = True) -> Any:
        return {"kept": sorted(self.dbg.keep(nodes, on=bool(on)))}, []

    def _op_recheck(self) -> Any:
        found = self.dbg.recheck()
        with self._lock:
            self._hit_steps.update(h.step for h in found)
            hits = self._hits_of(set())
        return hits.get("hits", {"steps": [], "records": []}), []

    def _op_cont(self, steps: Any = None) -> Any:
        self.dbg.cont(steps)
        return None, []

    def _op_pause(self) -> Any:
        self.dbg.pause()
        return None, []

    def _op_pause_at_step(self, step: Any) -> Any:
        """Pause at the end of step ``step`` (at the next step end when that one is already over; nothing
        when training is already paused at that boundary or a later one; None: forget the boundary) — the
        controller's :meth:`~nbdebug.control.Controller.pause_after`, which decides under its own lock, so a
        request that crosses a pause of the process's own (a hit) cannot stay armed behind it. The answer is the
        step in progress, the state and whether it is paused at a step boundary (``hub.landing`` reads it)."""
        dbg = self.dbg
        dbg.pause_after(None if step is None else int(step))
        state = dbg.state  # read after the request is armed: a pause at the boundary it names shows
        return {"step_index": dbg.session.step_index, "state": str(state),
                "at_boundary": state is State.PAUSED and dbg.current_node is None}, []

    def _op_terminate(self) -> Any:
        self._terminating = True
        self.dbg.terminate()
        return None, []

    def _op_run_to(self, node: str) -> Any:
        self.dbg.run_to(str(node))
        return None, []

    def _op_next_node(self) -> Any:
        self.dbg.next_node()
        return None, []

    def _op_tables(self, on: Any = True) -> Any:
        """Summary mode: full tables from now on (``on``; the statistics window's tables are sent first, as
        replayed ``step`` messages ahead of this reply) or no longer (``on=False``). Returns the steps sent."""
        window: list[tuple[int, Any]] = []
        for attempt in range(20):  # training may change the window under us: read it again
            try:
                window = sorted(list(self.dbg.session.steps.items()), key=lambda kv: kv[0]) if on else []
                break
            except RuntimeError:
                if attempt == 19:
                    raise
                time.sleep(0.01)
        with self._lock:
            self._full = bool(on)
            for step, table in window:
                head, frames = P.table_header(table, self._book)
                self.pump.send(P.encode({"type": "step", "step": step, "table": head, "replay": True}, frames))
        return {"steps": [step for step, _t in window], "full": bool(on)}, []

    def _op_resync(self) -> Any:
        self._resync_due = True
        return None, []

    # -- lifetime -----------------------------------------------------------------------------------
    def _warn_once(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(f"nbdebug: {text}", RuntimeWarning, stacklevel=2)

    def _install_excepthook(self) -> None:
        previous = sys.excepthook
        agent = self

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            if not agent._closed:
                agent.close(error="".join(traceback.format_exception(kind, exc, tb)))
            previous(kind, exc, tb)

        sys.excepthook = hook

    def close(self, error: str | None = None, timeout: float = 2.0) -> None:
        """Say goodbye (final state, or the traceback that ended the script), then disconnect."""
        if self._closed:
            return
        for off in self._subs:
            off()
        if self.connected:
            ended = self.dbg.state is State.TERMINATED or self._terminating
            state = "failed" if error else ("terminated" if ended else "finished")
            self.pump.send(P.encode({"type": "bye", "state": state, "error": error,
                                     "step_index": self.dbg.session.step_index, **self._hits_of(set())}))
            self.pump.drain(timeout)
        self._closed = True
        self.status = "closed"
        self.pump.close()
        if not self.pump.thread.is_alive():  # else its socket is still open: term() would wait for it
            self._ctx.term()
