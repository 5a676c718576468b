"""ODD_RANK: one rank's value far from the other ranks' median at the same step (MAD-scaled), for a :class:`Job`.

``job.watch("ODD_RANK", field="norm", z=6)`` makes the watchpoint on every rank (it is listed there, in the
same registry and hit list as the others) and an :class:`OddRankWatch` in the job that evaluates a step once
every rank has finished it: the ranks' values of each selected series (:mod:`nbdebug.watch.series`) as one
ranks × series matrix, :func:`~nbdebug.watch.temporal.rank_outliers`. A hit is a record in the odd rank's hit
list (its ``advice`` gives the other ranks' median and the value) and, when ranks run live, pauses the job.
Ranks whose session is in this process are read directly; a remote rank's series are not sent over the wire
yet (such ranks are left out of the comparison).

>>> import numpy as np
>>> from nbdebug.session.session import Session
>>> from nbdebug.session.monitor import Monitor
>>> from nbdebug.offline import OfflineSession
>>> from nbdebug.job.job import Job
>>> sessions = [Session(framework="none", live=False) for _ in range(4)]
>>> for r, s in enumerate(sessions):
...     s.monitor = Monitor()
...     s.monitor.record(0, [("Run", "loss")], np.array([2.0 + 0.01 * r if r != 2 else 2e3]))
>>> job = Job({r: OfflineSession(s) for r, s in enumerate(sessions)})
>>> _ = job.watch("ODD_RANK", "Run", field="loss")
>>> [(rank, h.step, h.node, h.slot) for rank, h in job.odd_rank.check(0)]
[(2, 0, 'Run', 'loss')]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..watch.firing import Hit
from ..watch.series import SeriesReader
from ..watch.temporal import ADVICE, rank_outliers


class OddRankWatch:
    """The job's ODD_RANK watchpoints: ``{rank: Watchpoint}`` per watch, evaluated step by step."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.watches: list[dict[Any, Any]] = []
        self._readers: dict[int, SeriesReader] = {}
        self.done = -1  # the last step evaluated

    def add(self, wps: dict[Any, Any]) -> None:
        self.watches.append(wps)

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
        out: list[tuple[Any, Any]] = []
        while True:
            step = self.done + 1
            if not all(r is not None and r.has_step(self._field(), step)
                       for r in (self._reader(k) for k in self.job.ranks)):
                return out
            out.extend(self.check(step))
            self.done = step

    def _field(self) -> str:
        return next(iter(self.watches[0].values())).params["field"]

    def check(self, step: int) -> list[tuple[Any, Any]]:
        """ODD_RANK at ``step``: ``[(rank, hit)]``, each hit also added to that rank's hit list."""
        from ..watch.watchpoints import HitRecord

        ranks = [r for r in self.job.ranks if self._reader(r) is not None]
        out: list[tuple[Any, Any]] = []
        for wps in self.watches:
            first = wps.get(ranks[0]) if ranks else None
            if first is None or not first.enabled:
                continue
            field, z = first.params["field"], first.params["z"]
            keys = self._reader(ranks[0]).keys(first, field, step)
            if not keys:
                continue
            values = np.stack([self._reader(r).values(step, field, keys) for r in ranks])
            fired, zs, med = rank_outliers(values, z)
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
