"""``nbdebug.listen()``: the notebook's end of remote debugging — a ZeroMQ ROUTER socket that training
processes connect to.

>>> listener = listen(quiet=True)
>>> listener.host, listener.port > 0, len(listener.token) >= 32
('127.0.0.1', True, True)
>>> sorted(listener.env)
['NBDEBUG_CONNECT', 'NBDEBUG_TOKEN']
>>> listener.close()

Safety: it binds the loopback interface unless another ``host`` is asked for (then it warns); every
process must present the listener's random token in its hello (compared in constant time), and a
process that has not is answered ``refused`` and otherwise ignored; nothing received is unpickled or
executed (``PROTOCOL.md``); inbound messages are limited in size (``tensor_budget`` plus 64 MiB).

Processes are kept in :attr:`Listener.sources`, keyed by rank when the process has one (``RANK`` from
torchrun, ``RANK_ID`` from msrun), else by ``"host:pid"``; a process that reconnects (the listener
restarted, or the network blinked) gets its old entry back, re-synchronized. A process that says
nothing for :data:`LOST_AFTER` seconds shows as ``disconnected``. :attr:`Listener.job` is the processes as
one :class:`~nbdebug.job.Job` (ranks join it as they connect) and :meth:`Listener.panel` its panel; with
several processes, control acts on all of them at one step boundary (``pause_all``, ``cont_all``,
``terminate_all``, and :meth:`Listener.line_up` after one paused on a watchpoint hit).
"""

from __future__ import annotations

import collections
import itertools
import secrets
import threading
import time
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import zmq

from ..control import EventHub
from ..job.job import rank_order
from . import protocol as P
from .absent import AbsentProcesses
from .source import REQUEST_TIMEOUT, RemoteSource
from .transport import Pump

LOST_AFTER = 5.0
#: how many refused hellos :attr:`Listener.refused` keeps (the latest)
REFUSED_KEPT = 100
#: seconds a running process one step past a paused one gets to pause there before it counts as past it
SETTLE_S = 0.5
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: summary mode: a process of a job of more ranks than this (its hello's ``world_size``, or the processes
#: connected) sends, per step, its monitor row and a :class:`~nbdebug.job.summary.StepSummary` instead of its
#: full statistics table; full tables come on request (:meth:`RemoteSource.full_tables`, ``job.rank(r)``, the
#: job panel's rank selector). ``Listener.summary_above`` overrides it per listener.
SUMMARY_ABOVE = 8
#: the listener's send queue (requests to every process of a job at once: ``pause_all`` on 1,000 ranks)
SEND_QUEUE = 1 << 16


_PONG = P.encode({"type": "pong"})  # the same bytes every time: encoded once


class Listener(AbsentProcesses):
    """Accepts training processes and keeps one :class:`RemoteSource` per process."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", *, token: str | None = None,
                 tensor_budget: int = 512 * 2**20) -> None:
        if host not in LOOPBACK:
            warnings.warn(f"nbdebug.listen: binding {host!r}, not the loopback interface: processes on other "
                          "machines can reach this port (each still needs the token; traffic is not encrypted)",
                          UserWarning, stacklevel=3)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise ValueError(f"port must be an int in 0..65535 (0: any free port), got {port!r}")
        self.token = token or secrets.token_urlsafe(32)
        self.tensor_budget = int(tensor_budget)
        #: in rank order; an OrderedDict: a process that joins is filed in place with ``move_to_end``, so the
        #: others stay listed for a reader on another thread (the job, the panel) at every moment
        self.sources: collections.OrderedDict[int | str, RemoteSource] = collections.OrderedDict()
        #: the latest hellos turned away, {reason, pid, host} (the last REFUSED_KEPT: a flood of strangers
        #: costs no memory); ``refused_count`` counts them all
        self.refused: collections.deque[dict[str, Any]] = collections.deque(maxlen=REFUSED_KEPT)
        self.refused_count = 0
        self.hub = EventHub()  # "state" when a process connects, reconnects, leaves
        #: more ranks than this: summary mode (:data:`SUMMARY_ABOVE`)
        self.summary_above = SUMMARY_ABOVE
        self._job: Any = None
        #: the processes' graph nodes, shared between their mirrors when the same (``protocol.apply_graph``)
        self.nodes: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._lining_up = threading.Lock()
        #: one group pause at a time (pause_all, and resuming a process found paused short of its boundary)
        self._pausing = threading.RLock()
        #: the boundary the last pause_all set, until a cont_all / terminate_all (:meth:`_paused_short`)
        self._pause_target: int | None = None
        #: what went wrong in group control and was not the answer to a call (a line-up that timed out, a
        #: command that some process of the job could not get when it was given)
        self.notice = ""
        #: the latest group command ``(generation, op, argument)``, for the processes that were connecting or
        #: away when it was given (:meth:`_intend`)
        self._intent: tuple[int, str, Any] | None = None
        self._generation = 0
        self._by_ident: dict[bytes, RemoteSource] = {}
        self._pending: dict[int, list[Any]] = {}  # request id -> [event, reply header, frames]
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, self.tensor_budget + 64 * 2**20)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if ":" in host:
            sock.setsockopt(zmq.IPV6, 1)
        where = f"[{host}]" if ":" in host else ("127.0.0.1" if host == "localhost" else host)
        try:
            if port:
                sock.bind(f"tcp://{where}:{port}")
                self.port = port
            else:
                self.port = sock.bind_to_random_port(f"tcp://{where}")
        except zmq.ZMQError as e:
            sock.close()
            self._ctx.term()
            raise OSError(f"nbdebug.listen: cannot bind {host}:{port}: {e}") from None
        self.host = host
        self.closed = False
        self.pump = Pump(sock, self._on_message, on_tick=self._tick, max_queue=SEND_QUEUE, name="nbdebug-listener")

    # -- what to start the job with -----------------------------------------------------------------
    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """The environment a training process needs to attach here."""
        return {"NBDEBUG_CONNECT": self.address, "NBDEBUG_TOKEN": self.token}

    def command(self, script: str = "train.py", *args: str) -> str:
        """The shell line that runs ``script`` attached to this listener (``python -m nbdebug.run``)."""
        import shlex

        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        return f"{env} python -m nbdebug.run {shlex.join([script, *args])}"

    def instructions(self) -> str:
        return (f"nbdebug listening on {self.address}\n"
                f"  start the job:   {self.command('train.py')}\n"
                f"  or in a script:  nbdebug.attach(model) with NBDEBUG_CONNECT={self.address} and "
                f"NBDEBUG_TOKEN={self.token}\n"
                f"  torchrun:        {' '.join(f'{k}={v}' for k, v in self.env.items())} torchrun "
                f"--nproc-per-node N -m nbdebug.run train.py")

    # -- the processes --------------------------------------------------------------------------------
    def live(self) -> list[RemoteSource]:
        """The processes connected now whose state has arrived on their connection (not finished, not
        disconnected, not still ``connecting``): what a command reaches at once."""
        return [s for s in list(self.sources.values()) if s.connected and s.synced]

    def live_count(self) -> int:
        return len(self.live())

    def joined_count(self) -> int:
        """The processes connected now, their state arrived or still on its way (``connecting``)."""
        return sum(1 for s in list(self.sources.values()) if s.connected)

    def wait_for(self, n: int = 1, timeout: float | None = 60.0) -> dict[int | str, RemoteSource]:
        """Wait until ``n`` processes are connected; returns :attr:`sources` (``TimeoutError`` if not)."""
        end = None if timeout is None else time.monotonic() + timeout
        while self.live_count() < n:
            if end is not None and time.monotonic() >= end:
                raise TimeoutError(f"{self.live_count()} of {n} processes connected to {self.address} within "
                                   f"{timeout} s" + (f"; refused: {self.refused[-1]['reason']}" if self.refused
                                                     else ""))
            time.sleep(0.02)
        return self.sources

    @property
    def source(self) -> RemoteSource | None:
        """The first process (lowest rank / earliest), or None before any connected."""
        srcs = list(self.sources.values())
        return srcs[0] if srcs else None

    @property
    def job(self) -> Any:
        """The connected processes as one :class:`~nbdebug.job.Job` (its panel is :meth:`panel`): first
        non-finite rank, per-rank hits and summaries, rank-vs-rank compare; its pause / cont / terminate are
        this listener's group commands. Processes that connect later join it."""
        with self._lock:
            if self._job is None:
                from ..job import Job

                self._job = Job(self.sources, control=self)
            return self._job

    # -- group control --------------------------------------------------------------------------------
    def pause_all(self) -> int | None:
        """Pause every connected process at one step boundary S, the earliest every one of them can still
        reach: the end of the step the furthest process is in (as last heard here). A process found past S
        (it finished that step before the request came, or paused by itself at a later boundary) moves S to
        the end of its own step; processes that had already paused short of S are resumed up to it (as in
        :meth:`line_up`), so none waits alone in a collective for a peer paused one step behind. Returns S.

        Each process answers a ``pause_at_step`` request with its step and state (:func:`landing` reads
        where it will stop); when S moves, the processes not yet bound for the new S are asked again (one
        round more at most: every process is armed by then). One that answered "running, in step S+1" while
        it was still ending step S pauses at S after all: its ``state`` message says so and it is resumed up
        to S then (:meth:`_paused_short`). A process still connecting or away pauses when it is back
        (:meth:`_intend`); None when no process is connected now and some will be back."""
        with self._pausing:
            self._settle()
            live = self._intend("pause", None)
            if not live:
                if self._intent_owed():
                    return None  # they pause when they are back (_deliver_owed)
                raise RuntimeError("no process is connected")
            return self._pause_live(live)

    def _pause_live(self, live: list[RemoteSource]) -> int:
        """:meth:`pause_all`'s work on the processes ``live``; returns the boundary."""
        with self._pausing:
            target = max(s.session.step_index - (str(s.state) == "paused" and s.current_node is None)
                         for s in live)
            lands: dict[int, int | None] = {}  # id(source) -> the boundary it stops at (None: paused short)
            ask = live
            for _ in range(8):
                replies = self.request_all(ask, "pause_at_step", {"step": target})
                for src, (reply, _f) in zip(ask, replies, strict=True):
                    lands[id(src)] = landing(reply, target)
                    if isinstance(reply, dict) and isinstance(reply.get("step_index"), int):
                        src.session.step_index = max(src.session.step_index, reply["step_index"])
                furthest = max((b for b in lands.values() if b is not None), default=target)
                if furthest <= target:
                    break
                target = furthest  # a process is past it: all stop at the end of its step
                ask = [s for s in live if (b := lands.get(id(s))) is None or b < target]
            self._pause_target = target
            short = [s for s in live if lands.get(id(s)) is None]
            if short:  # paused at an earlier boundary: they run up to ``target`` (pause_after is armed)
                self.request_all(short, "cont", {"steps": None})
            return target

    def _paused_short(self, src: RemoteSource) -> None:
        """``src`` says it paused at a step boundary before the one the last :meth:`pause_all` set (it answered
        while ending a step, see there): ask it again and resume it up to that boundary (on a thread of its
        own, as the replies arrive on this listener's thread). A pause on a hit is :meth:`line_up`'s."""
        target = self._pause_target
        if (target is None or str(src.state) != "paused" or src.current_node is not None
                or "watchpoint hit" in src.pause_reason or src.step_index - 1 >= target):
            return

        def run() -> None:
            with self._pausing:  # after the pause_all in progress, if any; a cont_all meanwhile ends it
                goal = self._pause_target
                if goal is None or not src.connected:
                    return
                try:
                    reply, _f = self.request(src, "pause_at_step", {"step": goal})
                    if landing(reply, goal) is None:  # still paused short, now armed for ``goal``
                        self.request(src, "cont", {"steps": None})
                except Exception as e:  # noqa: BLE001 - a process that went away meanwhile
                    warnings.warn(f"nbdebug: could not bring {src.key} to the end of step {goal}: {e}",
                                  RuntimeWarning, stacklevel=1)

        threading.Thread(target=run, name="nbdebug-pause-short", daemon=True).start()

    def cont_all(self, steps: int | None = None) -> None:
        """Continue every connected process (``steps`` more steps each). A step boundary some process was
        still asked to pause at (a line-up or a ``pause_all`` that crossed a pause of its own) is forgotten
        first, on every process: a continue means until a hit or the end (or ``steps``) for all of them."""
        with self._pausing:
            self._pause_target = None
        self._settle()
        live = self._intend("cont", steps)
        self.request_all(live, "pause_at_step", {"step": None})
        self.request_all([s for s in live if str(s.state) == "paused"], "cont", {"steps": steps})

    def terminate_all(self) -> None:
        """End every process of the job: the connected ones now, one still connecting or away when its state
        arrives (within :data:`~nbdebug.remote.absent.OWED_S`)."""
        self._pause_target = None
        self._settle()
        self.request_all(self._intend("terminate", None), "terminate", {})

    def line_up(self, timeout: float = 60.0) -> int | None:
        """Bring every connected process to one step boundary after one paused there by itself (a watchpoint
        hit): the furthest boundary any of them can reach — the paused ones' step, or the step a running one
        is already in (it may be waiting for the paused one in a collective), in which case the processes
        paused before it are resumed up to it. Returns that step (None: nothing to line up, or ``timeout``).
        The listener calls it on its own thread when a process pauses on a hit while others run."""
        end = time.monotonic() + timeout
        asked: dict[int, int] = {}  # id(source) -> the boundary it was asked to pause after
        late_since: tuple[int, float] | None = None  # (the furthest running step past base, seen since)
        while time.monotonic() < end and not self.closed:
            live = self.live()
            stopped = [s for s in live if str(s.state) == "paused" and s.current_node is None]
            running = [s for s in live if str(s.state) == "running"]
            if len(live) < 2 or not stopped:
                return None
            base = max(s.step_index - 1 for s in stopped)
            if len(stopped) == len(live) and len({s.step_index for s in live}) == 1:
                self.notice = ""
                return base
            late = [s.step_index for s in running if s.step_index > base]
            if not late or late_since is None or late_since[0] != max(late):
                late_since = (max(late), time.monotonic()) if late else None  # a new "ahead": its own settle time
            # a running process one step ahead may be just finishing ``base`` (about to pause there): it gets
            # SETTLE_S before it counts as past it
            past = late and (max(late) > base + 1 or time.monotonic() - late_since[1] > SETTLE_S)
            target = max(late) if past else base
            ask = [s for s in running if asked.get(id(s)) != target]
            behind = [s for s in stopped if s.step_index - 1 < target]
            if ask or behind:
                for src, (reply, _f) in zip(ask + behind, self.request_all(ask + behind, "pause_at_step",
                                                                           {"step": target}), strict=True):
                    asked[id(src)] = target
                    if isinstance(reply, dict) and isinstance(reply.get("step_index"), int):
                        src.session.step_index = max(src.session.step_index, reply["step_index"])
                if behind:
                    self.request_all(behind, "cont", {"steps": None})
            time.sleep(0.02)
        if not self.closed:
            self._report_line_up(timeout)
        return None

    def _report_line_up(self, timeout: float) -> None:
        """Line-up timed out: say so (``notice``, a warning, the job panel's status line) instead of leaving
        the processes apart without a word."""
        where = ", ".join(f"{s.key}: {s.state} in step {s.step_index}" for s in self.live())
        self.notice = (f"could not line the processes up at one step boundary within {timeout:.0f} s ({where}); "
                       f"use pause all / continue all")
        warnings.warn(f"nbdebug: {self.notice}", RuntimeWarning, stacklevel=2)
        if self._job is not None:
            self._job.hub.emit("state", "notice")

    def _paused_alone(self, src: RemoteSource) -> None:
        """``src`` paused at a step boundary on a hit: line the other processes up with it (a thread of its
        own, as the replies it waits for arrive on this listener's thread)."""
        if (str(src.state) != "paused" or src.current_node is not None or "watchpoint hit" not in src.pause_reason
                or self.live_count() < 2 or not self._lining_up.acquire(blocking=False)):
            return

        def run() -> None:
            try:
                self.line_up()
            except Exception as e:  # noqa: BLE001 - a process that went away meanwhile
                warnings.warn(f"nbdebug: could not line the processes up at one step: {e}", RuntimeWarning,
                              stacklevel=1)
            finally:
                self._lining_up.release()

        threading.Thread(target=run, name="nbdebug-line-up", daemon=True).start()

    # -- requests ---------------------------------------------------------------------------------------
    def request(self, source: RemoteSource, op: str, args: Mapping[str, Any],
                timeout: float = REQUEST_TIMEOUT) -> tuple[Any, list[Any]]:
        """Send ``op(**args)`` to ``source``'s process and wait for its reply; re-raises its error."""
        return self.request_all([source], op, args, timeout)[0]

    def request_all(self, sources: list[RemoteSource], op: str, args: Mapping[str, Any],
                    timeout: float = REQUEST_TIMEOUT) -> list[tuple[Any, list[Any]]]:
        """The same request to several processes at once (sent together, then the replies awaited)."""
        if op not in P.OPS:
            raise ValueError(f"unknown operation {op!r}")
        slots = []
        try:
            for src in sources:
                rid = next(self._ids)
                slot: list[Any] = [threading.Event(), None, [], rid, src, op]
                with self._lock:
                    self._pending[rid] = slot
                slots.append(slot)
                self.pump.send([src.ident, *P.encode({"type": "request", "id": rid, "op": op, "args": dict(args)})])
            end = time.monotonic() + timeout
            for slot in slots:
                if not slot[0].wait(max(0.0, end - time.monotonic())):
                    raise TimeoutError(f"{op}: process {slot[4].key} did not answer within {timeout:g} s")
        finally:
            with self._lock:
                for slot in slots:
                    self._pending.pop(slot[3], None)
        out = []
        for slot in slots:
            head = slot[1]
            if not head.get("ok"):
                P.raise_error(head.get("error") or {})
            out.append((head.get("result"), slot[2]))
        return out

    # -- the listener thread ----------------------------------------------------------------------------
    def _on_message(self, parts: list[Any]) -> None:
        ident, body = bytes(parts[0]), parts[1:]
        try:
            head, frames = P.decode(body)
        except P.ProtocolError as e:
            if ident not in self._by_ident:
                self._refuse(ident, f"malformed hello: {e}", {})
            return
        src = self._by_ident.get(ident)
        if head["type"] == "hello":
            self._hello(ident, head)
            return
        if src is None:
            return  # not authenticated: ignored
        src.last_heard = time.monotonic()
        kind = head["type"]
        if kind == "ping":
            self.pump.send_now([ident, *_PONG])
            if not src.connected:
                src.connected = True
                src.hub.emit("state", src.state)
                if src.synced:  # back on the same connection: what it missed meanwhile
                    self._deliver_owed(src)
        elif kind == "reply":
            with self._lock:
                slot = self._pending.get(head.get("re"))
            if slot is not None:
                slot[1], slot[2] = head, frames
                slot[0].set()
        elif kind in P.AGENT_TYPES:
            was_synced = src.synced
            src.apply(head, frames)
            if kind == "state":
                if not was_synced:  # its first state on this connection: a group command it missed
                    self._deliver_owed(src)
                self._paused_alone(src)
                self._paused_short(src)
            if kind == "bye":
                self._fail_pending(src, f"ended ({src.state})")
                self._by_ident.pop(ident, None)
                self.hub.emit("state", "bye")

    def _refuse(self, ident: bytes, reason: str, head: Mapping[str, Any]) -> None:
        self.refused_count += 1
        self.refused.append({"reason": reason, "pid": head.get("pid"), "host": head.get("host")})
        self.pump.send_now([ident, *P.encode({"type": "refused", "reason": reason})])

    def _hello(self, ident: bytes, head: dict[str, Any]) -> None:
        if not P.token_ok(head.get("token"), self.token):
            self._refuse(ident, "wrong token", head)
            return
        if not isinstance(head.get("pid"), int):
            self._refuse(ident, "hello without a pid", head)
            return
        rank = head.get("rank")
        key = int(rank) if isinstance(rank, int) else f"{head.get('host')}:{head.get('pid')}"
        welcome: dict[str, Any] = {"type": "welcome", "key": str(key)}
        src = self.sources.get(key)
        if src is not None and (src.info.get("pid"), src.info.get("host")) == (head.get("pid"), head.get("host")):
            for old in [i for i, s in self._by_ident.items() if s is src]:
                del self._by_ident[old]
            self._fail_pending(src, "reconnected")
            src.ident = ident
            src.connects += 1
        else:
            src = RemoteSource(self, ident, head)
            self.sources[key] = src  # the same dict, in rank order: the ones after it move behind it, each
            later = sorted((k for k in list(self.sources) if rank_order(k) > rank_order(key)), key=rank_order)
            for k in later:  # in one step (a reader on the kernel's thread sees every process at every moment)
                self.sources.move_to_end(k)
            if self._job is not None:
                self._job.add(key, src)
                welcome["watch"] = self._job_watches()
        world = head.get("world_size")
        ranks = max(world if isinstance(world, int) else 0, len(self.sources))
        src.set_detail("summary" if ranks > self.summary_above else "full")
        welcome["detail"] = src.detail
        last = src.session.monitor.last_step  # the monitor rows it lacks follow the sync (a new source: all)
        welcome["monitor_from"] = 0 if last is None else int(last) + 1
        src.connected = True
        src.synced = False  # until its state arrives (after its sync): "connecting", not yet live
        src.last_heard = time.monotonic()
        self._by_ident[ident] = src
        self.pump.send_now([ident, *P.encode(welcome)])
        announce(src)
        self.hub.emit("state", "connected")

    def _job_watches(self) -> list[dict[str, Any]]:
        """The job's watchpoints (``job.watch`` before this process joined) as ``watch`` request arguments:
        the process sets them on its welcome, before its next step."""
        out = []
        for condition, nodes, params in self._job.watches:
            args = dict(params)
            target = args.pop("target", None)
            out.append({"condition": condition, "nodes": nodes, "params": args, "target": P.target_record(target)})
        return out

    def _tick(self) -> None:
        now = time.monotonic()
        for src in list(self._by_ident.values()):
            if src.connected and now - src.last_heard > LOST_AFTER:
                src.connected = False
                self._fail_pending(src, f"said nothing for {LOST_AFTER:g} s")
                src.hub.emit("state", src.state)
                self.hub.emit("state", "lost")

    # -- display / lifetime ---------------------------------------------------------------------------
    def panel(self) -> Any:
        """The job's panel (:meth:`Job.panel <nbdebug.job.Job.panel>`): the processes (host, PID, rank,
        device, step, state), a rank selector over the usual panel, the first non-finite rank, per-rank
        overview, rank-vs-rank compare and group control."""
        return self.job.panel()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel())

    def close(self) -> None:
        """Stop listening (connected processes keep training and try to reconnect)."""
        if self.closed:
            return
        self.closed = True
        self.pump.close()
        if not self.pump.thread.is_alive():  # else its socket is still open: term() would wait for it
            self._ctx.term()
        for src in self.sources.values():
            if src.connected:
                src.connected = False
                src.hub.emit("state", src.state)

    def __enter__(self) -> Listener:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<nbdebug.Listener {self.address} processes={len(self.sources)} connected={self.live_count()}>"


def landing(reply: Any, target: int) -> int | None:
    """The step boundary a process stops at after it was asked to pause after step ``target``, from its answer
    (``{"step_index", "state", "at_boundary"}``): a running process pauses at the end of ``target`` or, when
    already in a later step, of that step; a process paused at a step boundary stays there — None when that
    boundary is before ``target`` (it must be resumed to reach it). An answer without a step: ``target``.

    >>> landing({"step_index": 7, "state": "running"}, 7), landing({"step_index": 9, "state": "running"}, 7)
    (7, 9)
    >>> landing({"step_index": 7, "state": "paused", "at_boundary": True}, 7) is None
    True
    >>> landing({"step_index": 9, "state": "paused", "at_boundary": True}, 7), landing(None, 7)
    (8, 7)
    """
    if not isinstance(reply, dict) or not isinstance(reply.get("step_index"), int):
        return target
    index = int(reply["step_index"])  # the step in progress (after a boundary: the next one)
    if reply.get("state") == "paused":
        if not reply.get("at_boundary"):
            return target  # paused inside a step (at a node): it stays paused; asked to stop at target after
        return index - 1 if index - 1 >= target else None
    return max(index, target)


def announce(src: RemoteSource) -> None:
    """Make the JupyterLab status item and commands act on ``src`` (no-op outside a kernel)."""
    from ..lab import announce as lab_announce

    lab_announce(src)


def listen(port: int = 0, host: str = "127.0.0.1", *, token: str | None = None,
           tensor_budget: int = 512 * 2**20, quiet: bool = False) -> Listener:
    """Listen for training processes (``nbdebug.attach`` / ``python -m nbdebug.run``) and print how to
    start them; see :class:`Listener`. ``port=0`` picks a free port; ``token`` defaults to a new random
    one (pass the old one to let a running job reconnect to a restarted listener)."""
    listener = Listener(port, host, token=token, tensor_budget=tensor_budget)
    if not quiet:
        print(listener.instructions())
    return listener
