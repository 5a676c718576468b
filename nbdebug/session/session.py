"""The session: what every view, watchpoint and dump reads.

A :class:`Session` holds the graph, the :class:`StatsTable` of the last ``stats_window`` finished steps,
a compact :class:`History` (a few floats per output tensor) of every older step, the statistics being
collected for the step in progress, and retained tensor values. Framework adapters write into it;
nothing here imports a framework.

>>> s = Session(framework="numpy", framework_version="1", device="cpu")
>>> s.step_index
0
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from .graph import Graph, Node
from .handle import Handle
from .history import HISTORY_FIELDS, History
from .monitor import Monitor
from .slot_names import slot_aliases
from .stats import FIELDS, STAT_KEYS, StatsTable, row_to_mapping
from .steps import current_step, resolve_step
from .store import NotRetainedError, TensorStore

RAW_WIDTH = 9  # max, min, sum, abs_sum, sq_sum, zero, nan, +inf, -inf


class RawRows:
    """Growable host matrix of raw stats rows (one per captured tensor of a step), shared by adapters.

    >>> r = RawRows(capacity=1)
    >>> r._next_row(), r._next_row(), len(r)
    (0, 1, 2)
    """

    def __init__(self, capacity: int = 1024) -> None:
        self._host = np.empty((max(1, capacity), RAW_WIDTH), dtype=np.float64)
        self._n = 0
        #: taken when the matrix grows (not per row) and by a subclass writing rows that arrive later (rows
        #: queued on a device, moved by a read on another thread): no row is written into a matrix being replaced
        self._grow_lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def _next_row(self) -> int:
        if self._n == self._host.shape[0]:
            with self._grow_lock:
                grown = np.empty((self._host.shape[0] * 2, RAW_WIDTH), dtype=np.float64)
                grown[: self._n] = self._host[: self._n]
                self._host = grown
        row = self._n
        self._n += 1
        return row


def numpy_raw(arr: np.ndarray) -> np.ndarray:
    """The raw reduction row of a host array (the adapters' reduction, NaN propagating), for checks.

    >>> numpy_raw(np.array([1.0, -2.0, 0.0])).tolist()
    [1.0, -2.0, -1.0, 3.0, 5.0, 1.0, 0.0, 0.0, 0.0]
    """
    x = np.asarray(arr)
    if x.dtype == np.bool_:
        x = x.astype(np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):  # uninitialised memory (empty_like) may hold anything
        x = x.astype(np.float64, copy=False).ravel()
    if not x.size:
        return np.array([np.nan, np.nan] + [0.0] * 7)
    with np.errstate(invalid="ignore", over="ignore"):
        nans = np.isnan(x)
        return np.array([x.max(), x.min(), x.sum(), np.abs(x).sum(), (x * x).sum(), float((x == 0).sum()),
                         float(nans.sum()), float((x == np.inf).sum()), float((x == -np.inf).sum())])


def same_stats(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two :data:`FIELDS` rows describe the same value (extrema and counts exact, sums to rounding)."""
    exact = [0, 1, 5, 6, 7, 8, 9]
    ea, eb = a[exact], b[exact]
    if not np.array_equal(ea, eb, equal_nan=True):
        return False
    scale = abs(float(b[3])) if np.isfinite(b[3]) else 0.0  # abs_mean: the size of the rounding of a mean
    return bool(np.allclose(a[2:5], b[2:5], rtol=1e-5, atol=1e-6 * scale + 1e-30, equal_nan=True))


def raw_to_fields(raw: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Convert raw reduction rows (sums) into :data:`FIELDS` rows (means, norm, count)."""
    out = np.empty((raw.shape[0], len(FIELDS)))
    safe = np.where(counts > 0, counts, 1)
    out[:, 0] = raw[:, 0]
    out[:, 1] = raw[:, 1]
    out[:, 2] = raw[:, 2] / safe
    out[:, 3] = raw[:, 3] / safe
    with np.errstate(invalid="ignore"):
        out[:, 4] = np.sqrt(raw[:, 4])
    out[:, 5:9] = raw[:, 5:9]
    out[:, 9] = counts
    empty = counts == 0
    if empty.any():
        out[empty, 0:4] = np.nan
    return out


class StatsNotRetainedError(NotRetainedError, KeyError):
    """A step's full statistics fell out of the window; a ``KeyError`` too, for code that asks for a step's
    table and handles a missing one."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class StepRecorder:
    """The (node, slot) → stats-row bookkeeping of the step in progress (hot path: appends only)."""

    __slots__ = ("keys", "rows", "dtypes", "shapes", "counts", "unsupported", "index", "by_node", "active")

    def __init__(self) -> None:
        self.keys: list[tuple[str, str]] = []
        self.rows: list[int] = []
        self.dtypes: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.counts: list[int] = []
        self.unsupported: dict[int, str] = {}
        self.index: dict[tuple[str, str], int] = {}
        self.by_node: dict[str, list[int]] = {}
        #: the step ran something though no tensor was recorded (the monitor level records no tensors): a
        #: step in progress all the same (``len`` is at least 1), so step boundaries and partial steps hold
        self.active = False

    def add(self, key: tuple[str, str], row: int, dtype: str, shape: tuple[int, ...], count: int) -> int:
        """Record ``key``'s row; returns its index."""
        i = self.index.get(key)
        if i is not None:  # re-recorded within a step (e.g. a slot seen twice): keep the latest
            self.rows[i] = row
            self.dtypes[i], self.shapes[i], self.counts[i] = dtype, shape, count
            return i
        n = self.index[key] = len(self.keys)
        rows = self.by_node.get(key[0])
        if rows is None:
            self.by_node[key[0]] = [n]
        else:
            rows.append(n)
        self.keys.append(key)
        self.rows.append(row)
        self.dtypes.append(dtype)
        self.shapes.append(shape)
        self.counts.append(count)
        return n

    def __len__(self) -> int:
        return len(self.keys) or int(self.active)


class Session:
    """Graph + per-step statistics + retained values of one debugged run (live or offline).

    ``step_index`` is the step in progress; ``current_step`` the step "current" means
    (:mod:`nbdebug.session.steps` decides both ways)."""

    #: a run numbers its steps from 0 without gaps ("previous" of step k is k-1 even with no record of it)
    contiguous_steps = True

    def __init__(self, *, framework: str, framework_version: str = "", device: str = "cpu",
                 memory_budget: int = 512 * 2**20, live: bool = True, stats_window: int | None = 8) -> None:
        self.framework = framework
        self.framework_version = framework_version
        self.device = device
        self.pid = os.getpid()
        self.live = live
        self.graph = Graph()
        self.steps: dict[int, StatsTable] = {}
        #: steps that ran but were not captured (sampled capture), with the reason
        self.skipped: dict[int, str] = {}
        #: finished steps whose full tables are kept (None: all); older ones move to :attr:`history`
        self.stats_window = stats_window
        self.history = History()
        #: per-step scalar series for the whole run (norms per module and parameter, loss, loss scale),
        #: recorded at every level; the only record of a step at level "monitor"
        self.monitor = Monitor()
        self.step_index = 0
        self.store = TensorStore(memory_budget)
        #: the step whose values ``store.current`` holds; the store rotates lazily, when the next step
        #: records its first node, so that between steps "current" and "previous" both stay readable
        self.store_step = 0
        #: nodes whose values watchpoints need or the user asked to keep: kept even over the memory budget
        self.pinned: frozenset[str] = frozenset()
        self._watch_pins: frozenset[str] = frozenset()
        #: nodes whose values the user asked to keep (:meth:`keep_values`)
        self.kept: frozenset[str] = frozenset()
        #: the finished step that "current" means when chosen with :meth:`goto` (None: the latest;
        #: :func:`~nbdebug.session.steps.current_step` decides)
        self.chosen_step: int | None = None
        self.recorder = StepRecorder()
        #: an op node's parameter names in order (``Functional.layer_norm.0.forward`` -> ``input,
        #: normalized_shape, weight, ...``), or None: the framework backend's (:meth:`slot_of`'s aliases)
        self.api_parameters: Callable[[str], Any] | None = None
        self.order = 0  # execution counter within the step in progress
        self.lock = threading.RLock()
        #: source of raw stats rows for the step in progress: () -> ndarray (rows x RAW_WIDTH)
        self.raw_source: Callable[[], np.ndarray] | None = None
        #: run before a retained value is read (an adapter that offers values in batches flushes them)
        self.before_read: Callable[[], None] | None = None
        #: graph file -> graph id of the kernel graphs captured (MindSpore GRAPH mode; empty otherwise)
        self.kernel_graphs: dict[str, int] = {}
        self._partial: tuple[StepRecorder, int, StatsTable] | None = None  # the step in progress's, read last
        self._last_table: StatsTable | None = None  # the last finished step's (its key list is shared)
        self._listeners: dict[str, list[Callable[..., Any]]] = {}

    # -- events -----------------------------------------------------------------------------------
    def subscribe(self, event: str, fn: Callable[..., Any]) -> Handle:
        """Call ``fn`` on ``event`` ("node", "step"); returns its :class:`~nbdebug.session.handle.Handle`
        (``.remove()``, a context manager, and callable as the unsubscribe function it used to be)."""
        self._listeners.setdefault(event, []).append(fn)
        return Handle(lambda: self._listeners.get(event, []).remove(fn) if fn in self._listeners.get(event, [])
                      else None)

    def emit(self, event: str, *args: Any) -> None:
        for fn in list(self._listeners.get(event, ())):
            fn(*args)

    def has_listeners(self, event: str) -> bool:
        return bool(self._listeners.get(event))

    def pin(self, nodes: frozenset[str]) -> None:
        """Keep the values of ``nodes`` even over the memory budget (what value-level watchpoints need)."""
        self._watch_pins = frozenset(nodes)
        self.pinned = self._watch_pins | self.kept

    def keep_values(self, nodes: frozenset[str]) -> None:
        """Keep the values of ``nodes`` from their next execution on, whatever the budget and section (the
        optimizer's in-place updates included), besides the watchpoints' pins."""
        self.kept = frozenset(nodes)
        self.pinned = self._watch_pins | self.kept

    # -- writing (adapters) -----------------------------------------------------------------------
    def node(self, name: str, *, kind: str, op_type: str, scope: str = "", section: str = "forward",
             stack: Callable[[], list[str]] | None = None, pair: str | None = None, site: Any = None) -> Node:
        """Register that ``name`` executed now; returns its node with ``order`` set.

        ``site``: a key of the call site (ops named by a per-step counter): when it differs from the
        node's, the name now stands for another op — the node takes the new scope and stack, and the
        step is noted in ``node.moved``."""
        if self.store_step != self.step_index:
            with self.lock:  # once a step: a reader takes the store's step and its values together (tensor)
                if self.live:  # training records again: a step chosen to look at (goto) gives way to it
                    self.chosen_step = None
                self.store.rotate()
                if self.store_step != self.step_index - 1:  # a step without values in between
                    self.store.rotate()
                self.store_step = self.step_index
        node = self.graph.nodes.get(name)
        if node is None:
            node = self.graph.add_node(name, kind=kind, op_type=op_type, scope=scope, section=section,
                                       stack=stack() if stack else None, pair=pair)
            node.site = site
        elif site is not None and node.site != site:
            if node.site is not None:
                node.moved.append(self.step_index)
                node.scope = scope
                node.section = section
                if stack is not None:
                    node.stack = stack()
                self.graph.version += 1
            node.site = site
        node.order = self.order
        self.order += 1
        return node

    def end_step(self, raw: np.ndarray) -> StatsTable:
        """Close the step in progress with its raw stats rows; returns its table."""
        last = self._last_table
        table = self._build_table(raw, final=True)
        table.orders = _step_orders(table, last, self.graph.nodes)
        with self.lock:  # a reader on another thread (timeline) takes the window of one moment under it
            self.steps[self.step_index] = table
            # the recorder before the step index: "current" read meanwhile is this step, finished or not
            self.recorder = StepRecorder()
            self.order = 0
            self._partial = None
            self.step_index += 1
            if self.stats_window is not None:
                while len(self.steps) > self.stats_window:
                    old = min(self.steps)
                    self.history.add(old, self.steps.pop(old))  # its caches go with it
        return table

    def skip_step(self, reason: str) -> None:
        """Close the step in progress as one that ran but was not captured: it has no statistics table
        (it is not in :attr:`steps`), and reading it raises :class:`StatsNotRetainedError` with ``reason``."""
        with self.lock:
            self.skipped[self.step_index] = reason
            self.recorder = StepRecorder()
            self.order = 0
            self._partial = None
            self.step_index += 1

    def _in_progress(self, step: int | None = None) -> tuple[StepRecorder, Callable[[], np.ndarray] | None, int] | None:
        """The step in progress as a reader on any thread may take it: its recorder and raw rows of one moment
        (the training thread replaces both at a step end) and how many of its tensors are recorded in full
        (``counts`` is appended last; a raw row is written before its tensor is recorded). With ``step``:
        None when that step is no longer the one in progress (it ended since the reader looked)."""
        with self.lock:
            if step is not None and step != self.step_index:
                return None
            rec, source = self.recorder, self.raw_source
        return rec, source, len(rec.counts)

    def _build_table(self, raw: np.ndarray, final: bool = False, rec: StepRecorder | None = None,
                     n: int | None = None) -> StatsTable:
        """The table of the recorder's rows; ``final``: the step ends (the recorder's lists are taken over,
        and a step with the same tensors as the last finished one shares its key list and index); else the
        first ``n`` tensors of ``rec`` (:meth:`_in_progress`: the training thread may record more meanwhile)."""
        if final:
            rec = self.recorder
        elif rec is None or n is None:
            rec, _source, n = self._in_progress()
        if not final:
            keys, rows, counts = rec.keys[:n], rec.rows[:n], rec.counts[:n]
            values = raw_to_fields(raw[np.asarray(rows, dtype=np.intp)], np.asarray(counts, dtype=np.float64)) \
                if keys else np.zeros((0, len(FIELDS)))
            table = StatsTable.from_rows(keys, rec.dtypes[:n], rec.shapes[:n], values)
            table.unsupported = {i: why for i, why in dict(rec.unsupported).items() if i < n}
            return table
        if rec.keys:
            rows = np.asarray(rec.rows, dtype=np.intp)
            values = raw_to_fields(raw[rows], np.asarray(rec.counts, dtype=np.float64))
        else:
            values = np.zeros((0, len(FIELDS)))
        last = self._last_table
        keys, index = (last.keys, last.index) if last is not None and rec.keys == last.keys else \
            (rec.keys, rec.index)
        table = StatsTable.taking(keys, index, rec.dtypes, rec.shapes, values)
        self._last_table = table
        table.unsupported = {i: why for i, why in rec.unsupported.items()}
        return table

    # -- reading ----------------------------------------------------------------------------------
    def table(self, step: int) -> StatsTable:
        """Statistics of ``step``; the step in progress is materialized from what was captured so far."""
        got = self.steps.get(step)
        if got is not None:
            return got
        if step in self.skipped:
            raise StatsNotRetainedError(self.skipped[step])
        if step == self.step_index:
            taken = self._in_progress(step)
            if taken is None:  # it ended meanwhile (another thread reads): read it as the finished step
                return self.table(step)
            rec, source, n = taken
            partial = self._partial
            if partial is None or partial[0] is not rec or partial[1] != n:
                raw = source() if source else np.zeros((0, 9))
                partial = self._partial = (rec, n, self._build_table(raw, rec=rec, n=n))
            return partial[2]
        if step in self.history:
            raise StatsNotRetainedError(self._out_of_window(step))
        if isinstance(step, (int, np.integer)) and step < 0:
            raise KeyError(f"step {step} is invalid: steps are numbered from 0; steps with statistics: "
                           f"{self.step_range()}")
        raise KeyError(f"no statistics for step {step}; steps with statistics: {self.step_range()}")

    def _out_of_window(self, step: int) -> str:
        return (f"step {step} fell out of the statistics window: full statistics are kept for the last "
                f"{self.stats_window} finished steps ({self.step_range()}; Debugger(stats_window=N) keeps more). "
                f"Its compact history keeps {', '.join(HISTORY_FIELDS)} of each output tensor: ask "
                f"stats(node, slot, step, fields=[...]) for those, or timeline(node, slot, field)")

    def node_table(self, node: str) -> StatsTable:
        """Statistics of ``node``'s tensors in the step in progress (cheap: only its rows)."""
        rec, source, n = self._in_progress()  # of one moment: training may record on meanwhile
        idx = [i for i in list(rec.by_node.get(node, ())) if i < n]
        raw = source() if source else np.zeros((0, 9))
        rows = np.asarray([rec.rows[i] for i in idx], dtype=np.intp)
        counts = np.asarray([rec.counts[i] for i in idx], dtype=np.float64)
        values = raw_to_fields(raw[rows], counts) if len(idx) else np.zeros((0, len(FIELDS)))
        table = StatsTable.from_rows([rec.keys[i] for i in idx], [rec.dtypes[i] for i in idx],
                                     [rec.shapes[i] for i in idx], values)
        unsupported = dict(rec.unsupported)
        table.unsupported = {j: unsupported[i] for j, i in enumerate(idx) if i in unsupported}
        return table

    def step_range(self) -> str:
        done = sorted(self.steps)
        if not done and self.history.steps:
            done = [max(self.history.steps)]
        if not done:
            return "none yet" if not len(self.recorder) else f"{self.step_index} (in progress)"
        return f"{done[0]}..{done[-1]}" + (f", {self.step_index} (in progress)" if len(self.recorder) else "")

    @property
    def current_step(self) -> int:
        """The step "current" means (:func:`~nbdebug.session.steps.current_step`); -1 before any."""
        return current_step(self)

    def latest_step(self) -> int:
        """The step "current" means for the whole session: the one chosen with :meth:`goto`, else the step
        in progress once it recorded something, else the last finished one (-1 before any)."""
        return current_step(self)

    def goto(self, step: int) -> None:
        """Make the finished ``step`` the one "current" means (offline reading; not while recording)."""
        if step not in self.steps:
            raise KeyError(f"no step {step}; steps: {sorted(self.steps)}")
        if len(self.recorder):
            raise RuntimeError("this session is recording a step; it cannot show another one")
        self.chosen_step = int(step)

    def resolve_step(self, key: tuple[str, str], step: int | str) -> int:
        """Turn a step spec (an int, "current", "previous", "initial", "last") into a step index for ``key``
        (:func:`~nbdebug.session.steps.resolve_step`)."""
        return resolve_step(self, step, key)

    def stats(self, node: str, slot: str, step: int | str = "current",
              fields: Any = None) -> Mapping[str, Any]:
        """Statistics of one tensor; ``fields`` picks some of them (a step out of the window serves the
        :data:`HISTORY_FIELDS` of an output tensor)."""
        slot = self.slot_of(node, slot)
        key = (node, slot)
        self._check_key(node, slot)
        want = _check_fields(fields)
        idx = self._step_of(key, step)
        if idx in self.skipped:
            raise StatsNotRetainedError(f"{node} {slot}: {self.skipped[idx]}")
        if idx not in self.steps and idx in self.history:
            compact = self.history.get(idx, key)
            if want is not None and set(want) <= set(HISTORY_FIELDS) and compact is not None:
                return {f: compact[f] for f in want}
            raise StatsNotRetainedError(f"{node} {slot}: " + self._out_of_window(idx)
                                        + ("" if compact is not None or slot.startswith("output") else
                                           " (input and parameter slots are their producers' outputs there)"))
        table = self.table(idx)
        i = table.index.get(key)
        if i is None:
            raise KeyError(f"{node} {slot} did not execute in step {idx}")
        return _row_stats(table, i, want)

    def _step_of(self, key: tuple[str, str], step: Any) -> int:
        if isinstance(step, (int, np.integer)) and not isinstance(step, bool) and step < 0:
            raise ValueError(f"step {step} is invalid: steps are numbered from 0 (\"current\" and \"previous\" "
                             f"name the latest ones); steps with statistics: {self.step_range()}")
        idx = self.resolve_step(key, step)
        if idx < 0:
            raise KeyError(f"{key[0]} {key[1]}: there is no {step} step yet")
        return idx

    def timeline(self, node: str, slot: str, field: str = "norm") -> tuple[list[int], list[float]]:
        """``(steps, values)`` of one statistic of one tensor over every finished step (the compact history,
        then the window); ``field`` one of :data:`HISTORY_FIELDS`."""
        if field not in HISTORY_FIELDS:
            raise ValueError(f"field must be one of {', '.join(HISTORY_FIELDS)}, got {field!r}")
        slot = self.slot_of(node, slot)
        key = (node, slot)
        self._check_key(node, slot)
        with self.lock:  # the window of one moment (training moves its oldest step to the history meanwhile)
            window = dict(self.steps)
            end = min(window) if window else self.step_index
        past = self.history.series(key, field)  # every step that left the window before then, and later ones
        steps = [k for k in past[0] if k < end]
        vals = [v for k, v in zip(*past, strict=True) if k < end]
        for idx in sorted(window):
            table = window[idx]
            i = table.index.get(key)
            if i is not None:
                v = _row_stats(table, i, (field,))[field]
                steps.append(idx)
                vals.append(float("nan") if v is None else float(v))
        return steps, vals

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        if self.before_read is not None:
            self.before_read()
        slot = self.slot_of(node, slot)
        key = (node, slot)
        if step == "initial":
            return self.store.get(key, "initial")
        self._check_key(node, slot)
        idx = self._step_of(key, step)
        if idx in self.skipped:
            raise NotRetainedError(f"{node} {slot}: {self.skipped[idx]}")
        with self.lock:  # the store's step and its values of one moment (training starts a step meanwhile)
            arr = self._retained(key, idx)
        self._verify(key, idx, arr)
        return arr

    def _retained(self, key: tuple[str, str], idx: int) -> np.ndarray:
        """The value of ``key`` kept for step ``idx`` (the current or previous step), else why not."""
        node, slot = key
        if idx == self.store_step:
            which = "current"
        elif idx == self.store_step - 1:
            which = "previous"
        else:
            raise NotRetainedError(
                f"{node} {slot}: values are kept for the current ({self.store_step}) and previous step "
                f"only; step {idx} has statistics but no retained value")
        try:
            return self.store.get(key, which)
        except NotRetainedError:
            store = self.store
            if store.reason(key, which) is None and self.graph.nodes[node].section == "optimizer" and \
                    node not in self.pinned:
                raise NotRetainedError(
                    f"{node} {slot}: not retained: the optimizer's ops keep statistics only (a copy of each "
                    "value it overwrites in place would cost as much as its step); the parameters' values "
                    "are the Parameter nodes'; keep(node) or a value watchpoint on it keeps its values from "
                    "its next execution") from None
            raise

    def _verify(self, key: tuple[str, str], idx: int, arr: np.ndarray) -> None:
        """Refuse a retained value that is no longer the one its statistics describe.

        Some kernels write into tensors without bumping their version counter (BatchNorm's running
        statistics, ``GradScaler.unscale_`` on gradients): a reference kept at capture time then shows a
        later value. The statistics were computed at capture, so comparing them catches it."""
        if idx in self.steps:
            table = self.steps[idx]
        elif idx == self.step_index:
            table = self.node_table(key[0])
        else:
            return
        i = table.index.get(key)
        if i is None or i in table.unsupported or tuple(arr.shape) != tuple(table.shapes[i]):
            return
        got = raw_to_fields(numpy_raw(arr)[None, :], np.asarray([float(arr.size)]))[0]
        if not same_stats(got, table.values[i]):
            raise NotRetainedError(
                f"{key[0]} {key[1]}: the tensor was changed in place after it was used, by an operation that "
                "does not bump its version counter (e.g. a BatchNorm running-statistics update or "
                "GradScaler.unscale_ on gradients), and no copy was kept: the value used is gone; its "
                "statistics are still exact")

    def _node_count(self) -> str:
        return f"{len(self.graph)} nodes captured so far"

    def slot_of(self, node: str, slot: str) -> str:
        """``node``'s slot ``slot`` under the name this session gives it, ``slot`` being that name or the other
        one of the same tensor (:func:`~nbdebug.session.slot_names.slot_aliases`: a dump's ``input.2`` is the
        live ``input.weight`` of ``F.layer_norm(x, shape, w, b)``, a dump's ``output.0.last_hidden_state`` the
        live ``output.last_hidden_state``). A name that is neither is returned as given (the caller's
        ``KeyError`` names the node's slots); a name the node has is always that slot, and any other name has
        at most one alias, so either way one slot answers."""
        g = self.graph.nodes.get(node)
        known = g.shapes if g is not None else None
        if not known or slot in known:
            return slot
        params = self.api_parameters(node) if self.api_parameters is not None and slot.startswith("input.") \
            else None
        found = [c for c in slot_aliases(slot, params) if c in known]  # at most one
        return found[0] if found else slot

    def _check_key(self, node: str, slot: str) -> None:
        if node not in self.graph.nodes:
            raise KeyError(f"no node named {node!r}; {self._node_count()}")
        known = self.graph.nodes[node].shapes
        if known and slot not in known:
            raise KeyError(f"node {node!r} has no slot {slot!r}; its slots: {sorted(known)}")


def _row_stats(table: StatsTable, i: int, want: tuple[str, ...] | None) -> dict[str, Any]:
    """Row ``i`` of ``table`` as statistics by name (``want``: those only; ``nonfinite_count`` summed)."""
    out = row_to_mapping(table.dtypes[i], table.shapes[i], table.values[i])
    if i in table.unsupported:
        out.update({k: None for k in ("max", "min", "mean", "abs_mean", "norm")})
        out["unsupported"] = table.unsupported[i]
    if want is not None:
        nf = out["nan_count"] + out["pos_inf_count"] + out["neg_inf_count"]
        out = {f: (nf if f == "nonfinite_count" else out[f]) for f in want}
    return out


def _check_fields(fields: Any) -> tuple[str, ...] | None:
    if fields is None:
        return None
    if isinstance(fields, str):
        fields = (fields,)
    try:
        out = tuple(fields)
    except TypeError:
        raise TypeError(f"fields must be a list of statistic names, got {fields!r}") from None
    known = set(STAT_KEYS) | set(HISTORY_FIELDS)
    bad = [f for f in out if f not in known]
    if bad:
        raise ValueError(f"unknown statistic(s) {bad}; known: {', '.join(STAT_KEYS)}, nonfinite_count")
    return out


def _step_orders(table: StatsTable, last: StatsTable | None, nodes: dict[str, Any]) -> dict[str, int]:
    """The execution order of ``table``'s nodes in its step. ``Node.order`` is rewritten by every later step
    that runs the node (two optimizers, or a branch, run other nodes in other orders each step). A step with
    the same key sequence as the last one (the steady state: it shares its key list) ran in the same order."""
    if last is not None and last.keys is table.keys and last.orders is not None:
        return last.orders
    orders = dict.fromkeys(name for name, _slot in table.keys)
    for name in orders:
        node = nodes.get(name)
        orders[name] = node.order if node is not None else 1 << 60
    return orders
