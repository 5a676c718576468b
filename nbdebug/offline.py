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

import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .session.graph import Graph
from .session.session import Session
from .session.stats import COL, FIELDS, StatsTable, row_to_mapping
from .session.store import NotRetainedError
from .watch.watchpoints import HitRecord, WatchManager, Watchpoint

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


def read_tensor_file(tf: TensorFile) -> np.ndarray:
    """Read ``tf`` (``.npy`` memory-mapped, ``.pt`` via torch); ``ValueError`` naming the file on a bad or
    mismatching file."""
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
    if tf.format == "pt":
        from .frameworks.torch_io_load import load_pt

        arr = load_pt(tf.path)
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
    step that ``"current"`` means (the last one unless :meth:`OfflineSession.goto` moved it).
    """

    def __init__(self, *, framework: str, framework_version: str = "", device: str = "cpu",
                 cache_items: int = 64) -> None:
        super().__init__(framework=framework, framework_version=framework_version, device=device,
                         memory_budget=0, live=False)
        self.files: dict[int, dict[tuple[str, str], TensorFile]] = {}
        self.estimated: dict[int, np.ndarray] = {}
        self.problems: list[DumpProblem] = []
        self.current_step: int | None = None
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
        self.current_step = max(self.steps)
        return table

    # -- reading ----------------------------------------------------------------------------------
    def step_list(self) -> list[int]:
        return sorted(self.steps)

    def resolve_step(self, key: tuple[str, str], step: int | str) -> int:
        if isinstance(step, (int, np.integer)):
            return int(step)
        if step not in ("current", "previous"):
            raise ValueError(f"step must be 'current', 'previous', 'initial' or an int, got {step!r}")
        steps = self.step_list()
        if not steps:
            return -1
        cur = self.current_step if self.current_step is not None else steps[-1]
        if step == "current":
            return cur
        earlier = [s for s in steps if s < cur]
        return earlier[-1] if earlier else -1

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

    def stats(self, node: str, slot: str, step: int | str = "current") -> Mapping[str, Any]:
        """Like :meth:`Session.stats`; unknown fields are None and listed under ``"unknown"``, lower bounds
        are listed under ``"estimated"``."""
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
        dump has none (statistics task, missing or corrupt file)."""
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
            arr = read_tensor_file(tf)
        except ValueError as e:
            problem = DumpProblem(tf.path, str(e).split(": ", 1)[-1])
            if problem not in self.problems:
                self.problems.append(problem)
            raise NotRetainedError(f"{node} {slot}: {e}") from None
        self._cache[ck] = arr
        if len(self._cache) > self._cache_items:
            self._cache.popitem(last=False)
        return arr

    def _check_key(self, node: str, slot: str) -> None:
        if node not in self.graph.nodes:
            raise KeyError(f"no node named {node!r}; the dump has {len(self.graph)} nodes")
        known = self.graph.nodes[node].shapes
        if known and slot not in known:
            raise KeyError(f"node {node!r} has no slot {slot!r}; its slots: {sorted(known)}")


class OfflineSession:
    """A dump loaded for analysis: graph, per-step statistics, tensors on demand, watchpoints and hits.

    Watchpoints are evaluated on every step of the dump as soon as they are created or changed
    (``auto_check``); :meth:`recheck` evaluates them again.
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
    def step_index(self) -> int:
        """The step that ``"current"`` means (the last step unless :meth:`goto` chose another)."""
        cur = getattr(self.session, "current_step", None)
        if cur is not None:
            return cur
        return max(self.session.steps) if self.session.steps else -1

    @property
    def live(self) -> bool:
        return False

    def goto(self, step: int) -> None:
        """Make ``step`` the "current" one (``"previous"`` is the step before it)."""
        if step not in self.session.steps:
            raise KeyError(f"no step {step} in this dump; steps: {self.steps}")
        if hasattr(self.session, "current_step"):
            self.session.current_step = step
        self.hub.emit("step", step)

    # -- reading ------------------------------------------------------------------------------------
    def stats(self, node: str, slot: str, step: int | str = "current") -> Mapping[str, Any]:
        """Statistics of one tensor (see the module docstring for fields a dump does not record)."""
        return self.session.stats(node, slot, step)

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        """The dumped value; ``NotRetainedError`` says why when there is none."""
        return self.session.tensor(node, slot, step)

    # -- watchpoints ----------------------------------------------------------------------------------
    def watch(self, condition: str, nodes: Any = None, **params: Any) -> Watchpoint:
        """Create a watchpoint (as :meth:`nbdebug.Debugger.watch`); it is evaluated on every step at once."""
        wp = self.watchpoints.watch(condition, nodes, **params)
        if self.auto_check:
            self.recheck()
        return wp

    def update_watch(self, wp: int | Watchpoint, **changes: Any) -> Watchpoint:
        """Change a watchpoint (``add=``, ``remove=``, ``enabled=``, ``nodes=`` or parameters)."""
        w = self.watchpoints.update(wp, **changes)
        if self.auto_check:
            self.recheck()
        return w

    def unwatch(self, wp: int | Watchpoint | None = None) -> None:
        """Delete one watchpoint, or all of them (None)."""
        if wp is None:
            self.watchpoints.clear()
        else:
            self.watchpoints.delete(wp)

    def recommend(self) -> list[tuple[str, dict[str, Any], Any]]:
        return self.watchpoints.recommend()

    def watch_recommended(self) -> list[Watchpoint]:
        wps = [self.watchpoints.watch(c, target=t, **p) for c, p, t in self.recommend()]
        if self.auto_check:
            self.recheck()
        return wps

    @property
    def hits(self) -> list[HitRecord]:
        """Every hit, ordered by step, then execution order."""
        return sorted(self.watchpoints.hits, key=lambda h: (h.step, h.order, h.node, h.slot, h.watchpoint))

    def recheck(self, step: int | Iterable[int] | None = None) -> list[HitRecord]:
        """Evaluate the watchpoints on ``step`` (an int, several, or None: every step of the dump)."""
        if step is None:
            steps = self.steps
        elif isinstance(step, (int, np.integer)):
            steps = [int(step)]
        else:
            steps = [int(s) for s in step]
        found: list[HitRecord] = []
        for s in steps:
            found.extend(self.watchpoints.check(s))
        for h in found:
            self.hub.emit("hit", h)
        return found

    def on(self, event: str, callback: Callable[[Any], Any]) -> Callable[[], None]:
        """Subscribe to ``hit`` and ``step`` (from :meth:`goto`) events; returns an unsubscribe function."""
        return self.hub.on(event, callback)

    # -- analysis -------------------------------------------------------------------------------------
    def first_nonfinite(self, step: int | str | None = "current") -> tuple[str, str, int] | None:
        """The earliest node whose inputs are finite and whose output is not: ``(node, slot, step)``.

        ``step=None`` searches every step in order and returns the first origin found."""
        if step is None:
            for s in self.steps:
                found = self.first_nonfinite(s)
                if found is not None:
                    return found
            return None
        idx = step if isinstance(step, (int, np.integer)) else self.session.resolve_step(("", ""), step)
        if idx not in self.session.steps:
            return None
        table = self.session.table(int(idx))
        if not len(table):
            return None
        bad = (np.nan_to_num(table.column("nan_count")) + np.nan_to_num(table.column("pos_inf_count"))
               + np.nan_to_num(table.column("neg_inf_count"))) > 0
        if not bad.any():
            return None
        by_node: dict[str, list[int]] = {}
        for i, (node, _slot) in enumerate(table.keys):
            by_node.setdefault(node, []).append(i)
        for name in by_node:  # rows are in execution order
            rows = by_node[name]
            outs = [i for i in rows if not table.keys[i][1].startswith(("input", "parameters"))]
            ins = [i for i in rows if table.keys[i][1].startswith(("input", "parameters"))]
            if any(bad[i] for i in outs) and not any(bad[i] for i in ins):
                first = next(i for i in outs if bad[i])
                return name, table.keys[first][1], int(idx)
        return None

    # -- display --------------------------------------------------------------------------------------
    def panel(self) -> Any:
        """The notebook panel (graph, nodes, watchpoints, hits, tensor view) over this dump."""
        from .ui.panel import Panel

        return Panel(self)

    def export_html(self, path: str | Any) -> Any:
        """Write one self-contained HTML file (graph, hits, node statistics) that opens with no server."""
        from .ui.export import export_html

        return export_html(self, path)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel())

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
