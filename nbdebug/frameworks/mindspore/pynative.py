"""MindSpore PyNative capture: Cell hooks and op wrappers in, framework-neutral session events out.

* L0 — Cell hooks: forward inputs, outputs and parameters of every Cell call (``Cell.fc1.Dense.forward.0``),
  its backward (``Cell.fc1.Dense.backward.0``: gradient probes — ``ops.HookBackward`` identities — put in
  front of the call's inputs and behind its outputs give that call's own gradients), parameter gradients
  (``Cell.fc1.Dense.parameters_grad.0``, slots ``weight``/``bias``, via ``Parameter.register_hook``).
* L1 — ``mindspore.ops`` (``Functional.relu.0.forward``), ``mindspore.mint`` (``Mint.abs.0.forward``),
  ``mindspore.mint.nn.functional`` (``MintFunctional.…``), Tensor methods (``Tensor.__add__.0.forward``)
  and the Primitives held by the model's Cells (``Primitive.conv2d.Conv2D.0.forward``) are wrapped
  while attached; each wrapped call is a node with its backward (``….backward``).
* mix — both.
* monitor — no graph, no statistics: the per-step norms of :mod:`~nbdebug.frameworks.mindspore.monitor`.

Parameters are nodes (``Parameter.{name}``); ``optimizer(grads)`` — any ``mindspore.nn.Optimizer``
holding the model's parameters — is its own section (``Optimizer.SGD.step.0``) and ends the step
unless the user marks steps with ``Debugger.step()`` (or :class:`~nbdebug.frameworks.mindspore.adapter.StepCallback`
under ``mindspore.train.Model``).

Nothing of a fresh tensor is read on the hot path: MindSpore runs PyNative ops asynchronously and even
``dtype`` or ``shape`` of a result waits for its queue, so statistics, shapes, dtypes and retained values
are settled at flushes (step end, before ``optimizer(grads)``, before in-place ops, on any read).
Parameters are never replaced by probes (ops may update them in place, as BatchNorm does its moving
statistics); their gradients are the ``parameters_grad`` nodes.

Closing removes every hook and puts every wrapped function, method and Primitive class back.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import mindspore as ms
from mindspore import nn, ops
from mindspore._c_expression import MixedPrecisionType
from mindspore.common.parameter import Parameter
from mindspore.ops.primitive import Primitive

try:  # mindspore.common.api is deprecated since 2.9 and says so on stderr when imported
    from mindspore.graph.api import _pynative_executor
except ImportError:  # pragma: no cover - older MindSpore
    from mindspore.common.api import _pynative_executor

from ...session.session import Session
from ..core.calls import module_base, parent_scope
from ..core.capture import LEVELS, Capture
from .op_patches import _JIT, _OPS, _OPT, _PRIM_INFO, _SKIP_PRIMITIVES, _grad_recording, _is_tensor, _recording_class
from .ops import MindSporeOps, MSRef

__all__ = ["LEVELS", "MSRef", "PyNativeAdapter"]

#: MindSpore's CPU ``BatchNorm`` writes ``y`` and, in training, the batch mean and variance (outputs 3 and 4);
#: outputs 1 and 2 (and in inference 1–4) are left as the buffer was: not values the step computed
_UNWRITTEN_REASON = ("MindSpore's CPU BatchNorm kernel does not write this output: the tensor holds whatever "
                     "its buffer held, not a value the step computed")


def _uncast(probe: Any, *tensors: Any) -> Any:
    """``probe(*tensors)`` with no mixed-precision cast: inside a Cell set to a dtype (``to_float``, AMP O2's
    LayerNorm in float32) MindSpore casts every op's inputs, so the identity probe would hand the Cell a cast
    input (the cast moved in front of its ops changes their gradients)."""
    _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET)  # pushed; popped below
    try:
        return probe(*tensors)
    finally:
        _pynative_executor.set_mixed_precision_type(MixedPrecisionType.NOTSET, False)


def _copied_cell(cell: Any) -> Any:
    raise RuntimeError(
        f"nbdebug: a {type(cell).__name__} runs the Debugger's Cell hooks but is no Cell of the network the "
        "Debugger is attached to: it is a copy that took the hooks along (mindspore.amp.auto_mixed_precision "
        "'O1' rewrites the network into new Cells, sharing the Parameters). Attach the Debugger to the network "
        "auto_mixed_precision returns: net = auto_mixed_precision(net, 'O1'), then nbdebug.Debugger(net).")


def unwritten_outputs(op_type: str, func: Any) -> tuple[str, ...]:
    """The output slots of a call of ``func`` (an op of ``op_type``) its CPU kernel leaves unwritten."""
    if op_type != "BatchNorm" or ms.get_context("device_target") != "CPU":
        return ()
    prim = func.args[0] if isinstance(func, functools.partial) and func.args else func  # a Primitive's call
    training = getattr(prim, "is_training", None)
    return ("output.1", "output.2") if training else ("output.1", "output.2", "output.3", "output.4")


class PyNativeAdapter(Capture):
    """Attaches to one ``mindspore.nn.Cell`` (PyNative mode) and feeds a :class:`Session` through the
    capture core."""

    framework = "mindspore"
    module_prefix = "Cell"
    framework_dir = "/mindspore/"

    def __init__(self, model: nn.Cell, level: str, session: Session, *, retain: bool = True,
                 retain_copy: bool = False) -> None:
        super().__init__(MindSporeOps(), level, session, retain=retain, retain_copy=retain_copy)
        self.model_ref = weakref.ref(model)
        self.model_class = type(model).__name__
        self._depth = 0
        self._threads: set[int] = set()
        self._cell_info: dict[int, tuple[str, str, bool]] = {}
        self._owner_local: dict[int, str] = {}  # id(parameter) -> its name in its owning Cell
        self._prims: list[tuple[Any, type]] = []
        self._hb_cache: dict[tuple[str, str], Any] = {}
        self._opt_owned: dict[int, bool] = {}
        self._trainable: set[int] = set()  # ids of the trainable Parameters
        self._attach(model)
        # values of the step in progress are offered to the store at a flush
        session.before_read = lambda: None if self.closed else self.sync()

    # -- step state -------------------------------------------------------------------------------
    def raw_rows(self):
        self.sync()
        quiet = threading.get_ident() in self._threads
        busy = self.busy
        if quiet:  # MindSpore calls made here are ours, not the model's
            self.busy = True
        try:
            with self._lock:
                return self.buf.raw()
        finally:
            if quiet:
                self.busy = busy

    def sync(self) -> None:
        """Make everything captured so far readable: statistics, shapes, dtypes, retained values.

        Callable from any thread (the panel reads while training runs); only on the training thread
        does it mark the adapter busy, so that capture elsewhere goes on undisturbed."""
        quiet = threading.get_ident() in self._threads
        busy = self.busy
        if quiet:
            self.busy = True
        try:
            with self._lock:
                self._flush()
        finally:
            if quiet:
                self.busy = busy

    def _flush(self) -> None:
        """Wait once for MindSpore's queue; fill in the metadata and retention of the queued slots."""
        self.buf.flush()
        self.resolve(self.buf.meta)

    def closing_step(self) -> None:
        self._backward_edges()
        self._threads.discard(threading.get_ident())

    def thread_exit(self) -> None:
        """The training thread is ending (finished, terminated or failed): close a partial step.

        An exception that unwound a forward or backward pass (``terminate()`` raises one at a node)
        leaves MindSpore's gradient executor mid-graph, which would spoil the next ``value_and_grad``
        or ``TrainOneStepCell`` call in the process; its state is reset then."""
        interrupted = bool(self._scope) or bool(self._depth) or self.section == "optimizer" or \
            bool(_pynative_executor.grad_flag())
        if interrupted:
            _pynative_executor.clear_res()
        self.busy = False
        self._depth = 0
        if not self.close_partial_step():
            self._threads.discard(threading.get_ident())

    # -- attach / detach --------------------------------------------------------------------------
    def _attach(self, model: nn.Cell) -> None:
        if not self.level.records_tensors:  # monitor: only the probe's and the optimizer's hooks
            from .monitor import MindSporeMonitor

            for qual, p in model.parameters_and_names():
                self._param_info[id(p)] = (weakref.ref(p), qual, "", "")
            self.monitor_probe = MindSporeMonitor(self, model, _grad_recording)
            _OPT.install(self)
            _JIT.install(self)
            return
        from .monitor import LossMonitor

        self.monitor_probe = LossMonitor(self, model, _grad_recording)  # Run.loss: dbg.record_loss, WithLossCell
        want_cells = self.level.modules
        for path, cell in model.cells_and_names():
            if id(cell) in self._cell_info:
                continue
            leaf = next(iter(cell.cells()), None) is None
            self._cell_info[id(cell)] = (path, type(cell).__name__, leaf)
            self.hooks.add(cell.register_forward_pre_hook(self._pre_hook(want_cells), with_kwargs=True))
            self.hooks.add(cell.register_forward_hook(self._post_hook(want_cells), with_kwargs=True,
                                                            always_call=True))
        owners: dict[int, tuple[str, str, str]] = {}
        for path, cell in model.cells_and_names():
            for local, p in cell._params.items():
                if p is not None and id(p) not in owners:
                    owners[id(p)] = (path, type(cell).__name__, local)
        for qual, p in model.parameters_and_names():
            path, cls, local = owners.get(id(p), ("", type(model).__name__, qual))
            self._param_info[id(p)] = (weakref.ref(p), qual, path, cls)
            self._owner_local[id(p)] = local
            if p.requires_grad:
                self._trainable.add(id(p))
                self.hooks.add(p.register_hook(self._grad_hook(qual, path, cls, local)))
            else:
                self.ops.mutable.add(id(p))
            if self.retain:
                self.session.store.offer((f"Parameter.{qual}", "output.0"),
                                         MSRef(p, copy=True, nbytes=int(p.size) * int(p.itemsize)), "initial")
        if self.level.ops:
            for _path, cell in model.cells_and_names():
                for attr, value in list(vars(cell).items()):
                    if isinstance(value, Primitive) and id(value) not in _PRIM_INFO:
                        cls = type(value)
                        if getattr(cls, "__nbdebug_base__", None) is not None or cls.__name__ in _SKIP_PRIMITIVES:
                            continue
                        _PRIM_INFO[id(value)] = ("Primitive", f"{attr}.{cls.__name__}", cls.__name__, False)
                        value.__class__ = _recording_class(cls)
                        self._prims.append((value, cls))
            _OPS.install(self)
        _OPT.install(self)
        _JIT.install(self)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.capturing = False
        self.hooks.remove_all(quiet=True)  # a tensor hook whose tensor is gone fails, the rest go
        if self.monitor_probe is not None:
            self.monitor_probe.close()
        for prim, cls in self._prims:
            prim.__class__ = cls
            _PRIM_INFO.pop(id(prim), None)
        self._prims.clear()
        if self.level.ops:
            _OPS.uninstall(self)
        _OPT.uninstall(self)
        _JIT.uninstall(self)
        self._threads.clear()
        self._hb_cache.clear()
        self._seen.clear()

    # -- recording --------------------------------------------------------------------------------
    def wants_op(self) -> bool:
        """Whether an API call right now, on this thread, is a node."""
        return (self.capturing and not self.busy and not self._depth
                and threading.get_ident() in self._threads)

    def _hook_backward(self, name: str, scope: str, pair: str, kind: str, slot: str, is_input: bool = False) -> Any:
        """A cached ``HookBackward`` identity whose gradient is ``slot`` of backward node ``name``
        (``output.{position}``: the gradient of that input; for a Primitive, the slot it gets is the next
        ``output.{k}`` in arrival order, as msProbe numbers a Primitive's input gradients)."""
        key = (name, slot)
        hb = self._hb_cache.get(key)
        if hb is None:
            arrival = not is_input and name.startswith("Primitive.")

            def fn(grad, self=self, name=name, scope=scope, pair=pair, kind=kind, slot=slot, is_input=is_input):
                g = grad[0] if isinstance(grad, tuple) else grad
                if self.capturing and not self.closed and _is_tensor(g):
                    if arrival:
                        k = self._arrived.get(name, 0)
                        self._arrived[name] = k + 1
                        self._grad_slots[(name, slot)] = f"output.{k}"
                        self._grad_slot(name, scope, pair, kind, f"output.{k}", g, is_input=False)
                    else:
                        self._grad_slot(name, scope, pair, kind, slot, g, is_input=is_input)
                return None

            hb = self._hb_cache[key] = ops.HookBackward(fn)
        return hb

    def _hook_group(self, name: str, scope: str, pair: str, kind: str, positions: tuple[int, ...]) -> Any:
        """A cached ``HookBackward`` identity over several inputs at once: the gradient of each is
        ``output.{position}`` of backward node ``name``. One op over all of them is what msProbe's
        ``CellBackwardHook`` is: when any of them is in the gradient graph, MindSpore's backward computes
        the gradient of every one, a data operand's too (``x - y``: ``y``'s gradient is ``output.1``)."""
        key = (name, positions)
        hb = self._hb_cache.get(key)
        if hb is None:
            def fn(grads, self=self, name=name, scope=scope, pair=pair, kind=kind, positions=positions):
                if self.capturing and not self.closed:
                    for i, g in zip(positions, grads if isinstance(grads, tuple) else (grads,), strict=False):
                        if _is_tensor(g):
                            self._grad_slot(name, scope, pair, kind, f"output.{i}", g, is_input=False)
                return None

            hb = self._hb_cache[key] = ops.HookBackward(fn)
        return hb

    def _probed(self, name: str, scope: str, pair: str, kind: str, slot: str, t: Any, is_input: bool) -> Any:
        new = _uncast(self._hook_backward(name, scope, pair, kind, slot, is_input), t)
        self.alias(new, t)
        return new

    def _hooked_outputs(self, name: str, scope: str, pair: str, kind: str, output: Any) -> Any:
        """Gradients of a node's outputs are the ``input.*`` slots of its backward node: a gradient probe
        goes behind every output tensor (top level), and the probed tensors are what the caller gets."""
        if _is_tensor(output):
            return self._probed(name, scope, pair, kind, "input.0", output, True)
        if isinstance(output, tuple) and any(_is_tensor(o) for o in output):
            items = [self._probed(name, scope, pair, kind, f"input.{i}", o, True) if _is_tensor(o) else o
                     for i, o in enumerate(output)]
            return type(output)(items) if type(output) is tuple else output
        return output

    def _hooked_inputs(self, args: tuple, kwargs: dict, name: str, scope: str, pair: str,
                       kind: str) -> tuple[tuple, dict, bool]:
        """Put a gradient probe in front of every floating-point input (top-level tensors).

        A Parameter is passed on as it is (an op may update it in place, as BatchNorm does its moving
        statistics), except a trainable one given to a Primitive: msProbe's Primitive backward holds its
        gradient (``Primitive.matmul.MatMul.0.backward output.0`` is the weight's)."""
        new_args = list(args)
        weights = name.startswith("Primitive.")
        positions = tuple(i for i, a in enumerate(args) if _is_tensor(a) and (
            not isinstance(a, Parameter) or weights and id(a) in self._trainable))
        changed = bool(positions)
        # one probe over all of them (see _hook_group) when a dump is written, as msProbe writes it; live
        # capture keeps one probe per tensor: a multi-input HookBackward can leave MindSpore's PyNative
        # gradient state broken for later graphs of the process ("Can not find top cell for backward")
        if len(positions) > 1 and not weights and self.tap is not None:
            probed = _uncast(self._hook_group(name, scope, pair, kind, positions), *(args[i] for i in positions))
            for i, new in zip(positions, probed, strict=True):
                self.alias(new, args[i])
                new_args[i] = new
        else:
            for i in positions:
                new_args[i] = self._probed(name, scope, pair, kind, f"output.{i}", args[i], False)
        new_kwargs = kwargs
        if kwargs:
            for k, v in kwargs.items():
                if _is_tensor(v) and not isinstance(v, Parameter):
                    if new_kwargs is kwargs:
                        new_kwargs = dict(kwargs)
                    new_kwargs[k] = self._probed(name, scope, pair, kind, f"output.{k}", v, False)
                    changed = True
        return tuple(new_args), new_kwargs, changed

    def _grad_slot(self, name, scope, pair, kind, slot, grad, *, is_input: bool) -> None:
        with self._lock:
            self.busy = True
            try:
                node = self.gradient(name, scope, pair, kind, slot, grad, is_input)
            finally:
                self.busy = False
        self.emit_node(node)

    def new_step_state(self) -> None:
        super().new_step_state()
        self.session.raw_source = self.raw_rows
        self._derived: dict[int, Any] = {}  # results of ops applied to a parameter: maybe views of it
        self._arrived: dict[str, int] = {}  # Primitive backward -> input gradients arrived so far
        self._grad_slots: dict[tuple[str, str], str] = {}  # (backward, output.{position}) -> its slot

    def _backward_edges(self) -> None:
        """Backward data flow mirrors the forward edges of the nodes whose backward ran this step."""
        g = self.session.graph
        renamed = self._grad_slots
        ran = self._bwd_started
        if not ran:
            return
        pgrad = {f"Parameter.{q}": v for q, v in self._pgrad_last.items()}
        for (src, dst), slots in list(g.edges.items()):
            d = g.nodes.get(dst)
            if d is None or d.section != "forward" or d.pair not in ran:
                continue
            s = g.nodes[src]
            for src_slot, dst_slot in slots:
                if dst_slot.startswith("parameters"):
                    continue
                out_slot = "output" + dst_slot[len("input"):] if dst_slot.startswith("input") else dst_slot
                out_slot = renamed.get((d.pair, out_slot), out_slot)
                if src in pgrad:
                    g.add_edge(d.pair, pgrad[src][0], out_slot, pgrad[src][1])
                elif s.pair in ran and src_slot.startswith("output"):
                    g.add_edge(d.pair, s.pair, out_slot, "input" + src_slot[len("output"):])

    # -- L1 ---------------------------------------------------------------------------------------
    def run_op(self, info: tuple[str, str, str, bool], func, args, kwargs):
        prefix, api, op_type, inplace = info
        self.busy = True
        try:
            key = (prefix, api)
            count = self._counts.get(key, 0)
            self._counts[key] = count + 1
            name = f"{prefix}.{api}.{count}.forward"
            bwd = f"{prefix}.{api}.{count}.backward"
            section = self.section
            scope = "optimizer" if section == "optimizer" else self.scope_str()
            node = self.session.node(name, kind="op", op_type=op_type, scope=scope, section=section,
                                     stack=self.stack, pair=bwd)
            for slot, t in self.arguments(args, kwargs):
                self.slot(node, slot, t, as_input=True)
            first = args[0] if args else None  # a view or cast is a method of the tensor it reads
            from_param = first is not None and (isinstance(first, Parameter) or id(first) in self._derived)
            grad = section != "optimizer" and _grad_recording()
            if inplace:
                grad = False
                target = args[0] if args else None
                if _is_tensor(target):
                    if self.buf.is_queued(target):
                        self._flush()
                    seen = self._seen.get(id(target))
                    if seen is not None and seen.handle is not None:
                        seen.handle.snapshot()
            if grad:
                args, kwargs, _ = self._hooked_inputs(args, kwargs, bwd, scope, name, "op")
        finally:
            self.busy = False
        self._depth += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self._depth -= 1
        self.busy = True
        try:
            derived = self._derived
            unwritten = unwritten_outputs(op_type, func)
            for slot, t in self.outputs(out):
                seen = self.slot(node, slot, t, as_input=False)
                seen.producer = (name, slot)
                if slot in unwritten:
                    self._refuse(name, slot, _UNWRITTEN_REASON)
                if from_param:  # may be a view of a parameter (swapaxes, a no-op astype ...)
                    derived[id(t)] = seen
            if grad:
                out = self._hooked_outputs(bwd, scope, name, "op", out)
                if from_param:  # what the caller gets are the probes: they stand for the results
                    for _slot, t in self.outputs(out):
                        if id(t) in self._seen:
                            derived[id(t)] = self._seen[id(t)]
        finally:
            self.busy = False
        self.emit_node(node, (args, kwargs, out))
        return out

    def _refuse(self, name: str, slot: str, why: str) -> None:
        """``(name, slot)`` of the step in progress gets no statistics and no value, and says why."""
        s = self.session
        i = s.recorder.index.get((name, slot))
        if i is not None:
            s.recorder.unsupported[i] = why
        s.store.refuse((name, slot), why)

    # -- L0 ---------------------------------------------------------------------------------------
    def _pre_hook(self, want: bool) -> Callable:
        def pre(cell, args, kwargs):
            if not self.capturing or self.busy or self._depth:
                return None
            if not self._scope:  # the outermost call: ops on this thread are nodes from now on
                self._threads.add(threading.get_ident())
                self.note_root_args(args, kwargs)
            path, cls, leaf = self._cell_info.get(id(cell)) or _copied_cell(cell)
            self.enter(path)
            if not want or not path:  # msProbe does not name the root Cell; neither do we
                return None
            self.busy = True
            try:
                node = self.module_call(id(cell), path, cls, leaf, args, kwargs, cell._params.items())
                if _grad_recording():
                    new_args, new_kwargs, changed = self._hooked_inputs(args, kwargs, node.pair, node.scope,
                                                                        node.name, "module")
                    if changed:
                        return new_args, new_kwargs
            finally:
                self.busy = False
            return None

        return pre

    def _post_hook(self, want: bool) -> Callable:
        def post(cell, args, kwargs, output):
            if id(cell) not in self._cell_info:  # a copy of a Cell: its pre hook raised
                return None
            if self._scope and not self.busy and not self._depth:
                self.leave()
            if not want or not self.capturing or self.busy or self._depth:
                return None
            path, cls, leaf = self._cell_info[id(cell)]
            if not path:
                return None
            node = self.last_call(id(cell))
            if node is None:
                return None
            self.busy = True
            try:
                self.module_return(node, leaf, args, kwargs, output)
                new = output
                if _grad_recording():
                    new = self._hooked_outputs(node.pair, node.scope, node.name, "module", output)
            finally:
                self.busy = False
            self.emit_node(node, (args, kwargs, output))
            return None if new is output else new

        return post

    # -- parameter gradients ----------------------------------------------------------------------
    def _grad_hook(self, qual, path, cls, local) -> Callable:
        base = f"{module_base('Cell', path, cls)}.parameters_grad"
        scope = parent_scope(path)

        def hook(grad):
            if not self.capturing or self.closed or not _is_tensor(grad):
                return None
            with self._lock:
                self.busy = True
                try:
                    node = self.parameter_gradient(qual, base, scope, local, grad)
                finally:
                    self.busy = False
            self.emit_node(node)
            return None

        return hook

    # -- optimizer --------------------------------------------------------------------------------
    def owns_optimizer(self, opt: Any) -> bool:
        if self.closed:
            return False
        known = self._opt_owned.get(id(opt))
        if known is None:
            params = getattr(opt, "parameters", ()) or ()
            known = self._opt_owned[id(opt)] = any(id(p) in self._param_info for p in params)
        return known

    def optimizer_pre(self, opt: Any, grads: Any = None, *args: Any) -> None:
        if not self.capturing:
            return
        if self.monitor_probe is not None:
            self.monitor_probe.optimizer_pre(opt, grads)
        if not self.level.records_tensors:  # monitor: nothing retained to sync or copy
            self.section = "optimizer"
            return
        self.sync()  # parameters and gradients change in place from here on
        self._copy_parameter_views()
        self.section = "optimizer"
        self._threads.add(threading.get_ident())

    def _copy_parameter_views(self) -> None:
        """Retained references that share memory with a parameter (a view, a no-op cast) are copied
        before the optimizer overwrites the parameter: MindSpore would not tell afterwards. The candidates
        are the results of ops applied to a parameter or to such a result (called after a flush: reading
        a pointer does not wait then)."""
        candidates = [seen for seen in self._derived.values() if seen.handle is not None and not seen.handle.copied]
        if not candidates:
            return
        spans = []
        for ref, *_ in self._param_info.values():
            p = ref()
            if p is not None:
                start = p.data_ptr()
                spans.append((start, start + int(p.size) * int(p.itemsize)))
        for seen in candidates:
            h = seen.handle
            if h is None or h.copied:
                continue
            ptr = h.tensor.data_ptr()
            if any(a <= ptr < b for a, b in spans):
                h.snapshot()

    def optimizer_post(self, opt: Any) -> None:
        params = [(info[1], p) for p in opt.parameters
                  if (info := self._param_info.get(id(p))) is not None and info[0]() is p]
        if self.monitor_probe is not None:
            self.monitor_probe.optimizer_post(opt)
        self.optimizer_done(type(opt).__name__, params)
