"""One rank's step in a few numbers: what a job keeps (and, remotely, what a rank sends) per rank and step.

A :class:`StepSummary` is computed from the step's :class:`~nbdebug.session.stats.StatsTable` in one
vectorised pass: how many tensors were captured, how many hold NaN/Inf (and how many such values), the
largest finite magnitude, the last scalar computed in the forward section (the loss, as a rule), the
hits of the step, and the rank's non-finite *origin* — the first node whose inputs are finite and
whose output is not — with its position in the step (its row in execution order). It is small and
JSON-friendly (:meth:`StepSummary.to_dict`), so a job of many ranks keeps one per rank and step instead
of every statistic.

>>> import numpy as np
>>> from nbdebug.session.stats import StatsTable
>>> t = StatsTable.from_rows([("Module.fc.Linear.forward.0", "input.0"), ("Module.fc.Linear.forward.0", "output.0")],
...     ["float32"] * 2, [(2,), (2,)],
...     np.array([[1.0, -3.0, 0, 1, 2, 0, 0, 0, 0, 2], [np.nan, np.nan, np.nan, np.nan, np.nan, 0, 2, 0, 0, 2]]))
>>> s = summarize_table(t, rank=1, step=3, origin=("Module.fc.Linear.forward.0", "output.0"))
>>> s.nonfinite_tensors, s.nonfinite_values, s.max_abs, s.origin
(1, 2, 3.0, ('Module.fc.Linear.forward.0', 'output.0', 1))
>>> StepSummary.from_dict(s.to_dict()) == s
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..session.stats import COL

_INPUT_SLOTS = ("input", "parameters")


@dataclass(frozen=True)
class StepSummary:
    """One rank's step: sizes, non-finite counts, largest finite magnitude, loss, hits and origin.

    ``origin`` is ``(node, slot, position)``: the rank's first non-finite origin in the step and the row of
    that tensor in the step's execution order (None when the step is finite everywhere).
    ``grad_norm_total`` (the monitor's ``Run`` series) and ``step_time`` (seconds from the rank's previous
    step end to this one's) are filled in by a remote rank's agent (None elsewhere).
    ``loss`` is the last scalar output of an op or module call of the forward section (None when there is none,
    e.g. at level L0 with the loss computed outside the model). ``nonfinite_values`` is a lower bound when
    the source holds no counts (a statistics-only msProbe dump records Max/Min only: a NaN tensor counts 1).
    """

    rank: int
    step: int
    tensors: int
    nonfinite_tensors: int
    nonfinite_values: int
    max_abs: float | None
    loss: float | None
    hits: int
    origin: tuple[str, str, int] | None
    grad_norm_total: float | None = None
    step_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (``origin`` as a list)."""
        d = asdict(self)
        d["origin"] = list(self.origin) if self.origin is not None else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepSummary:
        """The inverse of :meth:`to_dict`; ``ValueError`` on a malformed message."""
        try:
            o = d.get("origin")
            origin = (str(o[0]), str(o[1]), int(o[2])) if o is not None else None
            return cls(int(d["rank"]), int(d["step"]), int(d["tensors"]), int(d["nonfinite_tensors"]),
                       int(d["nonfinite_values"]), _opt_float(d.get("max_abs")), _opt_float(d.get("loss")),
                       int(d.get("hits", 0)), origin, _opt_float(d.get("grad_norm_total")),
                       _opt_float(d.get("step_time")))
        except (KeyError, TypeError, IndexError, ValueError) as e:
            raise ValueError(f"not a step summary ({type(e).__name__}: {e}): {dict(d)!r:.200}") from None


def _opt_float(x: Any) -> float | None:
    return None if x is None else float(x)


def summarize_table(table: Any, *, rank: int, step: int, origin: tuple[str, str] | None = None, hits: int = 0,
                    computed_forward: Callable[[str], bool] | None = None,
                    backward: Callable[[str], bool] | None = None) -> StepSummary:
    """The summary of one step's ``table`` (``origin``: the ``(node, slot)`` the rank's first-non-finite
    analysis found; ``computed_forward(node)``: whether a node is an op or module call of the forward
    section — not a parameter, input or constant —, for the loss; ``backward(node)``: whether a node is of the
    backward section: the loss is the last such scalar before the step's last backward node — the loss its
    backward started from; a scalar computed after it, a gradient norm for clipping or logging, is none)."""
    n = len(table)
    if not n:
        return StepSummary(rank, step, 0, 0, 0, None, None, hits, None)
    v = table.values
    bad = np.nan_to_num(v[:, COL["nan_count"]]) + np.nan_to_num(v[:, COL["pos_inf_count"]]) \
        + np.nan_to_num(v[:, COL["neg_inf_count"]])
    ext = np.abs(v[:, [COL["max"], COL["min"]]])
    ext = ext[np.isfinite(ext)]
    max_abs = float(ext.max()) if ext.size else None
    loss = None
    end = n
    if backward is not None:  # from the end: the optimizer's few rows follow the backward
        keys = table.keys
        end = next((i for i in range(n - 1, -1, -1) if backward(keys[i][0])), n)
    for i in np.flatnonzero(v[:end, COL["count"]] == 1)[::-1]:  # scalars, last first
        node, slot = table.keys[i]
        if not slot.startswith(_INPUT_SLOTS) and (computed_forward is None or computed_forward(node)):
            loss = float(v[i, COL["mean"]])
            break
    where = None
    if origin is not None:
        where = (origin[0], origin[1], int(table.index.get(tuple(origin), -1)))
    return StepSummary(rank, step, n, int((bad > 0).sum()), int(bad.sum()), max_abs, loss, hits, where)


def summarize_monitor_row(row: Mapping[tuple[str, str], float], *, rank: int, step: int,
                          hits: int = 0) -> StepSummary:
    """The summary of a monitor-level step (no statistics table) from its monitor ``row``: ``tensors`` the series
    measured (the run's aside), ``nonfinite_tensors`` the non-finite ones among them — each holds one such value
    at least, so ``nonfinite_values`` is that lower bound —, ``max_abs`` the largest finite ``…max_abs`` series,
    the run's loss and total gradient norm, and the origin (:func:`monitor_origin`). Before, such a step read
    0 non-finite tensors next to its non-finite origin, and the job panel showed it clean.

    >>> s = summarize_monitor_row({("Module.m.A", "output_norm"): float("nan"), ("Module.m.A", "output_max_abs"):
    ...     float("nan"), ("Module.m.B", "output_max_abs"): 3.0, ("Run", "grad_norm_total"): float("nan")},
    ...     rank=2, step=4)
    >>> s.tensors, s.nonfinite_tensors, s.max_abs, s.grad_norm_total, s.origin
    (3, 2, 3.0, nan, ('Module.m.A', 'output_norm', 0))
    """
    measured = [(k, v) for k, v in row.items() if k[0] != "Run"]
    bad = sum(1 for _k, v in measured if not np.isfinite(v))
    mags = [v for k, v in measured if k[1].endswith("max_abs") and np.isfinite(v)]
    return StepSummary(rank, step, len(measured), bad, bad, max(mags) if mags else None,
                       _opt_float(row.get(("Run", "loss"))), hits, monitor_origin(row),
                       _opt_float(row.get(("Run", "grad_norm_total"))))


#: the order a monitor row's non-finite series are taken in for a step's origin: forward module outputs, the
#: gradients coming into the modules' backward (a module's series, ``Module.…`` or ``Cell.…``, are told by
#: their fields: no framework's prefix here), the parameters' series, then the run's (loss, total grad norm)
_MONITOR_ORDER = (("", ("output_norm", "output_max_abs")), ("", ("grad_input_norm",)), ("Parameter.", None),
                  ("", None))


def monitor_origin(row: Mapping[tuple[str, str], float]) -> tuple[str, str, int] | None:
    """``(series, field, position)`` of a monitor-level step's non-finite origin from its monitor ``row``
    (``{(name, field): value}`` in recording order — a module before the modules it calls), None when the
    row is finite. The first non-finite forward output of a module none of whose own submodules' outputs is
    non-finite (where the NaN was made), else the first non-finite series in :data:`_MONITOR_ORDER`;
    ``position`` orders origins of ranks in the same step (a rank that made the NaN in its forward comes
    before one whose gradients received it through the allreduce).

    >>> monitor_origin({("Module.m.M", "output_norm"): float("nan"), ("Module.m.a.A", "output_norm"): 1.0,
    ...                 ("Module.m.b.B", "output_norm"): float("inf"), ("Run", "loss"): float("nan")})
    ('Module.m.b.B', 'output_norm', 2)
    >>> monitor_origin({("Cell.net.fc.Dense", "grad_input_norm"): float("nan"), ("Run", "loss"): 2.0})  # MindSpore
    ('Cell.net.fc.Dense', 'grad_input_norm', 2)
    >>> monitor_origin({("Run", "loss"): 2.0}) is None
    True
    """
    keys = list(row)
    bad = [k for k in keys if not np.isfinite(row[k])]
    for rank_, (prefix, fields) in enumerate(_MONITOR_ORDER):
        mine = [k for k in bad if k[0].startswith(prefix) and (fields is None or k[1] in fields)]
        if rank_ == 0:
            mine = [k for k in mine if not any(o[0].startswith(k[0].rsplit(".", 1)[0] + ".") and o[0] != k[0]
                                              for o in mine)]  # a name is its path and its class
        if mine:
            return mine[0][0], mine[0][1], rank_ * len(keys) + keys.index(mine[0])
    return None
