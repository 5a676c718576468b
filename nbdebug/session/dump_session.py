"""A :class:`Session` whose steps come from files: the statistics and tensor files of a loaded dump.

Loaders (``nbdebug.load``, MindSpore's kernel-dump reader) build a :class:`DumpSession` step by step with
:meth:`DumpSession.add_step`; :class:`nbdebug.offline.OfflineSession` gives it the reading and watchpoint
API. Tensor files are read on demand: ``.npy`` memory-mapped here, other formats (``.pt``) by the reader
the loader passes (``read_file``), so this module needs numpy only.

>>> s = DumpSession(framework="pytorch")
>>> s.graph.add_node("Functional.relu.0.forward", kind="op", op_type="relu").shapes["output.0"] = (2,)
>>> _ = s.add_step(0, [("Functional.relu.0.forward", "output.0")], ["float32"], [(2,)],
...                np.array([[1.0, 0.0, 0.5, 0.5, 0.7, np.nan, 0, 0, 0, 2]]))
>>> s.stats("Functional.relu.0.forward", "output.0")["unknown"]
('zero_count',)
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .session import Session, _check_fields
from .slot_names import slot_aliases  # noqa: F401 - the compare passes and tests import it from here
from .stats import COL, FIELDS, StatsTable, row_to_mapping
from .store import NotRetainedError

_COUNT_FIELDS = ("zero_count", "nan_count", "pos_inf_count", "neg_inf_count")


@dataclass(frozen=True)
class DumpProblem:
    """Something in a dump that could not be loaded as is; ``file`` names it."""

    file: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.message}"


@dataclass(frozen=True)
class TensorFile:
    """Where the value of one dumped tensor is: ``.npy`` (memory-mapped) or ``.pt`` (torch)."""

    path: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def format(self) -> str:
        return "pt" if self.path.endswith((".pt", ".pth")) else "npy"


#: ``.pt`` tensor files larger than this are not read (``torch.load`` reads a file whole; ``.npy`` files are
#: memory-mapped and have no limit)
MAX_PT_BYTES = 16 * 2**30


def read_tensor_file(tf: TensorFile, read_other: Callable[[str], np.ndarray] | None = None) -> np.ndarray:
    """Read ``tf`` (``.npy`` memory-mapped, other formats with ``read_other(path)``); ``ValueError`` naming
    the file on a bad or mismatching file, or a format with no reader."""
    import stat

    try:
        st = os.stat(tf.path)
    except OSError:
        raise ValueError(f"{tf.path}: missing") from None
    if not stat.S_ISREG(st.st_mode):  # a FIFO would hang the read, /dev/zero never end
        raise ValueError(f"{tf.path}: not a regular file (a FIFO, device or folder); not read")
    if tf.format == "pt" and st.st_size > MAX_PT_BYTES:
        raise ValueError(f"{tf.path}: {st.st_size} bytes, over the {MAX_PT_BYTES}-byte limit for a .pt tensor "
                         f"file; not read")
    if tf.format != "npy":
        if read_other is None:
            raise ValueError(f"{tf.path}: no reader for .{tf.format} tensor files in this session")
        arr = read_other(tf.path)
    else:
        try:
            arr = np.load(tf.path, mmap_mode="r", allow_pickle=False)
        except Exception as e:  # truncated header, not an npy file, object array...
            raise ValueError(f"{tf.path}: not a readable .npy file ({type(e).__name__}: {e})") from None
    if tf.shape is not None and tuple(arr.shape) != tuple(tf.shape):
        raise ValueError(f"{tf.path}: holds shape {tuple(arr.shape)} but the dump records {list(tf.shape)}")
    return arr


class DumpSession(Session):
    """A :class:`~nbdebug.session.session.Session` whose steps come from files (``live`` is False).

    ``files[step][(node, slot)]`` says where a tensor's value is; :meth:`tensor` reads it on demand (any
    step, not only the last two). ``estimated[step]`` marks the statistics that are lower bounds (a
    boolean matrix shaped like the step's ``values``); NaN marks unknown ones. ``current_step`` is the
    step that ``"current"`` means (the last one unless :meth:`OfflineSession.goto` moved it); its step
    numbers may have gaps (``"previous"`` is the dump's step before it).
    """

    contiguous_steps = False

    def __init__(self, *, framework: str, framework_version: str = "", device: str = "cpu",
                 cache_items: int = 64, read_file: Callable[[str], np.ndarray] | None = None) -> None:
        super().__init__(framework=framework, framework_version=framework_version, device=device,
                         memory_budget=0, live=False)
        self.files: dict[int, dict[tuple[str, str], TensorFile]] = {}
        self.estimated: dict[int, np.ndarray] = {}
        self.problems: list[DumpProblem] = []
        #: reads a tensor file that is not ``.npy`` (e.g. ``.pt``): path -> array
        self.read_file = read_file
        #: a kernel dump's reader, and per step the ``(graph id, iteration)`` of its main graph and every
        #: ``(graph id, iteration)`` run it holds (MindSpore kernel dumps; None / empty otherwise)
        self.kernel_dump: Any = None
        self.step_iterations: dict[int, tuple[int, int]] = {}
        self.step_runs: dict[int, list[tuple[int, int]]] = {}
        self._cache: OrderedDict[tuple[int, str, str], np.ndarray] = OrderedDict()
        self._cache_items = cache_items

    # -- building ---------------------------------------------------------------------------------
    def add_step(self, step: int, keys: list[tuple[str, str]], dtypes: list[str], shapes: list[tuple[int, ...]],
                 values: np.ndarray, *, files: dict[tuple[str, str], TensorFile] | None = None,
                 estimated: np.ndarray | None = None,
                 index: dict[tuple[str, str], int] | None = None) -> StatsTable:
        """Add the statistics of ``step`` (``index``: a ready ``{key: row}`` map, to skip rebuilding it)."""
        table = StatsTable()
        table.keys = list(keys)
        table.index = index if index is not None else {k: i for i, k in enumerate(table.keys)}
        table.dtypes = list(dtypes)
        table.shapes = list(shapes)
        table.values = np.asarray(values, dtype=np.float64).reshape(len(table.keys), len(FIELDS))
        self.steps[step] = table
        self.files[step] = files or {}
        self.estimated[step] = estimated if estimated is not None else np.zeros(table.values.shape, dtype=bool)
        self.step_index = max(self.steps) + 1
        return table

    # -- reading ----------------------------------------------------------------------------------
    def step_list(self) -> list[int]:
        return sorted(self.steps)

    def table(self, step: int) -> StatsTable:
        if step in self.steps:
            return self.steps[step]
        raise KeyError(f"no statistics for step {step}; the dump has steps {self.step_range()}")

    def step_range(self) -> str:
        steps = self.step_list()
        if not steps:
            return "none"
        contiguous = steps == list(range(steps[0], steps[-1] + 1))
        return f"{steps[0]}..{steps[-1]}" if contiguous and len(steps) > 2 else ", ".join(map(str, steps))

    # -- slot names: the dump's, and the live session's for the same tensor ----------------------------
    def slot_names(self, node: str, slot: str) -> tuple[str, ...]:
        """Every name ``node``'s slot answers to: the dump's first, then its aliases (the live session's
        name of the same tensor); ``KeyError`` for a slot the node does not have."""
        real = self.slot_of(node, slot)
        self._check_key(node, real)
        params = self.api_parameters(node) if self.api_parameters is not None and real.startswith("input.") \
            else None
        known = self.graph.nodes[node].shapes
        return (real, *(a for a in slot_aliases(real, params) if a not in known))

    def timeline(self, node: str, slot: str, field: str = "norm") -> tuple[list[int], list[float]]:
        return super().timeline(node, self.slot_of(node, slot), field)

    def stats(self, node: str, slot: str, step: int | str = "current", fields: Any = None) -> Mapping[str, Any]:
        """Like :meth:`Session.stats`; unknown fields are None and listed under ``"unknown"``, lower bounds
        are listed under ``"estimated"``; ``fields`` picks some. ``slot`` may be the live session's name of
        the dumped slot (:meth:`slot_of`)."""
        want = _check_fields(fields)
        slot = self.slot_of(node, slot)
        out = self._stats(node, slot, step)
        if want is None:
            return out
        nf = [out[f] for f in ("nan_count", "pos_inf_count", "neg_inf_count")]
        total = None if None in nf else sum(nf)
        return {f: (total if f == "nonfinite_count" else out[f]) for f in want}

    def _stats(self, node: str, slot: str, step: int | str) -> dict[str, Any]:
        self._check_key(node, slot)
        idx = self.resolve_step((node, slot), step)
        if idx < 0:
            raise KeyError(f"{node} {slot}: there is no {step} step in this dump")
        table = self.table(idx)
        i = table.index.get((node, slot))
        if i is None:
            raise KeyError(f"{node} {slot} is not in step {idx} of the dump")
        row = table.values[i]
        nan = np.isnan(row)
        # a NaN statistic is a fact about the data only when the data is known to hold NaN
        data_nan = not nan[COL["nan_count"]] and row[COL["nan_count"]] > 0
        unknown = tuple(f for f in FIELDS if nan[COL[f]] and (
            f in _COUNT_FIELDS or f == "abs_mean" or (f in ("max", "min", "mean", "norm") and not data_nan)))
        out = row_to_mapping(table.dtypes[i], table.shapes[i], np.where(nan, 0.0, row))
        for f in ("max", "min", "mean", "abs_mean", "norm"):
            if out[f] is not None:
                out[f] = None if f in unknown else float(row[COL[f]])
        for f in _COUNT_FIELDS:
            if f in unknown:
                out[f] = None
        est = self.estimated.get(idx)
        out["estimated"] = tuple(f for f in FIELDS if est is not None and est[i, COL[f]])
        out["unknown"] = unknown
        tf = self.files.get(idx, {}).get((node, slot))
        out["file"] = tf.path if tf is not None else None
        if i in table.unsupported:
            out["unsupported"] = table.unsupported[i]
        return out

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        """The dumped value (read-only, memory-mapped for ``.npy``); ``NotRetainedError`` says why when the
        dump has none (statistics task, missing or corrupt file). ``slot``: the dump's name or the live one."""
        slot = self.slot_of(node, slot)
        key = (node, slot)
        if step == "initial":
            for s in self.step_list():
                if key in self.files.get(s, {}):
                    return self.tensor(node, slot, s)
            raise NotRetainedError(f"{node} {slot}: no step of this dump has a tensor file for it")
        self._check_key(node, slot)
        idx = self.resolve_step(key, step)
        if idx not in self.steps:
            raise KeyError(f"{node} {slot}: no step {idx} in this dump (steps {self.step_range()})")
        tf = self.files.get(idx, {}).get(key)
        if tf is None:
            table = self.steps[idx]
            if key not in table.index:
                raise KeyError(f"{node} {slot} is not in step {idx} of the dump")
            why = table.unsupported.get(table.index[key], "")
            if why.startswith("not the value used"):
                raise NotRetainedError(f"{node} {slot}: {why}")
            raise NotRetainedError(f"{node} {slot}: step {idx} of the dump has statistics only, no tensor file")
        ck = (idx, node, slot)
        arr = self._cache.get(ck)
        if arr is not None:
            self._cache.move_to_end(ck)
            return arr
        try:
            arr = read_tensor_file(tf, self.read_file)
        except ValueError as e:
            problem = DumpProblem(tf.path, str(e).split(": ", 1)[-1])
            if problem not in self.problems:
                self.problems.append(problem)
            raise NotRetainedError(f"{node} {slot}: {e}") from None
        self._cache[ck] = arr
        if len(self._cache) > self._cache_items:
            self._cache.popitem(last=False)
        return arr

    def _node_count(self) -> str:
        return f"the dump has {len(self.graph)} nodes"


