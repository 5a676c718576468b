"""Graph runs recorded into a framework-neutral session: a :class:`RunRecorder` turns the matched ``.npy`` files
of one step's graph runs into node slots, statistics rows (:class:`RowBuffer`) and retained values read on
demand (:class:`NpyRef`).

>>> import numpy as np
>>> rows = RowBuffer(); rows.add(np.array([1.0, -2.0], np.float32))[0], rows.raw().shape[0]
(0, 1)
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from ...session.session import RawRows, Session
from ...session.store import NotRetainedError
from .kernel_files import (
    _EMPTY,
    _NAN_ROW,
    _slot_order,
    array_row,
    files_stats,
    index_iteration,
    load_npy,
    misdump_reason,
)
from .kernel_graph import Kernel, KernelGraph
from .kernel_ir import is_optimizer_state
from .kernel_pairing import match_kernel_files

#: CPU kernels that leave some of their outputs unwritten: the dump of such an output holds whatever its
#: buffer held before (another kernel's values, a NaN of an earlier step), not a value the step computed.
#: MindSpore's CPU ``BatchNorm`` writes ``y`` (and updates the moving statistics in place), never its batch
#: statistics / reserve outputs 1–4; what reads them (``BatchNormGrad``) gets the same refusal through its edge.
#: The CPU ``Adam`` and ``AdamWeightDecay`` (``nn.Adam``, ``nn.LazyAdam``, ``nn.AdamWeightDecay``) update the
#: parameter and moments in place and leave their outputs 0–2 as they were (a NaN left there named Adam the
#: origin of a NaN batch); the updated values are the ``Parameter.*`` nodes' dumps. So does ``ApplyRMSProp``
#: (``nn.RMSProp``) with its output 0.
CPU_UNFILLED_OUTPUTS = {"BatchNorm": ("output.1", "output.2", "output.3", "output.4"),
                        "Adam": ("output.0", "output.1", "output.2"),
                        "AdamWeightDecay": ("output.0", "output.1", "output.2"),
                        "ApplyRMSProp": ("output.0",)}
UNFILLED_REASON = ("MindSpore's CPU {op} kernel does not write this output: its dump file holds whatever the "
                   "buffer held before, not a value the step computed")


class NpyRef:
    """Retention handle for a tensor that lives in a dump file (read on demand)."""

    __slots__ = ("path", "nbytes", "__weakref__")

    def __init__(self, path: str, nbytes: int) -> None:
        self.path, self.nbytes = path, nbytes

    def numpy(self) -> np.ndarray:
        if not os.path.exists(self.path):
            raise NotRetainedError(f"the dump file {os.path.basename(self.path)} was removed (only the current "
                                   f"and previous iterations are kept on disk)")
        arr = load_npy(self.path)
        if arr.dtype.kind == "V" and arr.dtype.itemsize == 2:
            arr = (arr.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        return arr


class RowBuffer(RawRows):
    """Host rows of the step in progress (GRAPH mode computes them from files, on the host)."""

    def add(self, arr: np.ndarray) -> tuple[int, str | None]:
        row = self._next_row()
        return row, array_row(arr, self._host[row])

    def add_row(self, values: np.ndarray) -> int:
        """A row holding ``values`` (statistics computed already)."""
        row = self._next_row()
        self._host[row] = values
        return row

    def reserve(self, n: int) -> int:
        """``n`` consecutive rows (their values written by the caller into :meth:`rows`); the first one's index."""
        start = self._n
        if start + n > self._host.shape[0]:
            grown = np.empty((max(2 * self._host.shape[0], start + n), self._host.shape[1]), dtype=np.float64)
            grown[:start] = self._host[:start]
            self._host = grown
        self._n = start + n
        return start

    def rows(self, start: int, n: int) -> np.ndarray:
        """The rows ``start`` to ``start + n`` (a view, to write into)."""
        return self._host[start:start + n]

    def row(self, i: int) -> np.ndarray:
        return self._host[i]

    def add_unknown(self) -> int:
        """A row for a tensor whose values are unknown: NaN statistics, no NaN/Inf counted."""
        row, _ = self.add(_EMPTY)
        self._host[row] = _NAN_ROW
        return row

    def raw(self) -> np.ndarray:
        return self._host[: self._n]


class _RunState:
    """One graph run of a call being recorded: its repetition, what it produced, how its inputs were bound."""

    __slots__ = ("kg", "rep", "first", "start", "sources_done", "produced", "bindings", "uncertain")

    def __init__(self, kg: KernelGraph, rep: int, first: bool, start: int, sources_done: set[str],
                 uncertain: dict[str, str]) -> None:
        self.kg, self.rep, self.first, self.start, self.sources_done = kg, rep, first, start, sources_done
        self.produced: dict[tuple[str, str], tuple] = {}
        self.bindings: dict[str, tuple | None] = {}
        #: kernels whose dump files could not be told from others' (:func:`match_kernel_files`): why
        self.uncertain = uncertain


#: where a slot's value comes from (:class:`_KernelPlan`): the kernel's own file, the producer's output the data
#: flow names (a kernel, parameter, input or constant), or a graph input the control flow binds
_OWN, _LINK, _BOUND = "own", "link", "bound"


class _KernelPlan:
    """How one kernel of one graph run is recorded, whatever the values: its node's name, the parameters,
    inputs and constants it consumes first (``(slot, node, source, dtype key, device dtype)``) and its slots
    in order (``(slot, source kind, (producer node, slot) or None, dumped, output, dtype key, device
    dtype, (node, slot))``)."""

    __slots__ = ("name", "sources", "slots", "stack", "files")

    def __init__(self, name: str, sources: list[tuple], slots: list[tuple], stack: Callable[[], list[str]],
                 files: frozenset[str]) -> None:
        self.name, self.sources, self.slots, self.stack = name, sources, slots, stack
        #: the kernel's file keys (dumped slots and their dtypes) the plan was made for
        self.files = files


class RunRecorder:
    """Writes graph runs (one iteration directory of one graph each) into the step in progress."""

    def __init__(self, session: Session, *, retain: bool = True, weights: set[str] | None = None,
                 emit: Callable[[Any], None] | None = None,
                 unfilled: dict[str, tuple[str, ...]] | None = None) -> None:
        self.session = session
        self.retain = retain
        #: ``{op type: output slots}`` the device's kernels leave unwritten (:data:`CPU_UNFILLED_OUTPUTS` on
        #: CPU): refused with :data:`UNFILLED_REASON`, never shown as values
        self.unfilled = unfilled or {}
        self._unwritten: set[int] = set()  # ids of the entries of such outputs (their readers are refused too)
        #: names of the model's parameters (kind "parameter"); None: guess (not optimizer state)
        self.weights = weights
        self.emit = emit or (lambda node: None)
        self.buf = RowBuffer()
        #: (file, message) for every dump file that could not be read (the slot is left out)
        self.problems: list[tuple[str, str]] = []
        #: ``{(node, slot): (path, shape, dtype)}`` of the step in progress
        self.files: dict[tuple[str, str], tuple[str, tuple[int, ...], str]] = {}
        self._graph_edges: set[tuple[int, int]] = set()
        self._names: dict[tuple[int, str], str] = {}
        self._owner: dict[str, int] = {}
        self._inputs: dict[str, str] = {}
        #: ``{path: (row in :attr:`buf`, dtype, shape, size, nbytes, why) | None}`` of the call being recorded:
        #: each file is read once, for pairing (its statistics) and for its slots
        self._stats: dict[str, tuple | None] = {}
        #: ``{(graph id, repetition, kernel): plan}`` (:meth:`_plan`), each for the file keys it was made for
        self._plans: dict[tuple, _KernelPlan] = {}

    def new_step(self) -> None:
        self.buf = RowBuffer()
        self.files = {}
        self._unwritten = set()
        self._stats = {}  # their rows were the finished step's

    def raw(self) -> np.ndarray:
        return self.buf.raw()

    def node_name(self, kg: KernelGraph, kernel: str) -> str:
        """A kernel's node name: its full scope name, prefixed by the graph when another graph has it."""
        key = (kg.graph_id, kernel)
        name = self._names.get(key)
        if name is None:
            owner = self._owner.setdefault(kernel, kg.graph_id)
            name = kernel if owner == kg.graph_id else f"graph_{kg.graph_id}/{kernel}"
            self._names[key] = name
        return name

    def _source_name(self, kg: KernelGraph, src: tuple[str, ...], consumer: Kernel, slot: str) -> tuple[str, str]:
        """The (node, slot) an input of ``consumer`` comes from."""
        kind, ref = src[0], src[1]
        if kind == "kernel":
            return self.node_name(kg, ref), src[2]
        if kind == "param":
            p = kg.params.get(ref)
            if p is not None and not p.is_weight:
                return self._inputs.setdefault(ref, f"Input.{len(self._inputs)}"), "output.0"
            return f"Parameter.{ref}", "output.0"
        return f"Constant.{self.node_name(kg, consumer.name)}.{slot}", "output.0"

    def _source_node(self, kg: KernelGraph, src: tuple[str, ...], consumer: Kernel, slot: str) -> Any:
        """Register the parameter / input / constant feeding ``consumer`` (it executes now)."""
        s = self.session
        name, _ = self._source_name(kg, src, consumer, slot)
        ref = src[1]
        if src[0] == "param":
            p = kg.params.get(ref)
            weight = (ref in self.weights) if self.weights is not None else \
                (p is not None and p.is_weight and not is_optimizer_state(ref))
            if p is not None and not p.is_weight:
                node = s.node(name, kind="input", op_type=ref, scope="")
            elif weight:
                node = s.node(name, kind="parameter", op_type="Parameter", scope=consumer.scope)
            else:
                node = s.node(name, kind="constant", op_type="Parameter", scope=consumer.scope,
                              section="optimizer" if is_optimizer_state(ref) else "forward")
        else:
            node = s.node(name, kind="constant", op_type="Tensor", scope=consumer.scope, section=consumer.section)
        node.graph = kg.file  # type: ignore[attr-defined]  # the panel's graph filter
        return node

    def record(self, kg: KernelGraph, iter_dir: str, *, files: dict[str, dict[str, str]] | None = None) -> int:
        """Record one run of ``kg`` from ``iter_dir``; returns the number of kernels recorded."""
        return self.record_runs([(kg, index_iteration(iter_dir) if files is None else files)])

    def record_runs(self, runs: list[tuple[KernelGraph, dict[str, dict[str, str]]]]) -> int:
        """Record the graph runs of one call (a model with control flow runs several kernel graphs: the
        main one and its branches/loop bodies). Each graph's kernels keep their execution order; the graphs
        are interleaved by the kernels' dump timestamps, so a value born in a branch comes before what the
        main graph computed from it. A graph that runs again in the call (a loop body) names its kernels'
        nodes ``{kernel}.{k}`` for its k-th repetition. A graph input bound by the control flow (a branch's
        argument, what a branch hands back) reads the output of the latest earlier run that hands back a
        tensor of its dtype and shape (:meth:`_bind`). Returns the number of kernels recorded."""
        states = []
        queues = []
        reps: dict[int, int] = {}
        # a parameter is recorded where the step first uses it: a later graph of the same call (the
        # optimizer's) may dump it after updating it in place
        sources_done: set[str] = set()
        self._stats = {}
        for r, (kg, files) in enumerate(runs):
            rep = reps[kg.graph_id] = reps.get(kg.graph_id, -1) + 1
            first = (kg.graph_id, rep) not in self._graph_edges
            self._graph_edges.add((kg.graph_id, rep))
            pairing = match_kernel_files(kg, files, self._fingerprint, self._shape)
            matched = pairing.files
            queue = [(int(matched[k.name].get("__ts__", 0)), r, k, matched[k.name])
                     for k in kg.kernels if k.name in matched]
            start = min((q[0] for q in queue), default=0)
            states.append(_RunState(kg, rep, first, start, sources_done, pairing.uncertain))
            queues.append(queue)
        self._read(self._needed(states, queues))
        order = queues[0] if len(queues) == 1 else heapq.merge(*queues, key=lambda item: item[0])
        count = 0
        for _ts, r, k, kfiles in order:
            self._record_kernel(states, states[r], k, kfiles)
            count += 1
        self._stats = {}
        return count

    def _needed(self, states: list[_RunState], queues: list[list[tuple]]) -> list[str]:
        """The files the call's kernels will read (one batch, before recording): every output, and the inputs
        their producer's output does not stand for (a parameter's at its first use). A file left out is
        read when asked for; one read for nothing costs only its read."""
        need: list[str] = []
        params: set[str] = set()
        stats = self._stats
        for st, queue in zip(states, queues, strict=True):
            paired = {k.name: kfiles for _ts, _r, k, kfiles in queue}
            for _ts, _r, k, kfiles in queue:
                for slot, path in kfiles.items():
                    if slot[0] == "_" or path in stats:
                        continue
                    src = k.sources.get(slot) if slot[0] == "i" else None
                    if src is not None:
                        if src[0] == "kernel":
                            prod = paired.get(src[1])
                            if prod is not None and src[2] in prod and src[1] not in st.uncertain:
                                continue
                        elif src[0] == "param":
                            if src[1] in params:
                                continue
                            params.add(src[1])
                    need.append(path)
        return list(dict.fromkeys(need))

    def _stat(self, path: str) -> tuple | None:
        """``(stats row, dtype, shape, size, nbytes, why)`` of a file, read once per call; None (and a problem
        naming the file) when it cannot be read."""
        try:
            return self._stats[path]
        except KeyError:
            self._read([path])
            return self._stats[path]

    def _read(self, paths: list[str]) -> None:
        """Read ``paths`` (not read yet in this call) in one batch (:func:`files_stats`), their statistics
        written straight into rows of the step (a file's row serves every slot that shows it)."""
        start = self.buf.reserve(len(paths))
        stats = self._stats
        for i, (path, got) in enumerate(zip(paths, files_stats(paths, self.buf.rows(start, len(paths))),
                                            strict=True)):
            if isinstance(got, ValueError):
                self.problems.append((path, str(got).split(": ", 1)[-1]))
                stats[path] = None
            else:
                stats[path] = (start + i, *got[1:])

    def _fingerprint(self, path: str) -> object:
        st = self._stat(path)
        return None if st is None else (st[1], st[3], self.buf.row(st[0]).tobytes())

    def _shape(self, path: str) -> tuple[int, ...] | None:
        st = self._stat(path)
        return None if st is None else st[2]

    def _plan(self, st: _RunState, k: Kernel, kfiles: dict[str, str], key: tuple) -> _KernelPlan:
        """What recording ``k`` does whatever the values (its node's name, where each slot comes from), worked
        out once per graph, repetition and set of file keys (:class:`_KernelPlan`)."""
        kg = st.kg
        name = self._run_name(st, k.name)
        sources = []
        for slot, src in k.sources.items():
            if src[0] not in ("kernel", "bound"):
                sname = self._source_name(kg, src, k, slot)[0]
                if slot in kfiles:
                    sources.append((slot, sname, src, "__dtype__." + slot, k.device_dtypes.get(slot)))
        slots = {sl for sl in kfiles if not sl.startswith("__")}
        # a bound input is not dumped (MindSpore writes no file for a graph's parameter): its producer's is it
        slots.update(sl for sl, src in k.sources.items() if src[0] == "bound")
        plan_slots = []
        for slot in sorted(slots, key=_slot_order):
            src = k.sources.get(slot)
            mode, link = _OWN, None
            if src is not None and src[0] == "bound":
                mode = _BOUND
            elif src is not None:
                mode = _LINK
                link = (self._run_name(st, src[1]), src[2]) if src[0] == "kernel" else \
                    self._source_name(kg, src, k, slot)
            plan_slots.append((slot, mode, link, slot in kfiles, slot.startswith("output"), "__dtype__." + slot,
                               k.device_dtypes.get(slot), (name, slot)))
        plan = self._plans[key] = _KernelPlan(name, sources, plan_slots, lambda stk=k.stack: list(stk),
                                              frozenset(kfiles))
        return plan

    def _record_kernel(self, states: list[_RunState], st: _RunState, k: Kernel, kfiles: dict[str, str]) -> None:
        s = self.session
        kg = st.kg
        pkey = (kg.graph_id, st.rep, k.name)
        plan = self._plans.get(pkey)
        if plan is None or kfiles.keys() != plan.files:  # the same keys every step: compared, no set made
            plan = self._plan(st, k, kfiles, pkey)
        name = plan.name
        produced = st.produced
        # parameters, inputs and constants first consumed here execute just before it
        for slot, sname, src, dkey, device in plan.sources:
            if sname not in st.sources_done:
                st.sources_done.add(sname)
                snode = self._source_node(kg, src, k, slot)
                entry = self._load(kfiles[slot], kfiles.get(dkey, ""), device)
                if entry is not None:
                    key = (sname, "output.0")
                    self._put(snode, key, entry)
                    produced[key] = entry
                self.emit(snode)
        node = s.node(name, kind="op", op_type=k.op_type, scope=k.scope, section=k.section, stack=plan.stack)
        node.graph = kg.file  # type: ignore[attr-defined]  # the panel's graph filter
        doubt = st.uncertain.get(k.name)
        unfilled = self.unfilled.get(k.op_type, ())
        first = st.first
        put = self._put
        for slot, mode, link, dumped, output, dkey, device, key in plan.slots:
            if slot in unfilled and dumped:
                entry = self._load(kfiles[slot], kfiles.get(dkey, ""), device, UNFILLED_REASON.format(op=k.op_type))
                if entry is not None:
                    self._unwritten.add(id(entry))
                    put(node, key, entry)
                    produced[key] = entry
                continue
            entry = None
            if mode is _LINK:
                entry = produced.get(link)
                if first:
                    s.graph.add_edge(link[0], name, link[1], slot)
            elif mode is _BOUND:
                bound = self._bind(states, st, k.sources[slot])
                if bound is not None:
                    entry = bound[2]
                    s.graph.add_edge(bound[0], name, bound[1], slot)
            if entry is not None and entry[6] is None and doubt is None and dumped and id(entry) not in self._unwritten:
                entry = None  # the producer's files could not be told apart: this kernel's own file holds it
            if entry is None:
                if not dumped:
                    continue
                entry = self._load(kfiles[slot], kfiles.get(dkey, ""), device, doubt)
                if entry is None:
                    continue
            put(node, key, entry)
            if output:
                produced[key] = entry
        self.emit(node)

    def _run_name(self, st: _RunState, kernel: str) -> str:
        name = self.node_name(st.kg, kernel)
        return f"{name}.{st.rep}" if st.rep else name

    def _bind(self, states: list[_RunState], st: _RunState, src: tuple[str, ...]) -> tuple | None:
        """``(node, slot, entry)`` a bound graph input reads: among the runs of the call that started before
        this one, the latest that handed back tensors of the input's dtype and shape; None when that run
        handed back several (the binding is not certain: no value and no edge are shown) or none did."""
        idx, dtype, shape = src[1], src[2], tuple(src[3])
        if idx in st.bindings:
            return st.bindings[idx]
        found = None
        for other in sorted((o for o in states if o is not st and o.start <= st.start), key=lambda o: o.start,
                            reverse=True):
            outs = []
            for ret in other.kg.returns:
                out = other.bindings.get(ret[1]) if ret[0] == "bound" else \
                    (self._run_name(other, ret[1]), ret[2], other.produced.get((self._run_name(other, ret[1]), ret[2])))
                if out is not None and out[2] is not None and out[2][1] == dtype and tuple(out[2][2]) == shape \
                        and out[:2] not in [o[:2] for o in outs]:
                    outs.append(out)
            if outs:
                found = outs[0] if len(outs) == 1 else None
                break
        st.bindings[idx] = found
        return found

    def _load(self, path: str, dtype: str, device: str | None = None, doubt: str | None = None) -> tuple | None:
        """Statistics row and handle of one file; None (and a problem naming the file) when unreadable.

        ``device`` is the dtype the kernel really reads or writes in that slot (the IR's kernel-info line).
        When the file was written with another dtype, it is not the value used: MindSpore names and sizes
        the file by the graph's declared type (e.g. float16 under AMP O2) while a CPU kernel selected for
        float32 holds float32 in the buffer, so the file is the buffer's first bytes read as float16. Such a
        slot gets no statistics and no value, and says why (:func:`misdump_reason`). ``doubt``: why the file
        may be another kernel's (:func:`match_kernel_files`): no statistics or value either, and no path."""
        st = self._stat(path)
        if st is None:
            return None
        row, name, shape, size, nbytes, why = st
        if dtype and name != "bfloat16":
            name = dtype
        if doubt is not None:
            return self.buf.add_unknown(), device or name, shape, size, doubt, None, None, True
        if device and dtype and device != dtype:
            row = self.buf.add_unknown()
            return row, device, shape, size, misdump_reason(path, dtype, device), None, path, True
        handle = NpyRef(path, nbytes) if self.retain else None
        return row, name, shape, size, why, handle, path, False

    def _put(self, node: Any, key: tuple[str, str], entry) -> None:
        """Show ``entry`` (:meth:`_load`) as ``node``'s slot; ``key``: ``(node name, slot)``."""
        row, dtype, shape, count, why, handle, path, misdumped = entry
        s = self.session
        slot = key[1]
        if not misdumped:
            self.files[key] = (path, shape, dtype)
        i = s.recorder.add(key, row, dtype, shape, count)
        if why is not None:
            s.recorder.unsupported[i] = why
        node.shapes[slot] = shape
        node.dtypes[slot] = dtype
        if handle is not None:
            s.store.offer(key, handle)
        elif misdumped and self.retain:
            s.store.refuse(key, why)
