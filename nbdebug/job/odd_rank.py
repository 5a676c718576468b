"""ODD_RANK: one rank's value far from the other ranks' median at the same step (MAD-scaled), for a :class:`Job`.

``job.watch("ODD_RANK", field="norm", z=6)`` makes the watchpoint on every rank (it is listed there, in the
same registry and hit list as the others) and an :class:`OddRankWatch` in the job that evaluates a step once
every rank has finished it: the ranks' values of each selected series (:mod:`nbdebug.watch.series`) as one
ranks × series matrix, :func:`~nbdebug.watch.temporal.rank_outliers`. A hit is a record in the odd rank's hit
list (its ``advice`` gives the other ranks' median and the value) and, when ranks run live, pauses the job.
Ranks whose session is in this process are read directly; a remote rank's (a listener's process) from its
mirror session, which gets each step's statistics table and monitor row over the wire
(:mod:`nbdebug.remote.monitor_wire`). A step is evaluated once every rank has gone past it, over the ranks that
have a value there (at least 3). The MAD that scales ``|z|`` is never below the median of the series' MADs
over the previous :data:`POOL` steps (a few ranks' MAD alone is often tiny by chance), and a series is judged
once :data:`WARM_UP` previous steps gave it a MAD.

>>> import numpy as np
>>> from nbdebug.session.session import Session
>>> from nbdebug.session.monitor import Monitor
>>> from nbdebug.offline import OfflineSession
>>> from nbdebug.job.job import Job
>>> sessions = [Session(framework="none", live=False) for _ in range(4)]
>>> for r, s in enumerate(sessions):
...     s.monitor = Monitor()
...     for step in range(5):
...         s.monitor.record(step, [("Run", "loss")], np.array([2.0 + 0.01 * r if (r, step) != (2, 4) else 2e3]))
>>> job = Job({r: OfflineSession(s) for r, s in enumerate(sessions)})
>>> _ = job.watch("ODD_RANK", "Run", field="loss")
>>> [(rank, h.step, h.node, h.slot) for rank, h in job.odd_rank.on_step()]
[(2, 4, 'Run', 'loss')]
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from ..watch.firing import Hit
from ..watch.series import SeriesReader, is_monitor_field
from ..watch.temporal import ADVICE, rank_outliers

#: steps whose across-rank MADs set a series' scale floor, and how many a series needs before it is judged
POOL, WARM_UP = 20, 3


class _Pool:
    """One watch's per-series ring of across-rank MADs over the previous :data:`POOL` steps."""

    def __init__(self) -> None:
        self.col: dict[Any, int] = {}
        self.buf = np.full((POOL, 0), np.nan)
        self.pos = 0

    def columns(self, keys: list[Any]) -> np.ndarray:
        new = [k for k in keys if k not in self.col]
        for k in new:
            self.col[k] = len(self.col)
        if new:
            self.buf = np.concatenate([self.buf, np.full((POOL, len(new)), np.nan)], axis=1)
        return np.fromiter((self.col[k] for k in keys), np.int64, len(keys))

    def floor(self, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The median of the kept MADs per series, and how many there are."""
        past = self.buf[:, cols]
        n = (~np.isnan(past)).sum(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return np.nanmedian(past, axis=0), n

    def push(self, cols: np.ndarray, mad: np.ndarray) -> None:
        row = np.full(self.buf.shape[1], np.nan)
        row[cols] = mad
        self.buf[self.pos] = row
        self.pos = (self.pos + 1) % POOL


class OddRankWatch:
    """The job's ODD_RANK watchpoints: ``{rank: Watchpoint}`` per watch, evaluated step by step."""

    def __init__(self, job: Any) -> None:
        self.job = job
        #: per watch, ``{rank: Watchpoint}``: the ranks' watchpoints (a rank that joined later is added when its
        #: watchpoint is found among its own, :meth:`watchpoint`)
        self.watches: list[dict[Any, Any]] = []
        self._specs: list[tuple[Any, dict[str, Any]]] = []  # per watch, the ``nodes`` and params it was set with
        self._pools: list[_Pool] = []
        self._readers: dict[int, SeriesReader] = {}
        self.done = -1  # the last step evaluated

    def add(self, wps: dict[Any, Any], nodes: Any = None, params: dict[str, Any] | None = None) -> None:
        """A new ODD_RANK watch: the ranks' watchpoints, and what it was set with (``job.watch``'s ``nodes`` and
        params), by which a rank that joins later has its own watchpoint found."""
        self.watches.append(dict(wps))
        self._specs.append((nodes, dict(params or {})))
        self._pools.append(_Pool())

    def clear(self) -> None:
        """Forget every watch (``Job.unwatch``); the hits they made stay in the ranks' hit lists."""
        self.watches, self._specs, self._pools = [], [], []

    def watchpoint(self, i: int, rank: Any) -> Any:
        """Watch ``i``'s watchpoint on ``rank``: the one it was made with, or — a rank that joined after
        ``job.watch`` (it got the watchpoint on joining: ``Job.add``, a listener's welcome) — its own ODD_RANK
        watchpoint with the same nodes and params, found then kept; None when it has none (yet)."""
        wps = self.watches[i]
        if rank not in self.job.ranks:
            return wps.get(rank)
        own = getattr(getattr(self.job.source(rank), "watchpoints", None), "watchpoints", None)
        if own is None:
            return wps.get(rank)
        wp = wps.get(rank)
        if wp is not None and own.get(wp.id) is wp:
            return wp
        wps.pop(rank, None)  # gone from the rank (removed there, or a new process of that rank): look again
        nodes, params = self._specs[i]
        taken = {id(w.get(rank)) for w in self.watches}
        for cand in list(own.values()):
            if id(cand) not in taken and _same_watch(cand, nodes, params):
                wps[rank] = cand
                return cand
        return None

    def _reader(self, rank: Any) -> SeriesReader | None:
        session = getattr(self.job.source(rank), "session", None)
        if session is None or not hasattr(session, "steps"):
            return None
        r = self._readers.get(rank)
        if r is None or r.session is not session:
            r = self._readers[rank] = SeriesReader(session)
        return r

    def on_step(self) -> list[tuple[Any, Any]]:
        """Evaluate every step all ranks have finished since the last one; returns ``[(rank, hit)]``."""
        if not self.watches:
            return []
        readers = [self._reader(k) for k in self.job.ranks]
        if not readers or any(r is None for r in readers):
            return []
        for i in range(len(self.watches)):
            for rank in self.job.ranks:
                self.watchpoint(i, rank)  # ranks that joined since: their own watchpoints
        fields = {wp.params["field"] for wps in self.watches for wp in wps.values()}
        if not fields:
            return []
        upto = min(_latest(r, f) for r in readers for f in fields)
        out: list[tuple[Any, Any]] = []
        while self.done < upto:
            step = self.done + 1
            out.extend(self.check(step))
            self.done = step
        return out

    def check(self, step: int) -> list[tuple[Any, Any]]:
        """ODD_RANK at ``step``: ``[(rank, hit)]``, each hit also added to that rank's hit list."""
        from ..watch.watchpoints import HitRecord

        out: list[tuple[Any, Any]] = []
        for i, (wps, pool) in enumerate(zip(self.watches, self._pools, strict=True)):
            for rank in self.job.ranks:
                self.watchpoint(i, rank)
            if not wps:
                continue
            field = next(iter(wps.values())).params["field"]
            ranks = [r for r in self.job.ranks if (rd := self._reader(r)) is not None and rd.has_step(field, step)]
            first = next((wps[r] for r in ranks if r in wps), None)
            if first is None or not first.enabled:
                continue
            z = first.params["z"]
            keys = self._reader(ranks[0]).keys(first, field, step)
            if not keys:
                continue
            values = np.stack([self._reader(r).values(step, field, keys) for r in ranks])
            cols = pool.columns(keys)
            floor, seen = pool.floor(cols)
            fired, zs, med = rank_outliers(values, z, floor * _mad_small(len(ranks)))
            fired &= seen >= WARM_UP
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                pool.push(cols, np.nanmedian(np.abs(values - med), axis=0))
            for i, j in np.argwhere(fired).tolist():
                rank, (name, slot) = ranks[i], keys[j]
                wp = wps.get(rank)
                if wp is None:
                    continue
                text = (f"rank {rank}: value {values[i, j]:.4g} against the ranks' median {med[j]:.4g} "
                        f"(|z| {zs[i, j]:.3g}, MAD-scaled, over {len(ranks)} ranks). {ADVICE['ODD_RANK']}")
                node = getattr(self.job.source(rank).session.graph, "nodes", {}).get(name)
                h = HitRecord(wp.id, "ODD_RANK", name, slot, step, node.order if node is not None else 1 << 30,
                              (Hit("z", float(z), float(zs[i, j])),), None, (), text)
                src = self.job.source(rank)
                src.watchpoints.hits.append(h)
                hub = getattr(src, "hub", None)
                if hub is not None:
                    hub.emit("hit", h)
                out.append((rank, h))
        return out


def _same_watch(wp: Any, nodes: Any, params: dict[str, Any]) -> bool:
    """Whether ``wp`` is an ODD_RANK watchpoint set with ``nodes`` and ``params`` (numbers compared as floats: a
    remote rank's come back through JSON)."""
    if getattr(wp, "condition", None) != "ODD_RANK":
        return False
    want = None if nodes is None else ([nodes] if isinstance(nodes, str) else list(nodes))
    if (None if wp.nodes is None else list(wp.nodes)) != want:
        return False
    for key, value in params.items():
        have = wp.params.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and isinstance(have, (int, float)):
            if float(have) != float(value):
                return False
        elif key != "target" and have != value:
            return False
    return True


def _mad_small(n: int) -> float:
    """Croux & Rousseeuw's small-sample factor of the MAD of ``n`` values (1.4826 × MAD is unbiased only for
    many): a floor pooled over 4 ranks' MADs is otherwise ~25% low.

    >>> _mad_small(4), round(_mad_small(100), 3)
    (1.363, 1.008)
    """
    table = {2: 1.196, 3: 1.495, 4: 1.363, 5: 1.206, 6: 1.2, 7: 1.14, 8: 1.129, 9: 1.107}
    return table.get(n, n / (n - 0.8) if n > 9 else 1.0)


def _latest(reader: SeriesReader, field: str) -> int:
    """The last finished step ``reader``'s session has values of ``field`` for (-1: none yet)."""
    if is_monitor_field(field):
        mon = reader.monitor
        return -1 if mon is None or mon.last_step is None else int(mon.last_step)
    steps = reader.session.steps
    steps = list(steps)  # a live session adds steps meanwhile
    return max(steps) if steps else -1
