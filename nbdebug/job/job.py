"""``Job``: the ranks of one training job as one debuggable thing.

A job is a mapping ``rank -> source``: each a panel source (:mod:`nbdebug.ui.source`) — a live
:class:`~nbdebug.Debugger` in this process, an offline session of one rank's dump
(``nbdebug.load(path).job``), or a remote rank's proxy. The job reads them, never their frameworks, so it
imports neither torch nor MindSpore.

What it answers:

* :meth:`Job.first_nonfinite` — which rank went non-finite first, at which node and step;
* :meth:`Job.summary` / :meth:`Job.overview` — one :class:`~nbdebug.job.summary.StepSummary` per rank and
  step (tensors, non-finite tensors and values, largest finite magnitude, loss, hits, origin);
* :attr:`Job.hits` — the hits of each rank; :meth:`Job.compare_ranks` — two ranks' same step compared
  node by node, as two runs are (:func:`nbdebug.compare`).

**"First" across ranks.** Ranks share no clock: their timestamps come from different processes (and
hosts), and a collective makes every rank wait for the slowest, so wall time says little about cause.
The job orders by the training's own coordinates instead: the earliest *step*; within a step the earliest
*position in execution order* (how many tensors into the step the rank had computed when its first
non-finite origin appeared — ranks run the same program, so positions are comparable); the lowest *rank*
breaks ties. A rank that produced NaN in its forward pass therefore comes before a rank that only received
NaN through the gradients' allreduce later in the same step.

**Control acts on every rank at a step boundary.** Data-parallel ranks meet in collectives (the gradient
allreduce, a barrier); a rank paused alone would leave the others waiting in their next collective until
the process group's timeout. So :meth:`Job.pause` asks every running rank to pause after the same step
(the step the furthest rank is in), :meth:`Job.cont` resumes all of them (with ``steps``: up to the same
step), :meth:`Job.terminate` ends all of them. When one rank pauses at a step boundary on its own (a
watchpoint hit), the job lines the others up with it (``sync=True``): every rank pauses at the first
boundary all of them can reach — after the hit's step, or after the next one when a rank was already inside
it (waiting in its first collective), in which case the hit rank is resumed up to there; the hit keeps its
step. Node-level control (:meth:`Job.run_to`, :meth:`Job.next_node`) exists only for a
single-rank job.

>>> from nbdebug.session.session import Session
>>> from nbdebug.offline import OfflineSession
>>> job = Job({0: OfflineSession(Session(framework="pytorch", live=False)),
...            1: OfflineSession(Session(framework="pytorch", live=False))})
>>> job.ranks, job.first_nonfinite(), job.hit_counts()
([0, 1], None, {0: 0, 1: 0})
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np

from ..control import EventHub
from ..session.stats import COL
from ..ui.source import SourceView, as_source
from ..watch.watchpoints import HitRecord, count_hits
from .odd_rank import OddRankWatch
from .summary import StepSummary, summarize_monitor_row, summarize_table

#: seconds a rank that just finished the target step gets to pause there before it counts as past it
SETTLE_S = 0.5


class NonFinite(NamedTuple):
    """Where a rank's first non-finite value came from: rank, node, slot, step and position in the step."""

    rank: int
    node: str
    slot: str
    step: int
    position: int

    def __str__(self) -> str:
        return f"rank {self.rank}, node {self.node}, step {self.step}"


class Job:
    """The ranks of one job (``{rank: source}``); see the module docstring.

    ``sync``: when a live rank pauses at a step boundary by itself, line the other ranks up with it.
    ``control``: an object that already steers the ranks together — ``pause_all()``, ``cont_all(steps)``,
    ``terminate_all()``, e.g. the listener of remote ranks, whose processes pause at a step themselves —
    to which :meth:`pause`, :meth:`cont` and :meth:`terminate` are handed (``sync`` is then its business).
    """

    def __init__(self, sources: Mapping[Any, Any], *, sync: bool = True, control: Any = None) -> None:
        if not isinstance(sources, Mapping) or (not sources and control is None):
            raise ValueError("a Job needs a non-empty mapping {rank: source}")
        self.control = control
        if control is not None and not all(callable(getattr(control, m, None))
                                           for m in ("pause_all", "cont_all", "terminate_all")):
            raise TypeError(f"control needs pause_all(), cont_all(steps) and terminate_all(); got "
                            f"{type(control).__name__}")
        self._sync = sync
        self._sources: dict[Any, Any] = {}
        self._views: dict[Any, SourceView] = {}
        self._cache: dict[tuple[Any, int], StepSummary] = {}
        self._subs: list[Any] = []
        #: watchpoints set on the job: ``(condition, nodes, params)``, given to every rank that joins later
        self._watches: list[tuple[str, Any, dict[str, Any]]] = []
        self._lock = threading.RLock()  # one alignment of the ranks at a time; ranks added one at a time
        #: ``state`` with the payload ``"ranks"`` when a rank joins (:meth:`add`)
        self.hub = EventHub()
        #: the job's ODD_RANK watchpoints (one rank far from the others at the same step)
        self.odd_rank = OddRankWatch(self)
        #: an ODD_RANK pause is on its way (later ODD_RANK steps add hits but must not move its boundary on)
        self._odd_pausing = False
        for rank, src in sources.items():
            self.add(rank, src)

    def add(self, rank: Any, source: Any) -> None:
        """Add ``rank`` (a rank that connected after the job was made, e.g. to a listener), or give it a new
        source (a restarted process of that rank: what the job knew of the old one is forgotten). ``rank`` is
        an int >= 0, or ``"host:pid"`` for a process outside a distributed job (it sorts after the ranks)."""
        _check_rank(rank)
        src = as_source(source)
        with self._lock:
            if self._sources.get(rank) is src:
                return
            view = SourceView(src)
            self._sources = dict(sorted({**self._sources, rank: src}.items(), key=lambda kv: rank_order(kv[0])))
            self._views = {**self._views, rank: view}
            self._cache = {k: v for k, v in list(self._cache.items()) if k[0] != rank}
            if view.live:
                self._subs.append(view.on("step", lambda _s, rank=rank, view=view: self._summarize_new(rank, view)))
                if self._sync and self.control is None:
                    self._subs.append(view.on("state", lambda _s, rank=rank: self._rank_state(rank)))
            # the job's watchpoints on a rank that joins after they were set; a listener's job (``control``)
            # leaves that to the listener, whose welcome carries them (they apply before the rank's next step)
            watches = list(self._watches) if view.live and self.control is None else []
        for condition, nodes, params in watches:
            src.watch(condition, nodes, **params)
        self.hub.emit("state", "ranks")

    @property
    def watches(self) -> list[tuple[str, Any, dict[str, Any]]]:
        """The watchpoints set on the job, ``(condition, nodes, params)``: what a rank that joins gets."""
        return list(self._watches)

    # -- what it is -------------------------------------------------------------------------------
    @property
    def ranks(self) -> list[int]:
        """The ranks, ascending."""
        return list(self._sources)

    def source(self, rank: int) -> Any:
        """The panel source of ``rank``."""
        try:
            return self._sources[rank]
        except KeyError:
            raise KeyError(f"no rank {rank} in this job; ranks: {self.ranks}") from None

    def rank(self, rank: int) -> Any:
        """The source of ``rank`` with its full statistics: a remote rank in summary mode (a job of many
        ranks) is asked for its full tables first — the window it holds arrives before this returns, and
        every step's table from then on (:meth:`RemoteSource.full_tables`)."""
        src = self.source(rank)
        fetch = getattr(src, "full_tables", None)
        if fetch is not None and getattr(src, "detail", "full") == "summary" and getattr(src, "connected", False):
            fetch(True)
        return src

    def __len__(self) -> int:
        return len(self._sources)

    @property
    def live(self) -> bool:
        """True when some rank is a live (controllable) source."""
        return any(v.live for v in self._views.values())

    @property
    def steps(self) -> list[int]:
        """Every finished step some rank has statistics or a summary for, ascending."""
        out = {step for _rank, step in list(self._cache)}  # as of now: a rank's thread may summarise meanwhile
        for src in self._sources.values():
            out.update(getattr(src.session, "steps", {}) or {})
            if _monitor_level(src):
                out.update(src.session.monitor.present([])[0].tolist())  # its steps (no column read)
            sent = getattr(src, "summary_steps", None)
            if sent is not None:  # a remote rank in summary mode: the steps it sent summaries of
                out.update(sent())
        return sorted(out)

    # -- per rank ---------------------------------------------------------------------------------
    @property
    def hits(self) -> dict[int, list[HitRecord]]:
        """``{rank: hits}``, each list in execution order."""
        return {r: v.hits for r, v in self._views.items()}

    def hit_counts(self) -> dict[int, int]:
        """``{rank: number of hits}`` (notices do not count)."""
        return {r: count_hits(h) for r, h in self.hits.items()}

    def watch(self, condition: str, nodes: Any = None, **params: Any) -> dict[Any, Any]:
        """The same watchpoint on every rank (``source.watch``); ``{rank: Watchpoint}``. ``ODD_RANK`` compares
        the ranks with each other at every step all of them finished (:mod:`nbdebug.job.odd_rank`). Ranks
        that join later (a listener's processes connecting) get the watchpoint as they join, so it may be set
        before the job starts; :meth:`unwatch` takes the job's watchpoints away."""
        with self._lock:  # ranks that join from now on get it from add()
            self._watches.append((condition, nodes, dict(params)))
            ranks = self.ranks
        wps = {r: self.source(r).watch(condition, nodes, **params) for r in ranks}
        if isinstance(condition, str) and condition.strip().upper() == "ODD_RANK":
            self.odd_rank.add(wps, nodes, params)
        return wps

    def unwatch(self) -> None:
        """Remove every watchpoint from every rank, and the job's from the ranks that join later."""
        with self._lock:
            self._watches = []
            self.odd_rank.clear()  # ODD_RANK is the job's own: it goes with the ranks' watchpoints
            ranks = [r for r, v in self._views.items() if v.live]
        for r in ranks:
            self.source(r).unwatch()

    def summary(self, rank: int, step: int) -> StepSummary | None:
        """``rank``'s :class:`StepSummary` of ``step`` (None when that rank has no statistics for it).

        A summary outlives its statistics: a live rank's steps are summarised as they finish, so the job
        still answers for steps that have left the Debugger's ``stats_window``."""
        src = self.source(rank)
        own = getattr(src, "step_summary", None)
        sent = own(step) if own is not None else None
        if sent is not None:  # a remote rank in summary mode sends its summaries
            return sent
        hits = count_hits(h for h in src.hits if h.step == step)
        cached = self._cache.get((rank, step))
        if cached is not None:  # a step's statistics never change; its hits may (a new watchpoint)
            if cached.hits != hits:
                cached = self._cache[(rank, step)] = replace(cached, hits=hits)
            return cached
        session = src.session
        if _monitor_level(src):  # no tables: the step's monitor row (all of them, also after a reconnect)
            row = session.monitor.row(step)
            if not row:
                return None
            out = summarize_monitor_row(row, rank=rank, step=step, hits=hits)
            self._cache[(rank, step)] = out
            return out
        if step not in (getattr(session, "steps", {}) or {}):
            return None
        try:
            table = session.table(step)
        except KeyError:  # left the live window since
            return None
        found = _origin(src, step) if _any_nonfinite(table) else None  # a finite step has no origin: not searched
        nodes = session.graph.nodes
        out = summarize_table(table, rank=rank, step=step, origin=found[:2] if found else None, hits=hits,
                              computed_forward=lambda n: _computed_forward(nodes.get(n)),
                              backward=lambda n: _backward(nodes.get(n)))
        self._cache[(rank, step)] = out
        return out

    def _summarize_new(self, rank: int, view: SourceView) -> None:
        """A live rank finished a step: summarise the steps it holds that have no summary yet."""
        if self._views.get(rank) is not view:
            return  # a source the rank no longer has
        steps = getattr(view.obj.session, "steps", {}) or {}
        for step in [s for s in list(steps) if (rank, s) not in self._cache]:
            self.summary(rank, step)
        if self.odd_rank.watches and self.odd_rank.on_step() and not self._odd_pausing:
            # an odd rank: pause the job like a hit does, once — the condition holds on every later step too, and
            # each new pause would move the boundary the ranks were asked to stop at one step on, for ever
            self._odd_pausing = True
            if self.control is None:
                self.pause()
            else:  # a listener's: this is its receiving thread, which pause_all's answers need
                threading.Thread(target=self.pause, name="nbdebug-odd-rank-pause", daemon=True).start()

    def overview(self, steps: Iterable[int] | None = None) -> dict[int, dict[int, StepSummary]]:
        """``{step: {rank: StepSummary}}`` over ``steps`` (default: every step)."""
        out: dict[int, dict[int, StepSummary]] = {}
        for step in (self.steps if steps is None else steps):
            row = {r: s for r in self.ranks if (s := self.summary(r, step)) is not None}
            if row:
                out[step] = row
        return out

    def first_nonfinite(self, step: int | None = None) -> NonFinite | None:
        """The rank whose non-finite values came first (see the module docstring for "first"): in ``step``,
        or (None) over every step, earliest step first. None when every rank is finite — and while a rank
        that still runs has not reported the earliest non-finite step (its own origin may come earlier in
        that step: a rank that received NaN through the allreduce often reports before the one that made it)."""
        for s in (self.steps if step is None else [int(step)]):
            summaries = {r: self.summary(r, s) for r in self.ranks}
            found = [NonFinite(r, o[0], o[1], s, o[2]) for r, sm in summaries.items()
                     if sm is not None and (o := sm.origin) is not None]
            if found:
                if any(self._unsettled(r, s) for r, sm in summaries.items() if sm is None):
                    return None  # a rank still inside ``s`` may yet turn out first: no answer before it reports
                return min(found, key=lambda f: (f.position, rank_order(f.rank)))
        return None

    def _unsettled(self, rank: Any, step: int) -> bool:
        """True while ``rank`` runs and has not reported ``step`` yet (still in it, or its summary on the way)."""
        view = self._views.get(rank)
        return (view is not None and view.live and view.state in ("running", "idle", "connecting")
                and view.running_step <= step + 1)

    def origins(self, step: int) -> dict[int, NonFinite | None]:
        """Each rank's own first non-finite origin in ``step``."""
        out: dict[int, NonFinite | None] = {}
        for r in self.ranks:
            sm = self.summary(r, step)
            o = sm.origin if sm is not None else None
            out[r] = NonFinite(r, o[0], o[1], step, o[2]) if o is not None else None
        return out

    def compare_ranks(self, a: int, b: int, step: int | None = None, **options: Any) -> Any:
        """Rank ``a`` (target) against rank ``b`` (golden) in ``step`` (default: the first step both have),
        node by node: a :class:`~nbdebug.compare.result.CompareResult` (``.panel()`` shows it).
        ``options`` go to :func:`nbdebug.compare.run.compare` (``mode``, ``atol``, ``rtol``...)."""
        from ..compare.run import compare

        return compare(self.source(a), self.source(b), step=step, golden_step=step, **options)

    def compare_panel(self, a: int, b: int, step: int | None = None, **options: Any) -> Any:
        """:meth:`compare_ranks` in the compare panel, its sides labelled by rank."""
        from ..ui.compare_panel import ComparePanel

        return ComparePanel(self.compare_ranks(a, b, step, **options), labels=(f"rank {a}", f"rank {b}"))

    # -- control (every rank at a step boundary) ---------------------------------------------------
    def _live(self) -> dict[int, SourceView]:
        return {r: v for r, v in self._views.items() if v.live and v.state in ("running", "paused")}

    def pause(self) -> int | None:
        """Every rank pauses after the same step: the one the furthest rank is in, or has finished when paused
        (a rank paused at an earlier boundary is resumed up to it). Returns that step (None when no rank
        runs)."""
        if self.control is not None:
            return self.control.pause_all()
        live = self._live().values()
        if not any(v.state == "running" for v in live):
            return None
        with self._lock:
            return self._align(max(_boundary(v) for v in live))

    def cont(self, steps: int | None = None) -> int | None:
        """Resume every rank: until a hit or the end (None), or ``steps`` more steps — every rank then
        pauses after the same step, which is returned."""
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ValueError(f"steps must be a positive int or None, got {steps!r}")
        self._odd_pausing = False  # a later odd rank pauses the job again
        if self.control is not None:
            self.control.cont_all(steps)
            return None
        live = self._live()
        if steps is not None:
            with self._lock:
                return self._align(max(v.running_step for v in live.values()) + steps - 1) if live else None
        with self._lock:
            for view in live.values():
                _pause_after(view, None)
                if view.state == "paused":
                    view.command("cont")
        return None

    def _align(self, target: int) -> int:
        """Ask every live rank to pause after step ``target``, resuming those paused before it; when a rank
        is found past ``target`` (it finished the step between the reading and the request), the target
        moves to its step and the request is made again."""
        for _ in range(16):
            for view in self._live().values():
                if view.state == "paused" and view.running_step <= target:
                    _pause_after(view, target, resume=True)
                elif view.state == "running":
                    _pause_after(view, target)
            late = self._past(target)
            if not late:
                break
            target = max(late)
        return target

    def _past(self, target: int) -> list[int]:
        """The running steps of running ranks past ``target``. A rank whose step counter already reads
        ``target + 1`` may still be at the end of ``target``, about to pause there: it gets
        :data:`SETTLE_S` seconds to do so before it counts as past."""
        end = time.monotonic() + SETTLE_S
        while True:
            late = [v.running_step for v in self._live().values() if v.state == "running" and v.running_step > target]
            if not late or max(late) > target + 1 or time.monotonic() >= end:  # none, or one surely past
                return late
            time.sleep(0.005)

    def wait(self, timeout: float | None = None) -> dict[Any, str]:
        """Block until no rank runs and the paused ones stand at one step boundary (a hit paused one rank and
        the others were lined up with it, or a pause / step of the job is done), or ``timeout`` seconds;
        returns ``{rank: state}``. A listener's job (``control``) first waits for its ranks to join: one at
        least, and as many as the world size a rank announced."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            views = [v for v in self._views.values() if v.live]
            paused = {v.running_step for v in views if v.state == "paused"}
            unsettled = ("running", "idle", "connecting")  # connecting: its state is on the way
            if self._joined() and not any(v.state in unsettled for v in views) and len(paused) <= 1:
                break
            if end is not None and time.monotonic() >= end:
                break
            time.sleep(0.02)
        return {r: v.state for r, v in self._views.items()}

    def _joined(self) -> bool:
        """Whether the ranks a listener's job expects have joined (any other job has all its ranks)."""
        if self.control is None:
            return True
        sizes = [w for src in self._sources.values()
                 if isinstance(w := (getattr(src, "remote_info", None) or {}).get("world_size"), int)]
        return bool(self._sources) and len(self._sources) >= max(sizes, default=0)

    def terminate(self) -> None:
        """End training on every rank (cleanly when they are paused at the same boundary; a running rank
        unwinds at its next node, and peers waiting for it in a collective fail at the process group's
        timeout)."""
        if self.control is not None:
            self.control.terminate_all()
            return
        for view in self._live().values():
            view.command("terminate")

    def run_to(self, node: str) -> None:
        """Single-rank jobs only: resume and pause right after ``node``."""
        self._single("run_to").command("run_to", node)

    def next_node(self) -> None:
        """Single-rank jobs only: execute one more node, then pause."""
        self._single("next_node").command("next_node")

    def _single(self, what: str) -> SourceView:
        live = [v for v in self._views.values() if v.live]
        if len(self._views) != 1 or len(live) != 1:
            raise RuntimeError(
                f"{what}: node-level control needs a single-rank job (this one has {len(self._views)} ranks): "
                f"a rank paused inside a step alone would leave the others waiting in their next collective; "
                f"use pause() / cont(steps) / terminate(), which act on every rank at a step boundary")
        return live[0]

    def _rank_state(self, rank: int) -> None:
        """A rank paused at a step boundary on its own (a watchpoint hit): line the others up with it — on
        another thread, as this runs inside the pausing rank's state change."""
        view = self._views[rank]
        if view.state != "paused" or view.current_node is not None or view.running_step < 1:
            return  # running, paused inside a step, or waiting before the first node
        threading.Thread(target=self._line_up, name="nbdebug-job-sync", daemon=True).start()

    def _line_up(self) -> None:
        with self._lock:  # (the job may have gone on since the pause that asked for this)
            stopped = [v for v in self._live().values() if v.state == "paused" and v.current_node is None]
            if stopped:
                self._align(max(_boundary(v) for v in stopped))

    # -- display ----------------------------------------------------------------------------------
    def panel(self) -> Any:
        """The job's panel: a rank selector over the usual panel, the first non-finite rank, the per-rank
        overview and a rank-vs-rank compare."""
        from ..ui.job_panel import JobPanel

        return JobPanel(self)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel())

    def close(self) -> None:
        """Stop following the ranks' events (the sources stay open)."""
        for off in self._subs:
            off()
        self._subs = []

    def __repr__(self) -> str:
        first = self.first_nonfinite()
        return (f"<nbdebug.Job ranks {self.ranks}, steps {len(self.steps)}, hits {self.hit_counts()}, "
                f"first non-finite: {first or 'none'}>")


def rank_order(rank: Any) -> tuple[int, int, str]:
    """Sort key of a job's keys: ranks ascending, then ``"host:pid"`` keys of processes without a rank."""
    return (0, rank, "") if isinstance(rank, int) else (1, 0, str(rank))


def _check_rank(rank: Any) -> None:
    if isinstance(rank, str) and ":" in rank:
        return
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"ranks are ints >= 0 (or 'host:pid' for a process outside a distributed job), "
                         f"got {rank!r}")


def _any_nonfinite(table: Any) -> bool:
    v = table.values
    return bool(len(table)) and bool(np.nansum(v[:, [COL["nan_count"], COL["pos_inf_count"], COL["neg_inf_count"]]]) > 0
                                    or not np.isfinite(v[:, [COL["max"], COL["min"]]]).all())


def _monitor_level(src: Any) -> bool:
    """A rank at the monitor level (no statistics tables: its steps are its monitor's rows)."""
    return getattr(src, "level", None) == "monitor" and getattr(src.session, "monitor", None) is not None


def _computed_forward(node: Any) -> bool:
    return node is not None and node.section == "forward" and node.kind in ("op", "module")


def _backward(node: Any) -> bool:
    return node is not None and node.section == "backward"


def _origin(src: Any, step: int) -> tuple[str, str, int] | None:
    fn = getattr(src, "first_nonfinite", None)
    if fn is not None:
        return fn(step)
    return as_source(src).first_nonfinite(step)


def _boundary(view: SourceView) -> int:
    """The first step boundary ``view`` can pause at: the step it runs, or the one it paused after."""
    return view.running_step - int(view.state == "paused" and view.current_node is None)


def _pause_after(view: SourceView, step: int | None, resume: bool = False) -> None:
    """``view`` pauses after ``step`` (None: forget a pending boundary), resumed first when ``resume``; a
    source without ``pause_after`` gets the equivalent step count."""
    if hasattr(view.obj, "pause_after"):
        view.command("pause_after", step)
        if resume:
            view.command("cont")
    elif step is not None:
        view.command("cont", max(1, step - view.running_step + 1))
