"""A replayed step: its own session with the reader surface and panel, and how it compares to the original.

:func:`compare` checks the replayed step against the statistics the live capture recorded for that step:
every ``(node, slot)`` present in both must have the same dtype, shape and the same bits in every
statistic; the step's returned loss must have the same bits too. The first difference (in the live
step's execution order) is reported with its likely reason; nothing is silently shown as the same run.

>>> import numpy as np
>>> from nbdebug.session.stats import StatsTable, FIELDS
>>> row = np.arange(len(FIELDS), dtype=float)
>>> a = StatsTable.from_rows([("n", "output.0")], ["float32"], [(2,)], row)
>>> b = StatsTable.from_rows([("n", "output.0")], ["float32"], [(2,)], row + (np.arange(len(FIELDS)) == 3))
>>> [m.field for m in compare(a, b)]
['abs_mean']
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..features import feature
from ..session.stats import FIELDS
from ..watch.reader import Reader
from ..watch.watchpoints import WatchManager


class ReplayMismatch(UserWarning):
    """A replayed step is not bitwise the original (``replayed.mismatches`` says where first and why)."""


class ReplayMismatchError(RuntimeError):
    """``replay(..., strict=True)`` of a step that did not come out bitwise identical."""


class ReplayRefused(RuntimeError):
    """The step cannot be replayed (not kept, unreplayable arguments, training running): the reason says."""


@dataclass(frozen=True)
class Mismatch:
    """One value of the replay that differs from the original: ``node``/``slot`` (``"loss"`` for the
    step's returned loss), the statistic ``field``, both values."""

    node: str
    slot: str
    field: str
    original: Any
    replayed: Any

    def __str__(self) -> str:
        return f"{self.node} {self.slot} {self.field}: original {self.original!r}, replayed {self.replayed!r}"


def comparable(live: Any, replayed: Any, skip: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """``(row in live, row in replayed)`` of the keys both tables hold, in ``live``'s order, except nodes
    whose names start with one of ``skip`` and slots both tables hold no statistics of (``unsupported``: e.g.
    outputs MindSpore's CPU BatchNorm never writes, whose rows measure their memory's previous contents)."""
    out = []
    gone, gone_too = getattr(live, "unsupported", {}), getattr(replayed, "unsupported", {})
    for i, key in enumerate(live.keys):
        j = replayed.index.get(key)
        if j is not None and not key[0].startswith(skip or ("\0",)) and not (i in gone and j in gone_too):
            out.append((i, j))
    return out


def compare(live: Any, replayed: Any, skip: tuple[str, ...] = ()) -> list[Mismatch]:
    """Differences between two steps' statistics tables over the keys both hold, in ``live``'s order
    (nodes named with a prefix in ``skip`` left out)."""
    out = []
    for i, j in comparable(live, replayed, skip):
        key = live.keys[i]
        if live.dtypes[i] != replayed.dtypes[j]:
            out.append(Mismatch(*key, "dtype", live.dtypes[i], replayed.dtypes[j]))
            continue
        if tuple(live.shapes[i]) != tuple(replayed.shapes[j]):
            out.append(Mismatch(*key, "shape", tuple(live.shapes[i]), tuple(replayed.shapes[j])))
            continue
        a, b = live.values[i], replayed.values[j]
        differ = np.flatnonzero(a.view(np.int64) != b.view(np.int64))
        if differ.size:
            k = int(differ[0])
            out.append(Mismatch(*key, FIELDS[k], float(a[k]), float(b[k])))
    return out


#: why a replay may not be bitwise, when nothing more specific is known
GENERIC_REASONS = (
    "something the step depends on is not in the kept state: a torch.Generator the step function does not "
    "reach through its closure or globals (one a module holds), randomness outside Python's random, NumPy's and "
    "torch's global generators, "
    "Python state the step changes (a counter, a cache, an iterator read inside the step instead of a batch "
    "passed as an argument), or nondeterministic kernels (torch.use_deterministic_algorithms(False) on a GPU)")


def reason_for(first: Mismatch, notes: list[str], graph: Any, generic: str | None = None) -> str:
    """The likely reason of the first difference (``generic``: the framework's wording of the last resort)."""
    if notes:
        return "; ".join(notes)
    node = graph.nodes.get(first.node) if graph is not None else None
    kind = getattr(node, "kind", "")
    if first.node.startswith("Input") or kind == "input":
        return ("the step's input differs: the step reads data it was not given as an argument (an iterator or a "
                "global in its closure?)")
    if first.node.startswith("Parameter") or first.node.startswith("Constant"):
        return ("a parameter or buffer the step started from differs: the model was changed between the step "
                "start and its first use outside the step function")
    return generic or GENERIC_REASONS


class ReplayedStep(Reader):
    """Step ``step`` of a run, computed again at ``level`` with every tensor retained.

    The usual reader surface (``stats``, ``tensor``, ``first_nonfinite``, ``watch``, ``panel()``,
    ``export_html()``) over its own session, whose step number is the original's. ``bitwise`` tells whether
    the loss and every statistic the live capture recorded for the step came out the same bits;
    ``mismatches`` lists the differences (first one first) and ``reason`` says why they likely arise.
    ``node``: the node to show first (the hit's, for a replay made on a hit)."""

    def __init__(self, session: Any, *, step: int, level: str, loss: Any = None, live_loss: Any = None,
                 mismatches: list[Mismatch] | None = None, notes: list[str] | None = None, compared: int = 0,
                 node: str | None = None, hits: list[Any] | None = None, error: str | None = None,
                 causes: list[str] | None = None, generic: str | None = None) -> None:
        self.session = session
        self.watchpoints = WatchManager(session)
        self.step = step
        self.level = level
        self.loss = loss
        self.live_loss = live_loss
        self.mismatches = list(mismatches or [])
        self.notes = list(notes or [])
        self.compared = compared
        self.node = node
        self.live_hits = list(hits or [])
        self.error = error
        self.closed = False
        self.reason = reason_for(self.mismatches[0], list(causes or []), session.graph, generic) \
            if self.mismatches else ""

    @property
    def graph(self) -> Any:
        return self.session.graph

    @property
    def bitwise(self) -> bool:
        """True when the loss and every compared statistic have the original's bits."""
        return not self.mismatches and self.error is None

    def warn(self, strict: bool = False) -> None:
        """Say (warning, or ``ReplayMismatchError`` when ``strict``) that the replay is not the original."""
        if self.bitwise:
            return
        text = (f"replay of step {self.step} failed: {self.error}" if self.error else
                f"replay of step {self.step} is not bitwise identical to the original: first difference "
                f"{self.mismatches[0]} ({len(self.mismatches)} values differ); likely because {self.reason}")
        if strict:
            raise ReplayMismatchError(text)
        warnings.warn(text, ReplayMismatch, stacklevel=3)

    def first_nonfinite(self, step: Any = "current", **kw: Any) -> Any:
        """Where NaN/Inf starts in the replayed step (see :meth:`Reader.first_nonfinite`)."""
        return super().first_nonfinite(step, **kw)

    def panel(self) -> Any:
        """The notebook panel over the replayed step, with :attr:`node` selected."""
        p = feature("panel")(self)
        if self.node is not None and self.node in self.session.graph.nodes:
            p.select(self.node)
        return p

    def export_html(self, path: Any) -> Any:
        """One self-contained HTML file of the replayed step."""
        return feature("export_html")(self, path)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel())

    def __repr__(self) -> str:
        state = "bitwise" if self.bitwise else ("failed" if self.error else f"{len(self.mismatches)} mismatches")
        return (f"<nbdebug replayed step {self.step} level={self.level} nodes={len(self.session.graph)} "
                f"compared={self.compared} {state}>")
