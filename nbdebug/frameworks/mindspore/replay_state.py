"""What a MindSpore training step needs to be computed again: its pre-step state, swapped in and out.

The same interface as ``frameworks/torch/replay_state.py`` (``find_objects``, ``keep``, ``planned_bytes``,
``keep_args``, ``fresh_args``, ``output_ref``, ``same_bits``, ``describe``). :func:`keep` copies, at a step's
start, the model's Parameters (trainable or not: BatchNorm's moving statistics are Parameters), every
Parameter an optimizer holds besides the model's (``nn.Adam``'s ``moment1``/``moment2``/``beta1_power``/
``beta2_power``, ``nn.Momentum``'s ``moments``, ``global_step``, a learning-rate Parameter), the Cells'
train flags, the RNG states (MindSpore's default generator ``mindspore.get_rng_state()``, NumPy, Python)
and the step's arguments (Tensors copied; immutable Python values by reference). Copies are host arrays
(``asnumpy``) written into the buffers of the state the window drops. Nothing is pickled.

:meth:`StepState.swap_in` copies the live values off, then writes the kept values into the live Parameters
in place (``ops.Assign``: ``set_data`` would give a Parameter new memory, which an optimizer that has run
once no longer updates), and returns a :class:`Live` that writes the live values back, bit for bit.

What MindSpore does not let a replay restore: a stateful random Primitive held by a Cell (``nn.Dropout``'s
``ops.Dropout``, ``ops.StandardNormal``, ``ops.UniformReal``…) keeps its own seed and offset inside its
kernel, which MindSpore neither exposes nor resets; a replay of a step that runs one draws other numbers.
Such Primitives are listed in ``problems_at_replay``, which a replay reports as the reason of its first
mismatch. ``mint.nn.functional.dropout`` and other ops on the default generator replay bitwise.

:class:`KeepCallback` is what ``dbg.step_fn(model)`` adds to ``mindspore.train.Model.train``: the step is the
Model's train network called on ``cb_params.train_dataset_element``; a train Cell's own Parameters (a loss
scale's ``scale_sense``) are kept with the optimizers'. Dataset sink mode is refused (:data:`SINK_REFUSED`).

GRAPH mode: the same state, written the same way (the compiled graph reads its Parameters from their
memory); during the replay's run of the compiled step the live capture of the model is muted (a capture
that is off deletes what a run dumped) and afterwards marks the replay's dump files as seen;
:func:`hold_values` reads the replayed values into memory before the replay's capture deletes its files;
:func:`unread_outputs` names the kernel outputs MindSpore leaves unwritten (left out of the bitwise check);
:func:`graph_problems` refuses sampled capture (``graph_every`` > 1).

>>> import numpy as np, mindspore as ms
>>> from mindspore import nn
>>> net = nn.Dense(2, 1); opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
>>> [type(o).__name__ for o in find_objects(lambda: opt, net)["optimizers"]]
['Momentum']
>>> state = keep(net, {"optimizers": [opt]}, (ms.Tensor(np.ones((1, 2), np.float32)),), {})
>>> before = net.weight.asnumpy().copy()
>>> _write(net.weight, np.zeros((1, 2), np.float32))
>>> live = state.swap_in(net); bool((net.weight.asnumpy() == before).all())
True
>>> live.restore(); float(net.weight.asnumpy().sum())
0.0
"""

from __future__ import annotations

import os
import random
import types
from collections.abc import Callable, Mapping
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn
from mindspore.ops.primitive import Primitive
from mindspore.train.callback import Callback

from ..core.reach import reachable_values
from .adapter import note_train_loss
from .ops import TensorBase

_IMMUTABLE = (int, float, complex, bool, str, bytes, type(None), type(Ellipsis), range, slice, frozenset,
              types.FunctionType, types.BuiltinFunctionType)

#: why a MindSpore replay may differ, when nothing more specific is known (the result's ``reason``)
GENERIC_REASON = (
    "something the step depends on is not in the kept state: a random kernel with a state of its own (a "
    "Primitive held by a Cell, a random op inside a compiled graph), randomness outside MindSpore's default "
    "generator, NumPy's and Python's, Python state the step changes (a counter, a cache, data the step reads "
    "itself instead of receiving it as an argument), or a kernel whose result depends on the run (parallel "
    "reductions without mindspore.set_deterministic(True) on a device)")

#: Primitives that draw random numbers from a seed and an offset of their own (not restorable)
RANDOM_PRIMITIVES = frozenset({
    "Dropout", "Dropout2D", "Dropout3D", "DropoutGenMask", "StandardNormal", "StandardLaplace", "UniformReal",
    "UniformInt", "UniformCandidateSampler", "Gamma", "Poisson", "Multinomial", "RandomCategorical",
    "RandomChoiceWithMask", "RandomGamma", "RandomPoisson", "TruncatedNormal", "Randperm", "LogUniformCandidateSampler",
})


# -- what the step uses -------------------------------------------------------------------------------
def find_objects(fn: Callable, model: Any, **given: Any) -> dict[str, list[Any]]:
    """The ``mindspore.nn.Optimizer`` s the step function reaches through its closure, the globals it names,
    its bound object or (a ``TrainOneStepCell``) its ``optimizer``; ``optimizers=`` replaces what is found.
    ``scalers``/``schedulers`` are PyTorch's: MindSpore's loss scale and learning rate live in Parameters of
    the optimizer or the train Cell."""
    found: dict[str, list[Any]] = {"optimizers": [], "scalers": [], "schedulers": [], "cells": []}
    inner = getattr(fn, "__wrapped__", fn)
    values: list[Any] = [getattr(inner, "optimizer", None)] if isinstance(inner, nn.Cell) else []
    if isinstance(inner, nn.Cell):  # a train Cell's own Parameters (a loss scale's scale_sense) are kept too
        found["cells"].append(inner)
    for v in values + reachable_values(fn):
        if isinstance(v, nn.Optimizer) and not any(v is o for o in found["optimizers"]):
            found["optimizers"].append(v)
    for kind, objs in given.items():
        if kind not in found:
            raise TypeError(f"step_fn: unknown keyword {kind!r}; use optimizers=")
        if objs is not None and kind not in ("optimizers", "cells"):
            raise TypeError(f"step_fn: {kind}= is PyTorch's; a MindSpore step keeps its optimizers' Parameters")
        if objs is not None:
            found[kind] = list(objs) if isinstance(objs, (list, tuple)) else [objs]
    return found



def random_primitives(model: Any) -> list[str]:
    """``"<cell>: <Primitive>"`` for every stateful random Primitive the model's Cells hold."""
    out = []
    for name, cell in model.cells_and_names():
        for attr, v in vars(cell).items():
            if isinstance(v, Primitive) and type(v).__name__ in RANDOM_PRIMITIVES:
                out.append(f"{name or type(model).__name__}.{attr}: {type(v).__name__}")
    return out


# -- copies -------------------------------------------------------------------------------------------
def _host(t: Any) -> np.ndarray:
    return np.asarray(t.asnumpy())


def _copy(key: str, t: Any, recycle: dict[str, np.ndarray]) -> np.ndarray:
    arr = _host(t)
    buf = recycle.pop(key, None)
    if buf is not None and buf.shape == arr.shape and buf.dtype == arr.dtype:
        np.copyto(buf, arr)
        return buf
    return arr.copy()


def _tensor(arr: np.ndarray, like: Any) -> Any:
    return ms.Tensor(arr.copy(), dtype=like.dtype)


_ASSIGN: list[Any] = []


def _write(p: Any, arr: np.ndarray) -> None:
    """``arr`` into the Parameter ``p``'s own memory (an unwrapped ``Assign`` Primitive of this module)."""
    if not _ASSIGN:
        from mindspore.ops import operations

        _ASSIGN.append(operations.Assign())
    _ASSIGN[0](p, _tensor(arr, p))


def _walk(value: Any, fn: Callable[[str, Any], Any], path: str, problems: list[str]) -> Any:
    """``value`` with every Tensor replaced by ``fn(path, tensor)``; lists/tuples/dicts rebuilt."""
    if isinstance(value, TensorBase):
        return fn(path, value)
    if isinstance(value, _IMMUTABLE) or isinstance(value, ms.dtype.Type):
        return value
    if type(value) in (list, tuple):
        return type(value)(_walk(v, fn, f"{path}[{i}]", problems) for i, v in enumerate(value))
    if type(value) is dict:
        return {k: _walk(v, fn, f"{path}[{k!r}]", problems) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return value.copy()
    problems.append(f"{path} is a {type(value).__name__}, a mutable value that is not a Tensor or a container "
                    f"of Tensors: the replay would see its value of now, not the one the step received")
    return value


def _clone(_path: str, t: Any) -> Any:
    return ms.Tensor(_host(t).copy(), dtype=t.dtype)


# -- RNG ----------------------------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """MindSpore's default generator, NumPy's and Python's states."""
    np_state = np.random.get_state()
    return {"python": random.getstate(), "numpy": (np_state[0], np_state[1].copy()) + tuple(np_state[2:]),
            "mindspore": ms.Tensor(_host(ms.get_rng_state()).copy())}


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    ms.set_rng_state(ms.Tensor(_host(state["mindspore"]).copy()))


# -- the kept state -----------------------------------------------------------------------------------
class StepState:
    """The state one step started from (see the module docstring)."""

    def __init__(self) -> None:
        self.tensors: dict[str, np.ndarray] = {}  # "param:<name>" / "opt<i>:<name>" host copies
        self.params: dict[str, Any] = {}  # the same keys: the live Parameter each copy belongs to
        self.grads: dict[str, Any] = {}  # MindSpore's gradients are values, not Parameter attributes
        self.optimizers: list[Any] = []
        self.scalers: list[Any] = []
        self.schedulers: list[Any] = []
        self.training: list[bool] = []
        self.rng: dict[str, Any] = {}
        self.args: tuple = ()
        self.kwargs: dict = {}
        self.problems: list[str] = []
        self.nbytes = 0
        self.held = 0
        self.random_ops: list[str] = []
        self.problems_at_replay: list[str] = []

    def recyclable(self) -> dict[str, np.ndarray]:
        out, self.tensors = self.tensors, {}
        return out

    def swap_in(self, model: Any) -> Live:
        """Install copies of this state into the live Parameters, flags and RNGs; returns what puts them back."""
        live = Live(model)
        live.muted = _mute_graph_capture(model)
        self.problems_at_replay = []
        if self.random_ops:
            self.problems_at_replay.append(
                "the model holds stateful random ops (" + ", ".join(self.random_ops) + ") whose seed and "
                "offset MindSpore keeps inside the kernel and does not expose for saving: the replay draws "
                "other random numbers (use mint.nn.functional.dropout, which draws from the default generator "
                "the replay restores)")
        try:
            live.training = [c.training for _, c in model.cells_and_names()]
            for (_, c), flag in zip(model.cells_and_names(), self.training, strict=False):
                c.training = flag
            for key, p in self.params.items():
                live.values.append((p, _host(p).copy()))
                _write(p, self.tensors[key])
            set_rng_state(self.rng)
        except BaseException:
            live.restore()
            raise
        return live


class Live:
    """The live values taken off by :meth:`StepState.swap_in`; :meth:`restore` puts them back."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.rng = rng_state()
        self.training: list[bool] = []
        self.values: list[tuple[Any, np.ndarray]] = []
        self.muted: list[Any] = []

    def restore(self) -> None:
        _unmute_graph_capture(self.muted)
        self.muted = []
        for (_, c), flag in zip(self.model.cells_and_names(), self.training, strict=False):
            c.training = flag
        for p, arr in self.values:
            _write(p, arr)
        set_rng_state(self.rng)
        self.values = []


def _params(model: Any, objects: Mapping[str, list[Any]]) -> dict[str, Any]:
    """``key -> Parameter``: the model's, then each optimizer's own (those not the model's), then a train
    Cell's own (those of neither)."""
    out = {f"param:{n}": p for n, p in model.parameters_and_names()}
    ids = {id(p) for p in out.values()}
    for i, opt in enumerate(objects.get("optimizers", ())):
        for n, p in opt.parameters_and_names():
            if id(p) not in ids:
                ids.add(id(p))
                out[f"opt{i}:{n}"] = p
    for i, cell in enumerate(objects.get("cells", ())):
        for n, p in cell.parameters_and_names():
            if id(p) not in ids:
                ids.add(id(p))
                out[f"cell{i}:{n}"] = p
    return out


def planned_bytes(model: Any, objects: Mapping[str, list[Any]]) -> int:
    """Bytes :func:`keep` will copy for ``model`` and ``objects``."""
    return sum(int(np.prod(p.shape)) * p.itemsize for p in _params(model, objects).values())


def keep(model: Any, objects: Mapping[str, list[Any]], args: tuple, kwargs: dict,
         recycle: Mapping[str, np.ndarray] | None = None) -> StepState:
    """The pre-step state of ``model`` and ``objects`` (:func:`find_objects`) and the step's arguments."""
    s = StepState()
    rec = dict(recycle or {})
    s.optimizers = list(objects.get("optimizers", ()))
    s.training = [c.training for _, c in model.cells_and_names()]
    s.params = _params(model, objects)
    for key, p in s.params.items():
        s.tensors[key] = _copy(key, p, rec)
        s.nbytes += s.tensors[key].nbytes
    s.rng = rng_state()
    s.random_ops = random_primitives(model)
    s.problems += graph_problems(model)
    s.args = _walk(args, _clone, "args", s.problems)
    s.kwargs = _walk(kwargs, _clone, "kwargs", s.problems)
    return s


def keep_args(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[str]]:
    """A later call's arguments within the same step: copied, with problems."""
    problems: list[str] = []
    return _walk(args, _clone, "args", problems), _walk(kwargs, _clone, "kwargs", problems), problems


def fresh_args(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Fresh copies of kept arguments for one run."""
    sink: list[str] = []
    return _walk(args, _clone, "args", sink), _walk(kwargs, _clone, "kwargs", sink)


def output_ref(value: Any) -> Any:
    """The step's returned loss as a host array (a copy: later steps do not change it), or None."""
    if isinstance(value, (tuple, list)) and value:
        value = value[0]
    return _host(value).copy() if isinstance(value, TensorBase) else None


def same_bits(a: Any, b: Any) -> bool:
    """Whether two kept outputs hold the same bits (NaN payloads included)."""
    if a is None or b is None:
        return a is None and b is None
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.tobytes() == b.tobytes()


def describe(value: Any) -> str:
    """A short text of a kept output (the loss in a mismatch message)."""
    if value is None:
        return "None"
    return repr(float(value)) if value.size == 1 else f"array of shape {value.shape}"


# -- mindspore.train.Model ----------------------------------------------------------------------------
#: why a step of Model.train in dataset sink mode cannot be kept
SINK_REFUSED = (
    "Model.train(..., dataset_sink_mode=True) cannot be replayed: in sink mode the train network reads its "
    "batches from the device's data queue inside the compiled graph (sink_size steps per call), so the "
    "batch of a step never reaches the host and the callbacks see one call per sink, not one per step; "
    "train with dataset_sink_mode=False (MindSpore turns sink mode off on CPU by itself)")


def is_train_model(obj: Any) -> bool:
    """Whether ``obj`` is a ``mindspore.train.Model``."""
    from mindspore.train import Model

    return isinstance(obj, Model)


def check_model(model: Any, net: Any) -> None:
    """Refuse a Model whose steps cannot be kept: GRAPH mode, a train network that is not the Debugger's
    model's, one without an optimizer."""
    train_net = model.train_network
    if train_net is None or getattr(train_net, "optimizer", None) is None:
        raise ValueError("step_fn(model): this Model has no train network with an optimizer (build it with "
                         "Model(network, loss_fn, optimizer))")
    first = next(iter(net.get_parameters()), None)
    if first is not None and not any(p is first for p in train_net.get_parameters()):
        raise ValueError("step_fn(model): the Model does not train the Debugger's model (give the Debugger "
                         "the network passed to Model)")
    find_objects(train_net, net)  # GRAPH mode: refused with the reason


class KeepCallback(Callback):
    """The callback ``dbg.step_fn(model)`` adds to ``Model.train``: at each step's begin the pre-step state
    and the batch (``cb_params.train_dataset_element``) are kept for the train network (the step
    function the replay calls: forward, backward and optimizer update); at its end the step's output
    (its loss) is kept and the step ends."""

    def __init__(self, keeper: Any, rs: Any) -> None:
        super().__init__()
        self.keeper = keeper
        self.rs = rs
        self.step: int | None = None
        self.found: tuple[Any, dict] | None = None

    def on_train_begin(self, run_context: Any) -> None:
        cb = run_context.original_args()
        if cb.get("dataset_sink_mode", False):
            raise ValueError(SINK_REFUSED)
        self.keeper.dbg._adapter.auto_step = False  # this callback ends each step

    def on_train_step_begin(self, run_context: Any) -> None:
        k, cb = self.keeper, run_context.original_args()
        self.step = None
        if k.replaying or k.in_step or k.window == 0 or k.dbg.closed:
            return
        net, batch = cb.train_network, cb.get("train_dataset_element")
        if batch is None:
            raise ValueError(SINK_REFUSED)
        model = k.dbg._adapter.model_ref()
        if self.found is None or self.found[0] is not net:
            self.found = (net, find_objects(net, model))
        self.step = k.begin(net, self.rs, model, self.found[1], tuple(batch), {})

    def on_train_step_end(self, run_context: Any) -> None:
        dbg = self.keeper.dbg
        if not dbg.closed and len(dbg.session.recorder):
            note_train_loss(dbg._adapter, run_context)
        if self.step is not None:
            step, self.step = self.step, None
            self.keeper.end(step, self.rs, run_context.original_args().net_outputs, True)
        elif not dbg.closed and len(dbg.session.recorder):
            dbg._adapter.end_step()  # a step not kept (replay_window=0) still ends


# -- GRAPH mode -----------------------------------------------------------------------------------------
def _graph_adapters(model: Any) -> list[Any]:
    """The live GRAPH-mode captures of ``model`` (none in PyNative mode)."""
    if ms.get_context("mode") != ms.GRAPH_MODE:
        return []
    from .graph_live import _RUNS

    return [a for a in _RUNS.adapters if a.model_ref() is model]


def graph_problems(model: Any) -> list[str]:
    """Why a GRAPH-mode step of ``model`` cannot be replayed (sampled capture), or nothing."""
    for a in _graph_adapters(model):
        if a.sampling is not None:
            k = a.sampling.every
            return [f"Debugger(graph_every={k}) has MindSpore dump only the graph runs it listed at the first "
                    f"compile (0, {k}, {2 * k}, …): MindSpore reads its dump config once per process and a "
                    f"replay's run of the compiled step is another run, dumped only if its number is on that "
                    f"list; replay needs graph_every=1 in GRAPH mode (or PyNative mode)"]
    return []


def _mute_graph_capture(model: Any) -> list[Any]:
    """GRAPH mode: the live captures of ``model`` leave the replay's graph run to the replay's capture (a
    live capture that is off deletes what a run dumped)."""
    muted = _graph_adapters(model)
    for a in muted:
        a.after_run = _ignore_run
    return muted


def _ignore_run(obj: Any = None) -> None:
    return None


def _unmute_graph_capture(muted: list[Any]) -> None:
    """The live captures back: the replay's dump files are marked as seen (they are not a live step's)."""
    for a in muted:
        vars(a).pop("after_run", None)
        for rank in a._rank_dirs():
            a._new_files(rank)


def hold_values(session: Any) -> None:
    """GRAPH mode: the replayed step's values live in dump files that its capture deletes when it closes;
    read them into memory first (a replay keeps every tensor of its step, as in PyNative mode)."""
    from .graph_live import _Copy
    from .kernel_recorder import NpyRef

    store = session.store
    for which in ("current", "previous"):
        table = getattr(store, which)
        loaded: dict[int, Any] = {}
        for key, h in list(table.items()):
            if isinstance(h, NpyRef) and os.path.exists(h.path):
                if id(h) not in loaded:
                    loaded[id(h)] = _Copy(h.numpy())
                table[key] = loaded[id(h)]


#: kernels whose outputs past the first MindSpore's CPU kernels do not fill in training (batch statistics and
#: reserve spaces: their dumped values are the memory's previous contents)
UNFILLED_OUTPUTS = {"BatchNorm": ("output.1", "output.2", "output.3", "output.4")}


def unread_outputs(session: Any) -> set[tuple[str, str]]:
    """GRAPH mode: the slots of the replayed step whose dumped values are not something the step computed —
    kernel outputs no kernel of the step reads, the outputs of :data:`UNFILLED_OUTPUTS` (the CPU
    ``BatchNorm`` in training writes ``y`` and the moving statistics, not its batch-statistics outputs) and
    the inputs those feed — so a difference there is not the step computing otherwise. Empty in PyNative
    mode."""
    if ms.get_context("mode") != ms.GRAPH_MODE:
        return set()
    g = session.graph
    read = {(src, a) for (src, _dst), slots in g.edges.items() for a, _b in slots}
    out = {(name, slot) for name, n in g.nodes.items() if n.kind == "op"
           for slot in n.shapes if slot.startswith("output.") and (name, slot) not in read}
    unfilled = {(name, slot) for name, n in g.nodes.items() for slot in UNFILLED_OUTPUTS.get(n.op_type, ())
                if slot in n.shapes}
    fed = {(dst, b) for (src, dst), slots in g.edges.items() for a, b in slots if (src, a) in unfilled}
    return out | unfilled | fed
