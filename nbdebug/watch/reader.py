"""The reading surface every session owner shares: statistics, tensors, watchpoints, hits, overflow origin.

:class:`Reader` is mixed into :class:`nbdebug.Debugger` (live), :class:`nbdebug.offline.OfflineSession`
(a loaded dump) and the panel's :class:`~nbdebug.ui.source.SessionSource` (a bare session). An owner sets
``self.session`` and ``self.watchpoints``; it may override the hooks :meth:`_watch_changed` (what to do
once the watchpoint set changed), :meth:`_default_recheck_steps` and :meth:`_emit` (hits as events).

>>> from nbdebug.session.session import Session
>>> from nbdebug.watch.watchpoints import WatchManager
>>> class Bare(Reader):
...     def __init__(self, session):
...         self.session, self.watchpoints = session, WatchManager(session)
>>> r = Bare(Session(framework="numpy", live=False))
>>> r.watch("TO").condition, r.current_step, r.recheck(), r.first_nonfinite()
('TO', -1, [], None)
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from ..session.steps import current_step, resolve_step
from ..session.store import NotRetainedError
from .nonfinite import first_nonfinite
from .registry import TEMPORAL
from .watchpoints import HitRecord, Watchpoint, resolve_nodes


def hit_order(h: HitRecord) -> tuple:
    """Hits sort by step, then execution order within the step."""
    return (h.step, h.order, h.node, h.slot, h.watchpoint)


class SortedHits:
    """Hit records in :func:`hit_order`, sorted again only when the records given are not the very same
    objects, in the same order, as last time (records are frozen; a changed one is a new object). Each call
    returns a new list (a caller may change it).

    >>> from nbdebug.watch.watchpoints import HitRecord
    >>> a, b = (HitRecord(1, "TO", n, "output.0", s, 0, (), None, (), "") for n, s in (("x", 2), ("y", 1)))
    >>> by_order = SortedHits()
    >>> [h.node for h in by_order([a, b])], by_order([a, b]) is not by_order([a, b]), by_order([a])[0] is a
    (['y', 'x'], True, True)
    >>> c = HitRecord(1, "TO", "z", "output.0", 0, 0, (), None, (), "")  # as many records, one of them new
    >>> [h.node for h in by_order([a])], [h.node for h in by_order([c])]
    (['x'], ['z'])
    """

    def __init__(self) -> None:
        self._last: tuple[list[HitRecord], list[HitRecord]] = ([], [])

    def __call__(self, hits: Iterable[HitRecord]) -> list[HitRecord]:
        given = list(hits)  # one snapshot: the training thread may append meanwhile
        last, ordered = self._last
        if len(given) != len(last) or not all(map(operator.is_, given, last)):
            ordered = sorted(given, key=hit_order)
            self._last = (given, ordered)
        return list(ordered)


class Reader:
    """Reading and watchpoint methods over ``self.session`` and ``self.watchpoints``."""

    session: Any
    watchpoints: Any
    #: node globs whose non-finite values are intended (``first_nonfinite`` skips them)
    benign_nonfinite: tuple[str, ...] = ()

    # -- hooks ------------------------------------------------------------------------------------
    def _watch_changed(self) -> None:
        """The watchpoint set changed (created, updated or deleted)."""

    def _default_recheck_steps(self) -> list[int]:
        step = self.current_step
        return [step] if step >= 0 else []

    def _emit(self, event: str, value: Any) -> None:
        hub = getattr(self, "hub", None)
        if hub is not None:
            hub.emit(event, value)

    # -- steps ------------------------------------------------------------------------------------
    @property
    def current_step(self) -> int:
        """The step ``"current"`` means (:func:`nbdebug.session.steps.current_step`): the one chosen with
        ``goto``, else the step in progress once it recorded something, else the last finished one; -1
        before any."""
        return current_step(self.session)

    def _step_index_of(self, step: int | str) -> int:
        return resolve_step(self.session, step)

    # -- reading ----------------------------------------------------------------------------------
    def stats(self, node: str, slot: str, step: int | str = "current", fields: Any = None) -> Mapping[str, Any]:
        """Statistics of one tensor: ``dtype, shape, count, max, min, mean, abs_mean, norm, zero_count,
        nan_count, pos_inf_count, neg_inf_count``; ``fields`` picks some."""
        return self.session.stats(node, slot, step, fields)

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        """The retained (or dumped) value as numpy; ``NotRetainedError`` (a ``LookupError``) says why when absent."""
        slot_of = getattr(self.session, "slot_of", None)  # a live or dump name of the slot (Session.slot_of)
        if slot_of is not None:
            slot = slot_of(node, slot)
        self._check_step_ran(node, slot, step)
        self._check_current_ran(node, slot, step)
        return self.session.tensor(node, slot, step)

    def _check_current_ran(self, node: str, slot: str, step: Any) -> None:
        """Inside a step, "current" of a tensor the step in progress has not computed yet is not the previous
        step's value under another name: said so (with the step number that reads the previous value)."""
        s = self.session
        rec = getattr(s, "recorder", None)
        if step != "current" or getattr(s, "chosen_step", None) is not None or rec is None or not len(rec) \
                or (node, slot) in rec.index or node not in s.graph.nodes:
            return
        raise NotRetainedError(f"{node} {slot}: not computed yet in step {s.step_index} (in progress); the value "
                               f"of step {s.step_index - 1}: tensor({node!r}, {slot!r}, {s.step_index - 1})")

    def _check_step_ran(self, node: str, slot: str, step: Any) -> None:
        """A step number that never ran (nor is in the dump) is said to be so, not "not retained"."""
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool) or step < 0:
            return
        s = self.session
        step = int(step)
        if step in s.steps or step in s.history or step in getattr(s, "skipped", {}) or \
                (step == s.step_index and len(s.recorder)):
            return
        when = "has not run yet" if step >= s.step_index else "has no record (neither statistics nor values)"
        raise NotRetainedError(f"{node} {slot}: step {step} {when}; steps with statistics: {s.step_range()}")

    # -- watchpoints ------------------------------------------------------------------------------
    def watch(self, condition: str, nodes: Any = None, **params: Any) -> Watchpoint:
        """Create a watchpoint: ``watch("GL", max_gt=1e3)``, ``watch("TO", nodes="Functional.*")``.

        ``nodes`` takes names, glob patterns or a list; None selects the condition's category (all
        weights / gradients / activations / nodes). Invalid parameters raise ``ValueError`` naming the
        parameter and its allowed range."""
        wp = self.watchpoints.watch(condition, nodes, **params)
        self._watch_changed()
        return wp

    def update_watch(self, wp: int | Watchpoint, **changes: Any) -> Watchpoint:
        """Change a watchpoint: ``add=``/``remove=`` nodes, ``enabled=``, ``nodes=``, or parameters."""
        w = self.watchpoints.update(wp, **changes)
        self._watch_changed()
        return w

    def unwatch(self, wp: int | Watchpoint | None = None) -> None:
        """Delete one watchpoint, or all of them (None)."""
        if wp is None:
            self.watchpoints.clear()
        else:
            self.watchpoints.delete(wp)

    def keep(self, nodes: Any, on: bool = True) -> frozenset[str]:
        """Keep the values of ``nodes`` (names or glob patterns, one or a list) from their next execution on:
        values not retained by default — the optimizer's in-place updates, values over the memory budget —
        become readable with :meth:`tensor`, inputs and parameters included. ``on=False`` stops keeping
        them. A glob must match a captured node (``ValueError``); a plain name may be captured later.
        Returns every kept node."""
        names = resolve_nodes(self.session.graph, nodes)
        kept = self.session.kept | names if on else self.session.kept - names
        self.session.keep_values(frozenset(kept))
        return self.session.kept

    def recommend(self) -> list[tuple[str, dict[str, Any], Any]]:
        """The recommended watchpoints for this model: (condition, parameters, target) triples."""
        return self.watchpoints.recommend()

    def watch_recommended(self) -> list[Watchpoint]:
        """Create the recommended watchpoints."""
        wps = [self.watchpoints.watch(c, target=t, **p) for c, p, t in self.recommend()]
        self._watch_changed()
        return wps

    @property
    def hits(self) -> list[HitRecord]:
        """Every hit so far, ordered by step, then execution order within the step."""
        by_order = self.__dict__.get("_hits_by_order")
        if by_order is None:  # the owners set no state of Reader's in their __init__
            by_order = self.__dict__.setdefault("_hits_by_order", SortedHits())
        return by_order(self.watchpoints.hits)

    def recheck(self, step: int | Iterable[int] | None = None) -> list[HitRecord]:
        """Evaluate the watchpoints again on ``step`` (an int or several; None: the default steps — the
        current one live, every step of a loaded dump) without advancing; returns the hits found."""
        if step is None:
            steps = self._default_recheck_steps()
        elif isinstance(step, (int, np.integer)):
            steps = [int(step)]
        else:
            steps = [int(s) for s in step]
        found: list[HitRecord] = []
        for s in steps:
            found.extend(self.watchpoints.check(s))
        if step is None and hasattr(self.watchpoints, "recheck_temporal"):  # over time: the whole kept history
            found = [h for h in found if h.condition not in TEMPORAL] + self.watchpoints.recheck_temporal()
        for h in found:
            self._emit("hit", h)
        return found

    # -- analysis ---------------------------------------------------------------------------------
    def first_nonfinite(self, step: int | str | None = "current", *, ignore: Iterable[str] | str = (),
                        benign: bool = True) -> tuple[str, str, int] | None:
        """Where NaN/Inf starts: ``(node, slot, step)`` of the earliest node (forward, then backward, then
        optimizer) whose inputs are finite and whose output is not, or None when the step is clean.

        A non-finite value that every consumer absorbs (an attention mask's ``-inf`` before a softmax,
        T5's ``log(0)`` cast to an integer) is *benign* and skipped (``benign=False`` reports it too);
        ``ignore`` (glob patterns, added to the owner's ``benign_nonfinite``) names nodes whose ±Inf is
        intended. ``step=None`` searches every step with statistics and returns the first origin. A value no
        recorded node made (a NaN weight in an L1 dump, which has no ``Parameter`` nodes) is reported as the
        input slot of the first op reading it."""
        patterns = [ignore] if isinstance(ignore, str) else list(ignore)
        patterns += list(self.benign_nonfinite)
        if step is None:
            for s in sorted(self.session.steps):
                found = first_nonfinite(self.session, s, ignore=patterns, benign=benign)
                if found is not None:
                    return found
            return None
        idx = self._step_index_of(step)
        if idx < 0:
            return None
        return first_nonfinite(self.session, idx, ignore=patterns, benign=benign)
