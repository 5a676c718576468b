"""Offline sessions: a loaded dump, readable by every panel, watchpoint and recheck.

``nbdebug.load(path)`` returns an :class:`OfflineSession`. It has the reading side of a live
:class:`~nbdebug.Debugger` — ``graph``, ``session`` (``live`` is False), ``watchpoints``, ``hits``,
``watch()``, ``update_watch()``, ``unwatch()``, ``recheck()``, ``stats()``, ``tensor()``,
``first_nonfinite()`` — and no training control.

Statistics of a dump
--------------------
msProbe dumps record ``Max``, ``Min``, ``Mean`` and ``Norm`` per tensor. The other fields of
:data:`~nbdebug.session.stats.FIELDS` are filled as follows (see :class:`DumpSession`):

* with the tensor's file (tensor task) and ``exact`` loading: computed from the values — exact;
* otherwise inferred where the four statistics decide them — ``abs_mean`` is ``mean`` when
  ``min >= 0`` (``-mean`` when ``max <= 0``); a tensor with finite ``Max`` and ``Min`` has no NaN/Inf
  (max/min propagate NaN), so its NaN/Inf counts are exactly 0; ``Max``/``Min`` of NaN means at least one
  NaN (count 1, flagged *estimated*), ``Max = +Inf`` at least one +Inf (likewise ``-Inf``); all-zero
  tensors (``Max = Min = 0``) have ``zero_count = count``;
* anything else is unknown: NaN in the table, ``None`` in :meth:`OfflineSession.stats` (listed under
  ``"unknown"``; lower bounds are listed under ``"estimated"``).

So TO/WO/GE/OO fire on NaN/Inf ``Max``/``Min`` as they would live; threshold checks on an unknown
statistic never fire (the watch conditions skip NaN statistics of rows without NaN/Inf).

>>> from nbdebug.session.stats import FIELDS
>>> s = DumpSession(framework="pytorch")
>>> s.graph.add_node("Functional.relu.0.forward", kind="op", op_type="relu").shapes["output.0"] = (2,)
>>> _ = s.add_step(0, [("Functional.relu.0.forward", "output.0")], ["float32"], [(2,)],
...                np.array([[1.0, 0.0, 0.5, 0.5, 0.7, np.nan, 0, 0, 0, 2]]))
>>> off = OfflineSession(s)
>>> off.stats("Functional.relu.0.forward", "output.0")["zero_count"] is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .features import PanelOwner, feature
from .session.dump_session import MAX_PT_BYTES, DumpProblem, DumpSession, TensorFile
from .session.dump_session import read_tensor_file as read_file_with
from .session.graph import Graph
from .session.session import Session
from .watch.reader import Reader
from .watch.watchpoints import WatchManager

__all__ = ["MAX_PT_BYTES", "DumpProblem", "DumpSession", "OfflineSession", "TensorFile", "read_tensor_file",
           "read_framework_file"]


def read_framework_file(path: str) -> np.ndarray:
    """A framework's tensor file (``.pt``) as numpy, by the backend owning its extension."""
    from .frameworks.registry import backends

    for b in backends():
        if path.endswith(b.tensor_file_suffixes):
            return b.read_tensor_file(path)
    raise ValueError(f"{path}: no framework reads this kind of tensor file")


def read_tensor_file(tf: TensorFile) -> np.ndarray:
    """Read ``tf`` (``.npy`` memory-mapped, ``.pt`` via torch); ``ValueError`` naming the file on a bad or
    mismatching file."""
    return read_file_with(tf, read_framework_file)


def _api_parameters(framework: str) -> Callable[[str], Any] | None:
    """The framework backend's parameter names of an op node (live slot names of keyword arguments)."""
    from .frameworks.registry import find_backend

    b = find_backend(framework) if framework else None
    return b.api_parameters if b is not None else None


class OfflineSession(Reader, PanelOwner):
    """A dump loaded for analysis: graph, per-step statistics, tensors on demand, watchpoints and hits.

    Its reading and watchpoint methods are :class:`~nbdebug.watch.reader.Reader`'s, as a live Debugger's.
    Watchpoints are evaluated on every step of the dump as soon as they are created or changed
    (``auto_check``); :meth:`recheck` evaluates them again (``step=None``: every step).
    Example (with dumps on disk)::

        import nbdebug
        off = nbdebug.load("dumps/step0")
        off.watch("TO"); off.hits
    """

    def __init__(self, session: Session, *, path: str = "", layout: str = "", meta: Mapping[str, Any] | None = None,
                 auto_check: bool = True) -> None:
        from .control.events import EventHub

        self.session = session
        self.path = path
        self.layout = layout
        self.meta = dict(meta or {})
        self.auto_check = auto_check
        self.watchpoints = WatchManager(session)
        self.hub = EventHub()
        self.closed = False
        #: ``rank label -> OfflineSession`` loader of the dump's other ranks (set by ``nbdebug.load``)
        self.rank_loader: Callable[[str], OfflineSession] | None = None
        self._rank_sessions: dict[int, OfflineSession] = {}
        self._job: Any = None
        if isinstance(session, DumpSession) and session.api_parameters is None:  # live slot names as aliases
            session.api_parameters = _api_parameters(session.framework)

    # -- what was loaded ----------------------------------------------------------------------------
    @property
    def graph(self) -> Graph:
        return self.session.graph

    @property
    def problems(self) -> list[DumpProblem]:
        """Everything that could not be loaded as is, each naming its file."""
        return getattr(self.session, "problems", [])

    @property
    def steps(self) -> list[int]:
        """The steps of the dump, ascending."""
        return sorted(self.session.steps)

    @property
    def ranks(self) -> list[int]:
        """The ranks of a multi-rank dump (its ``rank{R}`` folders), ascending; [] when it names none."""
        labels = self.meta.get("ranks") or []
        return sorted(int(lb[4:]) for lb in labels if str(lb).startswith("rank") and lb[4:].isdigit())

    def rank(self, rank: int) -> OfflineSession:
        """The same dump's rank ``rank``, loaded once (this session for its own rank)."""
        if rank not in self.ranks:
            raise KeyError(f"no rank {rank} in {self.path or 'this dump'}; ranks: {self.ranks}")
        if self.meta.get("rank") == f"rank{rank}":
            return self
        if rank not in self._rank_sessions:
            if self.rank_loader is None:
                raise RuntimeError("this session was not loaded by nbdebug.load; it cannot load other ranks")
            self._rank_sessions[rank] = self.rank_loader(f"rank{rank}")
        return self._rank_sessions[rank]

    @property
    def job(self) -> Any:
        """Every rank of the dump as one :class:`~nbdebug.job.Job` (first non-finite rank, per-rank hits and
        summaries, rank-vs-rank compare, the job panel); a dump without ranks is a job of rank 0."""
        Job = feature("job")  # noqa: N806 - a class
        if self._job is None:
            ranks = self.ranks or [0]
            self._job = Job({r: self.rank(r) if self.ranks else self for r in ranks})
        return self._job

    @property
    def step_index(self) -> int:
        """A dump has no step in progress (what ``step_index`` means on a live session): the step ``"current"``
        means is :attr:`current_step`. Reading it raises ``AttributeError`` saying so."""
        raise AttributeError("an offline session has no step in progress (step_index); the step 'current' "
                             "means is current_step, the steps it holds are steps")

    def slot_names(self, node: str, slot: str) -> tuple[str, ...]:
        """The names ``node``'s slot answers to here: the dump's (msProbe's layout, shown in tables, hits and
        compares) first, then the live session's name of the same tensor, which every reading method
        accepts too (``input.weight`` for the dump's ``input.2`` of ``F.layer_norm``)."""
        s = self.session
        return s.slot_names(node, slot) if isinstance(s, DumpSession) else (slot,)

    @property
    def live(self) -> bool:
        return False

    def goto(self, step: int) -> None:
        """Make ``step`` the "current" one (``"previous"`` is the step before it)."""
        if step not in self.session.steps:
            raise KeyError(f"no step {step} in this dump; steps: {self.steps}")
        self.session.goto(step)
        self.hub.emit("step", step)

    # -- Reader hooks -------------------------------------------------------------------------------
    def _watch_changed(self) -> None:
        if self.auto_check:
            self.recheck()

    def _default_recheck_steps(self) -> list[int]:
        return self.steps

    def on(self, event: str, callback: Callable[[Any], Any]) -> Any:
        """Subscribe to ``hit`` and ``step`` (from :meth:`goto`) events; returns a
        :class:`~nbdebug.session.handle.Handle` (``.remove()``, ``with``, or called)."""
        return self.hub.on(event, callback)

    def close(self) -> None:
        """Drop cached tensor values."""
        self.closed = True
        cache = getattr(self.session, "_cache", None)
        if cache is not None:
            cache.clear()

    def summary(self) -> str:
        s = self.session
        rows = sum(len(t) for t in s.steps.values())
        files = sum(len(f) for f in getattr(s, "files", {}).values())
        text = (f"{self.layout or 'dump'} {self.path}: framework {s.framework or '?'}, steps {self.steps}, "
                f"{len(self.graph)} nodes, {rows} tensors ({files} with values)")
        if self.problems:
            text += f", {len(self.problems)} problem(s)"
        return text

    def __repr__(self) -> str:
        return f"<nbdebug.OfflineSession {self.summary()}>"
