"""MindSpore GRAPH mode, live: MindSpore's kernel dump read back after every graph run.

Attaching arms the dump (:func:`~nbdebug.frameworks.mindspore.graph.arm_kernel_dump`: a config in a
private temporary directory, ``MINDSPORE_DUMP_CONFIG`` set before the first graph compile) and wraps
the two places where compiled graphs run (``_CellGraphExecutor.__call__`` for Cells, ``_JitExecutor.__call__``
for ``mindspore.jit`` functions). After each run the new ``{graph}/{iteration}`` directory is read:
kernels become nodes named by their full scope name, in execution order, with their ``.npy`` files as
slots (statistics on the host with the native kernel; values retained as file handles). Nodes are
announced one by one (so ``check="node"`` watchpoints, ``run_to`` and ``next_node`` work while the step
is replayed) and the run ends the step — unless the user marks steps with ``Debugger.step()`` or
:class:`~nbdebug.frameworks.mindspore.adapter.StepCallback`. Control therefore acts between
training-step calls: the graph has already run when its nodes are shown.

Graphs that use the model's parameters are recorded, with the weightless graphs that ran in the same call
(the branches and loop bodies of a model with control flow), interleaved by dump timestamp; other graphs
are deleted unread. Kernels of ``ms.jit`` functions get their Cell scopes back from the IR
(:mod:`~nbdebug.frameworks.mindspore.scopes`). The dump keeps
the iterations still needed (current and previous step; older ones are deleted in the background,
:mod:`~nbdebug.frameworks.mindspore.dump_files`); closing deletes the dumped tensors (the small
graph files stay until the process exits, when the whole temporary directory is removed).
"""

from __future__ import annotations

import functools
import os
import re
import threading
import weakref
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn

try:  # mindspore.common.api is deprecated since 2.9 and says so on stderr when imported
    from mindspore.graph.api import _pynative_executor
except ImportError:  # pragma: no cover - older MindSpore
    from mindspore.common.api import _pynative_executor

from ...session.level import Level
from ...session.session import Session
from ..core.recording import announce
from ..native_stderr import native_stderr
from . import graph as kd
from .dump_files import DumpScanner, FileRemover
from .scopes import recover_cell_scopes

try:
    from mindspore.graph import api as _gapi
except ImportError:  # pragma: no cover - older MindSpore keeps these in common.api
    from mindspore.common import api as _gapi

_GRAPH_CACHE: dict[tuple[str, int], kd.KernelGraph] = {}
_LOSS_KEY = [("Run", "loss")]  # the one monitor series of GRAPH mode (Debugger.record_loss, Model.train's loss)

#: what MindSpore's core logs on fd 2 when a traced function's source file is not on disk (a notebook
#: cell's): two lines per function and compile, harmless; kept out of the output unless the run fails
_NOISE = re.compile(r"\] (GetRealPath\] Get realpath failed|ReadSectionDebugInfoFromFile\] The file .* may not exist)")


class _Copy:
    """Retention handle for an initial parameter value (a host copy)."""

    __slots__ = ("array", "nbytes", "__weakref__")

    def __init__(self, array: np.ndarray) -> None:
        self.array = array
        self.nbytes = int(array.nbytes)

    def numpy(self) -> np.ndarray:
        return self.array.copy()


class _RunPatch:
    """Wraps the graph executors once the dump is armed, and keeps them wrapped.

    MindSpore cannot switch its kernel dump off once it has read the config, so when no debugger is
    attached the wrapper only deletes what each graph run dumped (outputs are untouched either way).
    """

    def __init__(self) -> None:
        self.adapters: list[GraphAdapter] = []
        self.installed = False
        self.lock = threading.Lock()
        self.depth = threading.local()

    def install(self, adapter: GraphAdapter | None = None) -> None:
        with self.lock:
            if adapter is not None:
                self.adapters.append(adapter)
            if self.installed:
                return
            for cls in (getattr(_gapi, "_CellGraphExecutor", None), getattr(_gapi, "_JitExecutor", None)):
                if cls is not None:
                    cls.__call__ = self._wrap(cls.__call__)
                    if "compile" in vars(cls):
                        cls.compile = _quiet(cls.compile)
            self.installed = True

    def uninstall(self, adapter: GraphAdapter) -> None:
        with self.lock:
            if adapter in self.adapters:
                self.adapters.remove(adapter)

    def _wrap(self, call: Any) -> Any:
        patch = self

        def __call__(executor, *args, **kwargs):
            depth = getattr(patch.depth, "n", 0)
            patch.depth.n = depth + 1
            try:
                with native_stderr(_NOISE):
                    out = call(executor, *args, **kwargs)
            finally:
                patch.depth.n = depth
            if depth == 0:
                _forget_config()
                adapters = list(patch.adapters)
                for a in adapters:
                    a.after_run(args[0] if args else None)
                if not adapters:
                    _sweep()
            return out

        __call__.__nbdebug_wrapped__ = True
        __call__.__wrapped__ = call
        return __call__


def _quiet(compile_: Any) -> Any:
    @functools.wraps(compile_)
    def compile(executor, *args, **kwargs):
        with native_stderr(_NOISE):
            return compile_(executor, *args, **kwargs)

    return compile


def arm(parse_now: bool = True, graph_every: int = 1) -> str:
    """Arm MindSpore's kernel dump for this process now (before any GRAPH-mode compile) and start
    cleaning up after graph runs; returns the dump directory. ``Debugger`` does this on attach in
    GRAPH mode; call it early when a graph may be compiled before the debugger is created.

    ``parse_now`` compiles a one-op graph at once so that MindSpore reads the config now; the
    environment variable is then removed, and child processes do not inherit it. ``graph_every``: as
    the ``Debugger`` option (MindSpore dumps every k-th run only; fixed for the process)."""
    kd.arm_kernel_dump(graph_every)
    _RUNS.install()
    if parse_now:
        ms.jit(_one)(ms.Tensor(np.zeros(1, np.float32)))
    return kd.armed_dump_dir()


def _one(x):
    return x + 1


def _forget_config() -> None:
    """MindSpore has compiled a graph, so it has read the dump config: drop the variable (children of
    this process must not write into this process's dump)."""
    cfg = kd.armed_config()
    if cfg is not None and os.environ.get(kd.ENV) == cfg:
        del os.environ[kd.ENV]


_SWEEPERS: dict[str, DumpScanner] = {}


def _sweep() -> None:
    """No debugger attached: delete the tensors MindSpore just dumped."""
    dump = kd.armed_dump_dir()
    if dump and os.path.isdir(dump):
        _pynative_executor.sync()
        for rank in kd.find_rank_dirs(dump):
            scanner = _SWEEPERS.setdefault(rank, DumpScanner(rank))
            for _, _, path, names in scanner.new_files():
                kd.remove_files(os.path.join(path, f) for f in names)


_RUNS = _RunPatch()


def _call_runs(batch: list[tuple]) -> list[tuple[kd.KernelGraph, dict[str, dict[str, str]]]]:
    """The graph runs of one call in time order, a loop body's repetitions (several runs of one graph in
    its iteration directory) apart."""
    runs = [(ts, i, kg, files) for i, (kg, path, names, _f) in enumerate(batch)
            for ts, files in kd.split_names(path, names)]
    runs.sort(key=lambda r: (r[0], r[1]))
    return [(kg, files) for _ts, _i, kg, files in runs]


class _Sampling:
    """Which graph runs are the model's, and why a step was not captured (``graph_every`` > 1).

    MindSpore counts the runs of each graph and dumps the listed ones (:func:`~.graph.sampled_iterations`);
    a run that dumped nothing is a skipped step when it ran a Cell holding the model's parameters (a
    training cell around the model) or an ``ms.jit`` function (taken to be the training step)."""

    def __init__(self, every: int, model: nn.Cell) -> None:
        self.every = every
        self.weight_ids = {id(p) for p in model.get_parameters()}
        self._cells: dict[int, bool] = {}
        self.skipped_run = False
        self.last_iteration: int | None = None  # MindSpore's iteration of the last captured run

    def is_model_run(self, obj: Any) -> bool:
        if not isinstance(obj, nn.Cell):
            return True
        known = self._cells.get(id(obj))
        if known is None:
            known = self._cells[id(obj)] = any(id(p) in self.weight_ids for p in obj.get_parameters())
        return known

    def captured(self, iter_dir: str) -> None:
        name = os.path.basename(iter_dir)
        if name.isdigit():
            self.last_iteration = int(name)

    def reason(self, step: int) -> str:
        k, last = self.every, (kd.SAMPLED_CAPTURES - 1) * self.every
        why = (f"step {step} was not captured: Debugger(graph_every={k}) has MindSpore dump every {k}th run "
               f"of the training graph only (its runs 0, {k}, {2 * k}, … {last})")
        if self.last_iteration is not None and self.last_iteration >= last:
            why += f"; run {last} was the last one captured (the list MindSpore scans each run is kept short)"
        return why


class GraphAdapter:
    """Attaches to one ``mindspore.nn.Cell`` trained in GRAPH mode and feeds a :class:`Session`."""

    framework = "mindspore"

    def __init__(self, model: nn.Cell, level: str, session: Session, *, retain: bool = True,
                 graph_every: int = 1) -> None:
        self.level = Level(level)
        self.session = session
        self.model_ref = weakref.ref(model)
        self.model_class = type(model).__name__
        self.capturing = True
        self.busy = False
        self.closed = False
        self.retain = retain
        self.tap = None
        self.auto_step = True
        #: "optimizer" while a finished run is replayed: a terminate request lets the replay complete
        #: (the parameters are already updated) and unwinds at the step end
        self.section = "forward"
        self._lock = threading.RLock()
        self.root = kd.arm_kernel_dump(graph_every)
        self.dump_dir = kd.armed_dump_dir()
        self.weights = {p.name for p in model.get_parameters()}
        #: sampled capture (``graph_every`` > 1): runs of the model MindSpore did not dump are steps with
        #: no statistics (:meth:`Session.skip_step`); :class:`_Sampling` tells them apart
        self.sampling = _Sampling(graph_every, model) if graph_every > 1 else None
        #: finds the dump files not read yet (those found at attach are another debugger's)
        self._scanners: dict[str, DumpScanner] = {}
        #: deletes the files of finished steps in the background
        self.remover = FileRemover()
        self._step_files: dict[int, list[str]] = {}
        #: the kernel graphs whose Cell scopes were recovered for this model (by id; the graph kept alive)
        self._scoped: dict[int, kd.KernelGraph] = {}
        self.runs = 0
        self._loss: tuple[int, Any] | None = None  # (priority, loss) of the step in progress: Run.loss
        self._loss_step = -1  # the last step whose Run.loss is recorded
        unfilled = kd.CPU_UNFILLED_OUTPUTS if ms.get_context("device_target") == "CPU" else None
        self.recorder = kd.RunRecorder(session, retain=retain, weights=self.weights, emit=self._emit_node,
                                       unfilled=unfilled)
        session.raw_source = self.recorder.raw
        session.kernel_graphs = {}  # type: ignore[attr-defined]
        if not _RUNS.adapters:
            _sweep()  # leftovers of runs nobody read
        for rank in self._rank_dirs():
            self._new_files(rank)  # another debugger's files are not ours
        if retain:
            for p in model.get_parameters():
                arr = p.asnumpy().copy() if p.dtype != ms.bfloat16 else p.astype(ms.float32).asnumpy().copy()
                session.store.offer((f"Parameter.{p.name}", "output.0"), _Copy(arr), "initial")
        _RUNS.install(self)

    # -- the dump ---------------------------------------------------------------------------------
    def _rank_dirs(self) -> list[str]:
        return kd.find_rank_dirs(self.dump_dir) if os.path.isdir(self.dump_dir) else []

    def _new_files(self, rank: str) -> list[tuple[int, int, str, list[str]]]:
        """(iteration, graph id, directory, new file names) since the last look."""
        return self._scanners.setdefault(rank, DumpScanner(rank)).new_files()

    def _graph(self, rank_dir: str, graph_id: int) -> kd.KernelGraph:
        key = (os.path.basename(rank_dir), graph_id)
        kg = _GRAPH_CACHE.get(key)
        if kg is None:
            kg = _GRAPH_CACHE[key] = kd.load_kernel_graph(rank_dir, graph_id)
        if id(kg) not in self._scoped:  # once per graph: the kernels and the model's Cells stay as they are
            recover_cell_scopes(kg.kernels, self.model_ref())  # ms.jit functions compile without Cell scopes
            self._scoped[id(kg)] = kg
        return kg

    def after_run(self, obj: Any = None) -> None:
        """A compiled graph finished running (``obj``: the Cell it compiled, else None): record what it
        dumped; with sampled capture, a run of the model that dumped nothing is a step not captured."""
        if self.closed:
            return
        _pynative_executor.sync()  # the graph runs on after the call returns; so does its dump
        ranks = self._rank_dirs()
        if not ranks:
            raise RuntimeError(
                "MindSpore wrote no kernel dump for this graph: it reads MINDSPORE_DUMP_CONFIG only when it "
                "compiles the first graph of the process, and a graph was compiled before this Debugger was "
                "created. Restart the kernel and create nbdebug.Debugger(...) before the first GRAPH_MODE call.")
        rank = ranks[0]
        batch = []
        for _it, g, path, names in self._new_files(rank):
            prefix = os.path.join(path, "")
            files = [prefix + f for f in names]
            if not self.capturing:
                kd.remove_files(files)
                continue
            batch.append((self._graph(rank, g), path, names, files))
        # This model's graphs have its weights; a graph of the same call that holds none of another attached
        # model's (a branch or loop body of a model with control flow, the loss and optimizer graph split
        # off by a loop, which holds only the optimizer's state) belongs to the call when one of ours ran.
        ours = [b for b in batch if b[0].weight_names & self.weights]
        others = set().union(*(a.weights for a in _RUNS.adapters if a is not self))
        mine = [b for b in batch if b in ours or (ours and not b[0].weight_names & others)]
        if len(_RUNS.adapters) == 1:  # graphs that run neither this model nor another's
            for b in batch:
                if b not in mine:
                    kd.remove_files(b[3])
        for kg, _path, _names, files in mine:
            self.session.kernel_graphs[kg.file] = kg.graph_id  # type: ignore[attr-defined]
            self._step_files.setdefault(self.session.step_index, []).extend(files)
        if not mine:
            if self.sampling is not None and self.capturing and self.sampling.is_model_run(obj):
                self.sampling.skipped_run = True
                if self.auto_step:
                    self.end_step()
            return
        if self.sampling is not None:
            self.sampling.captured(mine[0][1])
        self.section = "optimizer"
        try:
            self.recorder.record_runs(_call_runs(mine))
        finally:
            self.section = "forward"
        self.runs += len(mine)
        if self.auto_step:
            self.end_step()

    def _emit_node(self, node: Any) -> None:
        announce(self, node)

    # -- steps ------------------------------------------------------------------------------------
    def note_loss(self, loss: Any, priority: int = 2) -> None:
        """The step's loss, the monitor's ``Run.loss`` (the only series in GRAPH mode): ``Debugger.record_loss``
        (priority 2) over ``Model.train``'s own (1). Read at once: the graph has run."""
        if getattr(loss, "size", 1) != 1:
            raise ValueError(f"the loss must be a single value, got a tensor of shape {tuple(loss.shape)}")
        value = float(loss.asnumpy().reshape(-1)[0]) if hasattr(loss, "asnumpy") else float(loss)
        done = self.session.step_index - 1
        if self._loss is None and not len(self.session.recorder) and done >= 0:
            if self._loss_step != done:  # the run that computed it has ended its step: the loss is that step's
                self._record_loss(done, value)
            return
        if self._loss is None or priority >= self._loss[0]:
            self._loss = (priority, value)

    def _record_loss(self, step: int, value: float) -> None:
        self._loss_step = step
        self.session.monitor.record(step, _LOSS_KEY, np.array([value]))

    def end_step(self) -> None:
        with self._lock:
            sampling = self.sampling
            if sampling is not None and sampling.skipped_run and not len(self.session.recorder):
                self.session.skip_step(sampling.reason(self.session.step_index))
            else:
                raw = self.recorder.raw()
                self.session.end_step(raw)
            loss, self._loss = self._loss, None
            if loss is not None:
                self._record_loss(self.session.step_index - 1, loss[1])
            if sampling is not None:
                sampling.skipped_run = False
            self.recorder.new_step()
            self._prune()
        self.busy = True
        try:
            self.session.emit("step", self.session.step_index - 1)
        finally:
            self.busy = False

    def _prune(self) -> None:
        """Keep the files of the current and previous step only (the store holds nothing older); with
        ``retain=False`` nothing of a finished step."""
        keep_from = self.session.step_index - (2 if self.retain else 0)
        self.remover.flush()  # the previous step's deletions are done: at most one step's are pending
        for step in [s for s in self._step_files if s < keep_from]:
            self.remover.remove(self._step_files.pop(step))

    def thread_exit(self) -> None:
        self.busy = False
        self.section = "forward"
        if len(self.session.recorder) and not self.closed:
            self.end_step()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.capturing = False
        _RUNS.uninstall(self)
        for rank in self._rank_dirs():  # later debuggers may re-run these graphs: keep them parsed
            for g in kd.graph_ids(rank):
                try:
                    self._graph(rank, g)
                except ValueError:
                    pass
        # the tensors go now; the small graph files stay until exit (MindSpore creates its directories
        # once per process and would fail to write into removed ones)
        self.remover.flush()
        if not _RUNS.adapters:
            _sweep()
        else:
            kd.remove_files(p for ps in self._step_files.values() for p in ps)
        self._step_files.clear()
