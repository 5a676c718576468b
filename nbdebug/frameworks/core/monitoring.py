"""The monitor's row of a step: series a framework probe measured, plus those read off the step's statistics.

At every level the step end records one row into ``Session.monitor`` (:class:`~nbdebug.session.monitor.Monitor`).
Its values come from two places:

* the framework's monitor probe (``frameworks/<name>/monitor.py``): what no statistics table holds — the
  parameters' gradient, update and optimizer-moment norms, the loss, the loss scale; and at the levels that
  record no module calls (``monitor``, ``L1``) the modules' output and output-gradient norms;
* at ``L0``/``mix``, the step's :class:`~nbdebug.session.stats.StatsTable` (the same values, measured once):
  a module's ``{prefix}.{path}.{Class}.forward.N`` first output slot (``output.0``, or a ``ModelOutput``'s first
  field, ``output.last_hidden_state``) gives its ``output_norm`` and ``output_max_abs``,
  its ``backward.N input.0`` its ``grad_input_norm``, N the first call of the step that has a backward (an eval
  pass under ``no_grad`` before it is call 0), else 0; a ``Parameter.{name} output.0`` its ``weight_norm``
  (the weight the forward used) at every level that records parameters.

Then, on the host: ``update_ratio = update_norm / weight_norm``, absent for a weight of zeros (the probes give
``Run.grad_norm_total``, :func:`total_norm` of the gradient norms). Index arrays are cached per key list, so a
step costs a few array ops.

>>> import numpy as np
>>> from nbdebug.session.stats import StatsTable
>>> t = StatsTable.from_rows([("Module.fc.Linear.forward.0", "output.0"), ("Parameter.fc.weight", "output.0")],
...                          ["float32"] * 2, [(2,), (2,)],
...                          np.array([[1.0, -3.0, 0, 0, 5.0, 0, 0, 0, 0, 2], [2.0, 0.0, 0, 0, 4.0, 0, 0, 0, 0, 2]]))
>>> rows = MonitorRows("Module", derive=True)
>>> keys, values, present = rows.row(t, [("Parameter.fc.weight", "update_norm")], np.array([0.5]))
>>> r = dict(zip(keys, values.tolist()))
>>> r[("Module.fc.Linear", "output_max_abs")], r[("Parameter.fc.weight", "update_ratio")], bool(present.all())
(3.0, 0.125, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...session.monitor import Key
from ...session.stats import COL

_NORM, _MAX, _MIN = COL["norm"], COL["max"], COL["min"]


class KeyColumns:
    """A growing list of series keys and each key's column in it (the same list object every step, so the
    session's :class:`~nbdebug.session.monitor.Monitor` finds its columns once)."""

    def __init__(self) -> None:
        self.keys: list[Key] = []
        self._col: dict[Key, int] = {}

    def col(self, key: Key) -> int:
        """The column of ``key``, added at the end the first time."""
        c = self._col.get(key)
        if c is None:
            c = self._col[key] = len(self.keys)
            self.keys.append(key)
        return c


class MonitorRows(KeyColumns):
    """Assembles each step's monitor row (one growing key list: the same object every step)."""

    def __init__(self, prefix: str, derive: bool) -> None:
        self.prefix = prefix + "."
        self.derive = derive
        super().__init__()
        self._table_cache: tuple[Any, int, tuple[np.ndarray, ...]] | None = None
        self._probe_cache: tuple[Any, int, np.ndarray] | None = None
        self._post_cache: tuple[Any, ...] | None = None


    def row(self, table: Any, probe_keys: Sequence[Key], probe_values: np.ndarray,
            probe_present: np.ndarray | None = None) -> tuple[list[Key], np.ndarray, np.ndarray]:
        """``(keys, values, present)`` of the step: ``keys`` is this object's key list, ``present`` marks the
        series measured this step (a NaN there is a NaN the model computed; elsewhere NaN fills the absent).
        ``probe_present`` marks the probe's measured values (default: its non-NaN ones)."""
        derived = self._derive(table) if self.derive and table is not None and len(table.keys) else None
        pcols = self._probe_cols(probe_keys) if len(probe_keys) else None
        layout = self._post_layout()
        out = np.full(len(self.keys), np.nan)
        has = np.zeros(len(self.keys), bool)
        if derived is not None:
            rows, norm_cols, max_rows, max_cols = derived
            vals = table.values
            out[norm_cols] = vals[rows, _NORM]
            has[norm_cols] = True
            if len(max_rows):
                out[max_cols] = np.maximum(np.abs(vals[max_rows, _MAX]), np.abs(vals[max_rows, _MIN]))
                has[max_cols] = True
        if pcols is not None:  # a probe's value never replaces a derived one with a NaN
            values = np.asarray(probe_values, dtype=np.float64)
            got = ~np.isnan(values) if probe_present is None else np.asarray(probe_present, bool)
            got = got & (~has[pcols] | ~np.isnan(values))
            out[pcols[got]] = values[got]
            has[pcols[got]] = True
        self._post(out, has, layout)
        return self.keys, out, has

    def _derive(self, table: Any) -> tuple[np.ndarray, ...]:
        keys = table.keys
        cache = self._table_cache
        if cache is not None and cache[0] is keys and cache[1] == len(keys):
            return cache[2]
        rows, norm_cols, max_rows, max_cols = [], [], [], []
        prefix = self.prefix
        first: set[str] = set()  # module calls whose first output slot was seen
        call = _first_backward_calls(keys, prefix)
        for i, (node, slot) in enumerate(keys):
            if node.startswith(prefix):
                if slot.startswith("output.") and ".forward." in node and node not in first:
                    # the first output tensor, as the probe's first_tensor: ``output.0``, or a ModelOutput's
                    # first field (``output.last_hidden_state``); not an integer one (no norm series)
                    base, _, n = node.rpartition(".forward.")
                    if n != call.get(base, "0"):
                        continue
                    first.add(node)
                    if "float" not in table.dtypes[i]:
                        continue
                    rows.append(i)
                    norm_cols.append(self.col((base, "output_norm")))
                    max_rows.append(i)
                    max_cols.append(self.col((base, "output_max_abs")))
                elif slot == "input.0" and ".backward." in node:
                    base, _, n = node.rpartition(".backward.")
                    if n == call.get(base, "0"):
                        rows.append(i)
                        norm_cols.append(self.col((base, "grad_input_norm")))
            elif slot == "output.0" and node.startswith("Parameter."):
                rows.append(i)
                norm_cols.append(self.col((node, "weight_norm")))
        arrays = tuple(np.asarray(a, dtype=np.intp) for a in (rows, norm_cols, max_rows, max_cols))
        self._table_cache = (keys, len(keys), arrays)
        return arrays

    def _probe_cols(self, keys: Sequence[Key]) -> np.ndarray:
        cache = self._probe_cache
        if cache is not None and cache[0] is keys and cache[1] == len(keys):
            return cache[2]
        cols = np.fromiter((self.col(k) for k in keys), np.intp, len(keys))
        self._probe_cache = (keys, len(keys), cols)
        return cols

    def _post_layout(self) -> tuple[np.ndarray, ...]:
        """Columns of ``update_ratio`` per parameter (added to the key list before the row is allocated)."""
        cache = self._post_cache
        if cache is not None and cache[0] == len(self.keys):
            return cache[1:]
        ratio, upd, wn = [], [], []
        for name, field in list(self.keys):
            if field == "update_norm":
                upd.append(self._col[(name, field)])
                wn.append(self.col((name, "weight_norm")))
                ratio.append(self.col((name, "update_ratio")))
        arrays = tuple(np.asarray(a, dtype=np.intp) for a in (ratio, upd, wn))
        self._post_cache = (len(self.keys), *arrays)
        return arrays

    @staticmethod
    def _post(out: np.ndarray, has: np.ndarray, layout: tuple[np.ndarray, ...]) -> None:
        ratio, upd, wn = layout
        if len(ratio):
            with np.errstate(divide="ignore", invalid="ignore"):
                out[ratio] = out[upd] / out[wn]
            # a weight of zeros (a bias or LoRA's B at init) has no ratio: 0/0 or x/0 is no value the model
            # computed (it read as a NaN for "TO" and 3.4e38); a NaN weight's NaN ratio stays (NaN != 0)
            zero = out[wn] == 0
            has[ratio] = has[upd] & has[wn] & ~zero
            out[ratio[zero]] = np.nan


def total_norm(norms: np.ndarray) -> float:
    """The 2-norm of the concatenation of tensors whose 2-norms are ``norms`` (NaN and inf propagate).

    >>> total_norm(np.array([3.0, 4.0]))
    5.0
    """
    n = np.asarray(norms, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.sqrt(np.sum(n * n)))


def _first_backward_calls(keys: Sequence[Key], prefix: str) -> dict[str, str]:
    """Module (``{prefix}.{path}.{Class}``) -> the call number (text) of its first call in the step that has a
    backward node, where that is not call 0 (an eval pass under ``no_grad`` ran before the training call).

    >>> _first_backward_calls([("Module.fc.Linear.forward.0", "output.0"), ("Module.fc.Linear.forward.1",
    ...     "output.0"), ("Module.fc.Linear.backward.1", "input.0"), ("Module.a.ReLU.backward.0", "input.0")],
    ...     "Module.")
    {'Module.fc.Linear': '1'}
    """
    lowest: dict[str, int] = {}
    for node, _slot in keys:
        if node.startswith(prefix) and ".backward." in node:
            base, _, n = node.rpartition(".backward.")
            if n.isdigit() and int(n) < lowest.get(base, 1 << 62):
                lowest[base] = int(n)
    return {base: str(n) for base, n in lowest.items() if n}
