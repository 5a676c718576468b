"""One dump.json entry's tensors (:func:`entry_slots`) and the rows of one step being assembled
(:class:`StepRows`), statistics kept raw until :meth:`StepRows.matrix` turns them into ``FIELDS``.

>>> t = {"dtype": "torch.float32", "shape": [2], "Max": 1.0, "Min": 0.0, "Mean": 0.5, "Norm": 1.0}
>>> [s for s, _ in entry_slots({"input_args": [t], "output": [t], "parameters": {"weight": t}})]
['input.0', 'output.0', 'parameters.weight']
>>> rows = StepRows(); rows.add(("n", "output.0"), "float32", (2,), 2.0, t)
>>> values, estimated = rows.matrix(); float(values[0, 3])  # abs_mean, inferred from Min >= 0
0.5
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..offline import DumpProblem
from ..session.stats import COL, FIELDS

NAN = float("nan")

def _num(v: Any) -> float:
    t = type(v)
    if t is float:
        return v
    if t is int or t is bool:
        return float(v)
    if v is None:
        return NAN
    if t is str:
        try:
            return float(v)
        except ValueError:
            return NAN
    try:
        return float(v)
    except (TypeError, ValueError):
        return NAN


def _floats(values: list[Any]) -> np.ndarray:
    """JSON statistics (float, int, bool, None, "nan"/"inf" strings) as float64; None becomes NaN."""
    try:
        return np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        return np.array([_num(v) for v in values], dtype=np.float64)


MAX_NESTING = 32  # tensors nested deeper than this inside one argument are not read
MAX_ELEMENTS = 2.0**53  # more elements than any device holds: a damaged shape


def _tensor_leaves(obj: Any, prefix: str, out: list[tuple[str, dict]], depth: int = 0) -> None:
    if depth > MAX_NESTING:
        raise RecursionError(f"{prefix}: nested deeper than {MAX_NESTING}")
    if isinstance(obj, dict):
        if "shape" in obj and "dtype" in obj and "value" not in obj:
            out.append((prefix, obj))
        elif "value" in obj or "type" in obj:
            return  # a non-tensor argument
        else:  # a namedtuple / dict output
            for k, v in obj.items():
                _tensor_leaves(v, f"{prefix}.{k}", out, depth + 1)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _tensor_leaves(v, f"{prefix}.{i}", out, depth + 1)


_STAT_TYPES = frozenset({float, int, bool, str, type(None)})
_STATS = ("Max", "Min", "Mean", "Norm")


def _short(v: Any, n: int = 60) -> str:
    try:
        text = repr(v)
    except RecursionError:
        text = f"<{type(v).__name__}>"
    return text if len(text) <= n else text[: n - 3] + "..."


def _clean_tensor(t: dict, name: str, slot: str, rel: str, problems: list[DumpProblem]) -> dict:
    """``t`` with statistics that are not numbers (``"Max": {}``) and a non-string dtype replaced by
    unknowns, each reported."""
    bad = {k: t.get(k) for k in _STATS if type(t.get(k)) not in _STAT_TYPES}
    if type(t.get("dtype", "")) is not str:
        bad["dtype"] = t.get("dtype")
    if not bad:
        return t
    out = dict(t)
    for k, v in bad.items():
        out[k] = "unknown" if k == "dtype" else None
        problems.append(DumpProblem(rel, f"{name} {slot}: {k} is {_short(v)}, not a "
                                         f"{'string' if k == 'dtype' else 'number'}; shown as unknown"))
    return out


def _is_tensor(v: Any) -> bool:
    return type(v) is dict and "shape" in v and "dtype" in v and "value" not in v


def entry_slots(entry: dict) -> list[tuple[str, dict]]:
    """``[(slot, tensor dict)]`` of a dump.json entry, in nbdebug slot names (``input.0``, ``output.1.0``,
    ``input.{kwarg}``, ``parameters.weight``, and the parameter name for ``parameters_grad``)."""
    out: list[tuple[str, dict]] = []
    for key, value in entry.items():
        if key in ("input_args", "input", "output"):
            base = "output." if key == "output" else "input."
            if type(value) is list:
                for i, v in enumerate(value):
                    if _is_tensor(v):
                        out.append((base + str(i), v))
                    elif v is not None:
                        _tensor_leaves(v, base + str(i), out)
            else:
                _tensor_leaves(value, base + "0", out)
        elif key == "input_kwargs":
            if isinstance(value, dict):
                for k, v in value.items():
                    _tensor_leaves(v, f"input.{k}", out)
        elif key == "parameters":
            if isinstance(value, dict):
                for k, v in value.items():
                    _tensor_leaves(v, f"parameters.{k}", out)
        elif isinstance(value, list):  # parameters_grad: {name: [stats]}
            if len(value) == 1:
                _tensor_leaves(value[0], key, out)
            else:
                for i, v in enumerate(value):
                    _tensor_leaves(v, f"{key}.{i}", out)
        elif isinstance(value, dict) and "shape" in value:
            _tensor_leaves(value, key, out)
    return out


class StepRows:
    """Rows of one step being assembled."""

    __slots__ = ("keys", "dtypes", "shapes", "mx", "mn", "mean", "norm", "count", "files", "index")

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self.dtypes: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.mx: list[float] = []
        self.mn: list[float] = []
        self.mean: list[float] = []
        self.norm: list[float] = []
        self.count: list[float] = []
        self.files: dict[tuple[str, str], str] = {}
        self.index: dict[tuple[str, str], int] = {}

    def add(self, key: tuple[str, str], dtype: str, shape: tuple[int, ...], count: float, t: dict) -> None:
        """Add (or replace) one tensor's row; statistics stay raw JSON values until :meth:`matrix`."""
        g = t.get
        i = self.index.get(key)
        if i is not None:  # the same slot twice: keep the latest
            self.dtypes[i], self.shapes[i], self.count[i] = dtype, shape, count
            self.mx[i], self.mn[i], self.mean[i], self.norm[i] = g("Max"), g("Min"), g("Mean"), g("Norm")
        else:
            self.index[key] = len(self.keys)
            self.keys.append(key)
            self.dtypes.append(dtype)
            self.shapes.append(shape)
            self.mx.append(g("Max"))
            self.mn.append(g("Min"))
            self.mean.append(g("Mean"))
            self.norm.append(g("Norm"))
            self.count.append(count)
        name = g("data_name")
        if name is not None and type(name) is str and name and name != "-1":
            self.files[key] = name

    def matrix(self) -> tuple[np.ndarray, np.ndarray]:
        """The FIELDS matrix (inferred where msProbe has no statistic) and the *estimated* mask."""
        n = len(self.keys)
        v = np.full((n, len(FIELDS)), np.nan)
        est = np.zeros((n, len(FIELDS)), dtype=bool)
        if not n:
            return v, est
        mx, mn, mean = _floats(self.mx), _floats(self.mn), _floats(self.mean)
        count = np.asarray(self.count, dtype=np.float64)
        v[:, COL["max"]] = mx
        v[:, COL["min"]] = mn
        v[:, COL["mean"]] = mean
        v[:, COL["norm"]] = _floats(self.norm)
        v[:, COL["count"]] = count
        with np.errstate(invalid="ignore"):
            v[:, COL["abs_mean"]] = np.where(mn >= 0, mean, np.where(mx <= 0, -mean, np.nan))
            # Max/Min absent (xor summary mode, unknown types) say nothing; NaN Max/Min mean NaN in the data
            missing = np.fromiter((a is None or b is None for a, b in zip(self.mx, self.mn, strict=True)), bool, n)
            nan_mx, nan_mn = np.isnan(mx) & ~missing, np.isnan(mn) & ~missing
            data_nan = nan_mx | nan_mn
            v[:, COL["nan_count"]] = np.where(data_nan, 1.0, np.where(missing, np.nan, 0.0))
            est[:, COL["nan_count"]] = data_nan
            pinf = mx == np.inf
            v[:, COL["pos_inf_count"]] = np.where(pinf, 1.0, np.where(nan_mx | missing, np.nan, 0.0))
            est[:, COL["pos_inf_count"]] = pinf
            ninf = mn == -np.inf
            v[:, COL["neg_inf_count"]] = np.where(ninf, 1.0, np.where(nan_mn | missing, np.nan, 0.0))
            est[:, COL["neg_inf_count"]] = ninf
            zero = np.where((mx == 0) & (mn == 0), count, np.where((mn > 0) | (mx < 0), 0.0, np.nan))
            v[:, COL["zero_count"]] = zero
        empty = count == 0
        if empty.any():
            v[empty] = 0.0
            v[empty, COL["max"]] = v[empty, COL["min"]] = v[empty, COL["mean"]] = v[empty, COL["abs_mean"]] = np.nan
            est[empty] = False
        return v, est
