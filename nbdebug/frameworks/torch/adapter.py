"""PyTorch capture: hooks in, framework-neutral session events out.

* L0 — module hooks: forward inputs/outputs and parameters of every module call, backward gradients
  (tensor hooks on the call's outputs and inputs), parameter gradients.
* L1 — a :class:`~torch.overrides.TorchFunctionMode` sees every torch function, ``torch.nn.functional``
  call and Tensor method (in-place ones included); an autograd hook on each output's ``grad_fn``
  records its backward.
* mix — both.

At every level parameters are graph nodes (``Parameter.{name}``), parameter gradients are recorded
(``Module.{path}.{Class}.parameters_grad``), and ``optimizer.step()`` is its own section
(``Optimizer.{Class}.step.{n}``, plus the ops it runs at L1/mix). The step ends at ``Debugger.step()``
or, when the user never calls it, after the optimizer's step.

Nothing is monkeypatched: closing removes every hook handle and pops the mode.
"""

from __future__ import annotations

import atexit
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.optim.optimizer as _optim

from ...session.session import Session
from ..core.calls import module_base, parent_scope
from ..core.capture import LEVELS, Capture
from ..core.recording import NO_OUTPUT, announce
from ..core.records import slot_name
from .compiled import replay_note, retrace, run_eagerly
from .ddp import ReducedGrads
from .module_grads import ModuleGrads
from .monitor import TorchMonitor
from .op_calls import (
    _MUTATED_ARGS,
    _api_prefix,
    index_tensors,
    mutated_args,
)
from .op_mode import OpMode
from .ops import TorchOps, TorchRef
from .recompute import STOPPED
from .stats import UNINITIALIZED

__all__ = ["LEVELS", "TorchAdapter", "mutated_args"]

_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_OUTPUTS = tuple(slot_name("output", i) for i in range(16))  # the same string objects as ``outputs`` names
_GETITEM = torch.Tensor.__getitem__
#: calls whose result is memory nobody wrote: until an op writes it (its version counter moves), a slot of it
#: has no statistics — the bytes are no value the model computed, different in every run
_UNINITIALIZED = frozenset({torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty,
                            torch.Tensor.new_empty_strided})


_LIVE: weakref.WeakSet = weakref.WeakSet()
_core_emit = Capture.emit_node

# Module hooks run eagerly even inside a ``torch.compile``d model: dynamo does not trace them (it would
# guard on every tensor's id and recompile until its limit), it breaks the graph around them.
_eager = torch.compiler.disable


def _wrapper_code() -> Any:
    return sys._getframe(1).f_code


_WRAPPER_CODE = _eager(_wrapper_code)()  # the frame ``_eager`` puts between a hook and its caller


def _hook_caller() -> Any:
    """The frame that called the module hook running in our caller (past ``_eager``'s frame)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code is _WRAPPER_CODE:
        frame = frame.f_back
    return frame


@atexit.register
def _close_at_exit() -> None:
    """Detach every live adapter while the interpreter still works (not from a weakref callback during
    teardown, when module globals are gone)."""
    for adapter in list(_LIVE):
        try:
            adapter.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass


class TorchAdapter(ModuleGrads, Capture):
    """Attaches to one ``torch.nn.Module`` and feeds a :class:`Session` through the capture core."""

    framework = "pytorch"
    module_prefix = "Module"
    framework_dir = "/torch/"

    def __init__(self, model: torch.nn.Module, level: str, session: Session, *, retain: bool = True,
                 retain_copy: bool = False) -> None:
        super().__init__(TorchOps(), level, session, retain=retain, retain_copy=retain_copy)
        # a model garbage-collected without close(): drop the global optimizer hooks with it
        self.model_ref = weakref.ref(model, lambda _ref: self.close())
        self.model_class = type(model).__name__
        self.site: tuple | None = None  # call site of the op being recorded (set by the op mode)
        self.in_backward = False  # inside ``Tensor.backward`` (see .recompute)
        self._root_frame = None  # frame of the outermost module call in progress
        self._ok_frame = None  # last op caller frame known to be inside it
        self._opt_frame = None  # frame of the optimizer step in progress (its hooks' wrapper)
        self._bwd_open = False  # a backward pass recorded into this step has not finished (see _unfinished)
        self._disarmed: dict[int, OpMode] = {}  # thread -> mode left on its stack by an interrupt
        self._api_cache: dict[Any, tuple[str, str] | None] = {}
        #: (prefix, api) -> what its calls share (see :meth:`_plan`)
        self._plans: dict[tuple[str, str], tuple[bool, bool, list[tuple[str, str]]]] = {}
        self._modes: dict[int, OpMode] = {}
        self._reduced = ReducedGrads(self)
        self._module_info: dict[int, tuple[str, str, bool, bool]] = {}
        self._attach(model)
        _LIVE.add(self)

    # -- step state -------------------------------------------------------------------------------
    def new_step_state(self) -> None:
        super().new_step_state()
        self.session.raw_source = self.buf.raw
        self._called: set[str] = set()  # module paths called this step
        self._held: list[Any] = []  # module backward nodes whose completion waits (see emit_node)
        #: module call -> (first autograd sequence number of the call, [(positional input, its gradient edge)])
        self._call_inputs: dict[str, tuple[int, list[tuple[torch.Tensor, tuple]]]] = {}
        self._outside: list[tuple[Any, tuple]] = []  # read once the outermost call returns (see .module_grads)
        self._outs_of: dict[int, list[Any]] = {}
        self._returns = 0

    def emit_node(self, node: Any, call: tuple | None = None) -> None:
        """As the core's; a module's input gradients (its share, complete when its last consumer inside
        it has run) complete after the parameter gradients autograd accumulates right then, as a full
        backward hook's would: they are held until the next node that is not a parameter gradient."""
        if self._held and node.kind != "parameter":
            self._release_held()
        _core_emit(self, node, call)  # the core's (no ``super()`` object per node)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for node in held:
            super().emit_node(node)

    def closing_step(self) -> None:
        self._release_held()
        self.hooks.remove_step()
        self._pop_mode()
        self.ops.pool.trim()

    def thread_exit(self) -> None:
        """The training thread is ending (finished, terminated or failed): close a partial step."""
        self.busy = False
        if not self.close_partial_step():
            self._pop_mode()

    # -- interrupted calls -------------------------------------------------------------------------
    def _root_alive(self, frame) -> bool:
        """Whether the outermost module call is still on ``frame``'s stack."""
        root = self._root_frame
        while frame is not None:
            if frame is root:
                return True
            frame = frame.f_back
        return False

    def interrupted(self) -> None:
        """The outermost module call was left without its hooks running (a ``KeyboardInterrupt`` is not
        an ``Exception``, so ``always_call`` hooks are skipped): close the partial step on its own and
        leave the op mode, so that later unrelated code is not recorded into it."""
        self._root_frame = self._ok_frame = self._opt_frame = None
        self._bwd_open = False
        mode = self._modes.get(threading.get_ident())
        if mode is not None and not any(m is mode for m in torch.overrides._get_current_function_mode_stack()):
            # called from inside the mode's own dispatch (torch re-pushes it when we return): disarm it
            # (it passes everything through); the next outermost module call takes it off
            mode.armed = False
            self._modes.pop(threading.get_ident())
            self._disarmed[threading.get_ident()] = mode
        if not self.close_partial_step():
            self._pop_mode()

    def _unfinished(self, caller) -> bool:
        """Whether an outermost module call starting now finds the step's backward pass or optimizer step
        left by an interrupt (``KeyboardInterrupt`` skips their final callback and post-hook): that step is
        closed on its own, as an interrupted forward's is, not merged with the next iteration. A forward
        run inside them (a checkpoint's recomputation, LBFGS's closure) is none."""
        if self.section == "optimizer":
            frame, opt = caller, self._opt_frame
            while frame is not None and frame is not opt:
                frame = frame.f_back
            return frame is None
        return self._bwd_open and torch._C._current_graph_task_id() == -1

    def backward_node(self, name: str, scope: str, pair: str | None, kind: str) -> Any:
        if not self._bwd_open and torch._C._current_graph_task_id() != -1:  # a backward pass starts
            self._bwd_open = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
        return super().backward_node(name, scope, pair, kind)

    def _backward_done(self) -> None:
        self._bwd_open = False

    def _drop_disarmed(self) -> None:
        """Take a mode disarmed by :meth:`interrupted` off this thread's stack (now outside its dispatch)."""
        mode = self._disarmed.pop(threading.get_ident(), None)
        if mode is None:
            return
        stack = torch.overrides._get_current_function_mode_stack()
        if stack and stack[-1] is mode:
            mode.__exit__(None, None, None)
        else:
            mode.adapter = _Inert()

    # -- attach / detach --------------------------------------------------------------------------
    def _attach(self, model: torch.nn.Module) -> None:
        hooked = any(a.model_ref() is model and not a.closed for a in list(_LIVE))  # a replay's capture
        if self.level.ops:  # compiled kernels hide their ops: compiled code runs eagerly while attached
            self.eager_compiled = self.hooks.add(run_eagerly(model, quiet=hooked, owner=self)).paths
        else:  # code compiled before now calls no hook of ours: compiled again
            retrace(model, hooked)
        monitor = not self.level.records_tensors
        self.monitor_probe = TorchMonitor(self, model, modules=not self.level.modules, weights=monitor,
                                          wrap=_eager)
        if monitor:  # no module, parameter-gradient or op hooks: the probe's and the optimizer's only
            for qual, p in model.named_parameters():
                self._param_info[id(p)] = (weakref.ref(p), qual, "", "")
            self.hooks.add(_optim.register_optimizer_step_pre_hook(self._opt_pre))
            self.hooks.add(_optim.register_optimizer_step_post_hook(self._opt_post))
            return
        want_modules = self.level.modules
        for path, mod in model.named_modules(remove_duplicate=False):
            if id(mod) in self._module_info:
                continue
            leaf = next(iter(mod.children()), None) is None
            self._module_info[id(mod)] = (path, type(mod).__name__, leaf, bool(getattr(mod, "inplace", False)))
            self.hooks.add(mod.register_forward_pre_hook(_eager(self._pre_hook(want_modules)),
                                                               with_kwargs=True))
            self.hooks.add(mod.register_forward_hook(_eager(self._post_hook(want_modules)), with_kwargs=True,
                                                           always_call=True))
        owners: dict[int, list[tuple[str, str, str]]] = {}  # tied weights have several owners
        for path, mod in model.named_modules():
            for local, p in mod.named_parameters(recurse=False):
                owners.setdefault(id(p), []).append((path, type(mod).__name__, local))
            for local, b in mod.named_buffers(recurse=False):
                if b is not None:
                    q = f"{path}.{local}" if path else local
                    self._buffer_info[id(b)] = (weakref.ref(b), q)
        for qual, p in model.named_parameters():
            path, cls, _local = owners[id(p)][0]
            self._param_info[id(p)] = (weakref.ref(p), qual, path, cls)
            if p.requires_grad:
                self.hooks.add(p.register_post_accumulate_grad_hook(self._grad_hook(qual, owners[id(p)])))
            if self.retain:
                self.session.store.offer((f"Parameter.{qual}", "output.0"), TorchRef(p, copy=True), "initial")
        self.hooks.add(_optim.register_optimizer_step_pre_hook(self._opt_pre))
        self.hooks.add(_optim.register_optimizer_step_post_hook(self._opt_post))

    def replay_note(self, live: Any) -> str | None:
        """What this (replay's) capture runs otherwise than the ``live`` one did: compiled code, eagerly."""
        paths = getattr(self, "eager_compiled", None)
        return replay_note(paths) if paths and not live.level.ops else None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.capturing = False
        self.hooks.remove_all()
        if self.monitor_probe is not None:
            self.monitor_probe.close()
        self._pop_mode()
        self._drop_disarmed()  # this thread's, if any
        for mode in list(self._modes.values()) + list(self._disarmed.values()):
            mode.adapter = _Inert()  # modes left on other (finished) threads pass through now
        self._modes.clear()
        self._disarmed.clear()
        self.ops.pool.clear()

    # -- L1 mode management -----------------------------------------------------------------------
    def _push_mode(self) -> None:
        if not self.level.ops or self.closed:
            return
        tid = threading.get_ident()
        mode = self._modes.get(tid)
        if mode is None:
            mode = OpMode(self)
            mode.__enter__()
            self._modes[tid] = mode
        mode.armed = True

    def _pop_mode(self) -> None:
        tid = threading.get_ident()
        mode = self._modes.get(tid)
        if mode is None:
            return
        del self._modes[tid]
        stack = torch.overrides._get_current_function_mode_stack()
        if stack and stack[-1] is mode:
            mode.__exit__(None, None, None)
        else:  # someone pushed a mode above ours: make ours inert instead of breaking their stack
            mode.adapter = _Inert()

    # -- L1 ---------------------------------------------------------------------------------------
    def api_info(self, func: Any) -> tuple[str, str] | None:
        try:
            return self._api_cache[func]
        except KeyError:
            info = self._api_cache[func] = _api_prefix(func)
            return info
        except TypeError:  # unhashable callable
            return _api_prefix(func)

    def pass_op(self, func, args, kwargs):
        """Run a torch call msProbe does not record; its tensor result keeps the producer of its first
        tensor argument (a ``contiguous()`` copy, a ``x[0]`` view) so the graph stays connected, and its
        consumers get edges from the producers of its other floating-point tensor arguments too
        (``F.grouped_mm(tokens, weight, offs=...)`` in MoE experts: the weight's data flow goes on)."""
        out = func(*args, **kwargs)
        if func in _UNINITIALIZED and isinstance(out, torch.Tensor) and out.numel():  # ``torch.empty_like``
            self._seen[id(out)] = self.buf.unmeasured(out, self.version(out), UNINITIALIZED.format(func.__name__))
        if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor) and out is not args[0]:
            also = [t for t in (*args[1:], *kwargs.values()) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if func is _GETITEM and len(args) > 1:  # ``x[torch.arange(n), idx]``: the indices pick the values
                also += index_tensors(args[1])
            self.derived(out, args[0], also)
        return out

    def _plan(self, info: tuple[str, str]) -> tuple[bool, bool, list[tuple[str, str]]]:
        """What an API's calls share (made once per API): whether it writes into its first argument
        (``add_``, ``__iadd__``), whether it mutates other arguments, and the names of its calls by per-step
        counter, ``(forward node, backward node)``, grown as counters first reach them: the same string
        objects every step, so the graph's, recorder's and store's dicts compare them by identity."""
        api = info[1]
        inplace = (api.endswith("_") and not api.endswith("__")) or api in _INPLACE_OPERATORS
        plan = self._plans[info] = (inplace, info in _MUTATED_ARGS, [])
        return plan

    @staticmethod
    def _names(info: tuple[str, str], count: int, names: list[tuple[str, str]]) -> tuple[str, str]:
        base = f"{info[0]}.{info[1]}.{count}"
        entry = (base + ".forward", base + ".backward")
        if count == len(names) and count < 100_000:
            names.append(entry)
        return entry

    def run_op(self, info: tuple[str, str], func, args, kwargs):
        plan = self._plans.get(info)
        if plan is None:
            plan = self._plan(info)
        inplace, mutates, names = plan
        if kwargs and "out" in kwargs:
            inplace = True
        self.busy = True
        try:
            with _NO_TORCH_FUNCTION():
                counts = self._counts
                count = counts.get(info, 0)
                counts[info] = count + 1
                name, pair = names[count] if count < len(names) else self._names(info, count, names)
                section = self.section
                scope = "optimizer" if section == "optimizer" else self._scope[-1] if self._scope else ""
                site, self.site = (scope, self.site), None
                node = self.session.node(name, kind="op", op_type=info[1], scope=scope, section=section,
                                         stack=self.stack, pair=pair, site=site)
                slot = self.slot
                for s, t in self.arguments(args, kwargs):
                    slot(node, s, t, as_input=True)
                if inplace:
                    out_kw = {"out": kwargs["out"]} if kwargs.get("out") is not None else None  # a tensor: no `and`
                    if out_kw is None and args and isinstance(args[0], torch.Tensor):  # ``add_``: the common case
                        self._overwrite(args[0], name, section)
                    else:
                        for _, t in self.arguments(args[:1], out_kw):
                            self._overwrite(t, name, section)
                if mutates:
                    for t in mutated_args(info, args, kwargs):
                        self._overwrite(t, name, section)
        finally:
            self.busy = False
        try:
            out = func(*args, **kwargs)
        except STOPPED:  # a checkpoint's early stop inside its recomputation: the call's inputs, no output
            self.emit_node(node, (args, kwargs, NO_OUTPUT) if self.tap is not None else None)
            raise
        self.busy = True
        try:
            with _NO_TORCH_FUNCTION():
                grad_fns = []
                backward = section != "optimizer"
                for s, t in self.outputs(out):
                    seen = slot(node, s, t, as_input=False)
                    seen.producer = (name, s)
                    if backward:
                        gf = t.grad_fn
                        if gf is not None and gf not in grad_fns:
                            grad_fns.append(gf)
                if grad_fns:
                    hook = self._op_bwd_hook(pair, node)
                    for gf in grad_fns:
                        self.hooks.add_step(gf.register_hook(hook))
        finally:
            self.busy = False
        if self.tap is not None or self._held:
            self.emit_node(node, (args, kwargs, out) if self.tap is not None else None)
        elif name not in self._done:  # emit_node's common case, without its two frames
            self._done.add(name)
            announce(self, node)
        return out

    def _overwrite(self, t: torch.Tensor, name: str, section: str) -> None:
        """Op ``name`` is about to overwrite ``t`` in place: copy its retained value first — except in the
        optimizer, whose in-place updates of its state and of the parameters would cost a copy per op and
        parameter every step: there the reference stays, and reading it later raises
        :class:`NotRetainedError` naming ``name``, unless a watchpoint needs the value or the user keeps it
        (its producer or ``name`` is a pinned node). The parameters' values the model used are
        ``Parameter.*`` copies either way."""
        seen = self._seen.get(id(t))
        handle = seen.handle if seen is not None else None
        if handle is None:
            return
        pinned = self.session.pinned
        if section != "optimizer" or name in pinned or (seen.producer is not None and seen.producer[0] in pinned):
            handle.snapshot()
        elif not handle.copied and handle.overwritten_by is None:
            handle.overwritten_by = name

    def _op_bwd_hook(self, name: str, fwd) -> Callable:
        scope = fwd.scope

        def hook(grad_inputs, grad_outputs):
            if not self.capturing:
                return None
            with torch._C.DisableTorchFunction():
                node = self.backward_node(name, scope, fwd.name, "op")
                for slot, g in self.arguments(tuple(grad_outputs), None):
                    self.slot(node, slot, g, as_input=True, origin=False)
                # ``outputs(grad_inputs)`` without its generic (generator) flattening: a gradient tuple is
                # flat, tensors or None (the per-op hot path of backward)
                for i, g in enumerate(grad_inputs):
                    if g is not None:
                        slot = _OUTPUTS[i] if i < len(_OUTPUTS) else slot_name("output", i)
                        self.slot(node, slot, g, as_input=False).producer = (name, slot)
            self.emit_node(node)
            return None

        return hook

    # -- L0 ---------------------------------------------------------------------------------------
    def _pre_hook(self, want: bool) -> Callable:
        def pre(mod, args, kwargs):
            if not self.capturing or self.busy:
                return None
            caller = _hook_caller()
            if self._scope and not self._root_alive(caller):
                self.interrupted()  # the previous outermost call never returned (KeyboardInterrupt)
            elif not self._scope and (self._bwd_open or self.section == "optimizer") and self._unfinished(caller):
                self.interrupted()  # the previous step's backward or optimizer step never finished
            path, cls, leaf, inplace = self._module_info[id(mod)]
            if not self._scope:  # the outermost call: make sure the op mode is on in this thread
                self._root_frame = caller
                if self._disarmed:
                    self._drop_disarmed()
                self._push_mode()
                self.note_root_args(args, kwargs)
            self._called.add(path)
            self.enter(path)
            if not want or not path:  # msProbe does not name the root module; neither do we
                if want and mod._parameters:
                    self._root_parameters(mod)
                return None
            self.busy = True
            try:
                with torch._C.DisableTorchFunction():
                    node = self.module_call(id(mod), path, cls, leaf, args, kwargs,
                                            mod._parameters.items(), snapshot_inputs=inplace)
                    if not inplace and torch.is_grad_enabled():
                        self._note_inputs(node.name, args)
            finally:
                self.busy = False
            return None

        return pre

    def _root_parameters(self, mod) -> None:
        """The root module's own parameters (CLIP's ``logit_scale``) get their ``Parameter`` nodes at its call,
        as a named module's do at theirs: their gradient entries have a source in the graph."""
        self.busy = True
        try:
            with torch._C.DisableTorchFunction():
                for p in mod._parameters.values():
                    info = self._param_info.get(id(p)) if p is not None else None
                    if info is not None and info[0]() is p:
                        self.param_node(p, info)
        finally:
            self.busy = False

    def _post_hook(self, want: bool) -> Callable:
        def post(mod, args, kwargs, output):
            if self._scope and not self.busy:
                self.leave()
                if not self._scope:  # the outermost call returned
                    self._root_frame = self._ok_frame = None
                    if self._outside:
                        with torch._C.DisableTorchFunction():
                            self._resolve_outside(output)
            if not want or not self.capturing or self.busy:
                return None
            path, cls, leaf, inplace = self._module_info[id(mod)]
            if not path:
                return None
            node = self.last_call(id(mod))
            if node is None:
                return None
            n = int(node.name.rsplit(".", 1)[1])
            self.busy = True
            try:
                with torch._C.DisableTorchFunction():
                    self.module_return(node, leaf, args, kwargs, output)
                    self._module_bwd_hooks(path, cls, n, node, output, inplace)
            finally:
                self.busy = False
            self.emit_node(node, (args, kwargs, output))
            return None

        return post

    # -- parameter gradients ----------------------------------------------------------------------
    def _grad_hook(self, qual: str, owners: list[tuple[str, str, str]]) -> Callable:
        """One ``parameters_grad`` entry per owning module called this step (tied weights: each owner),
        as msProbe writes them: a parameter used without a call of its module has none at L0/mix (at L1,
        where no module call is recorded, it is recorded under its first owner)."""
        slots = [(path, f"{module_base('Module', path, cls)}.parameters_grad", parent_scope(path), local)
                 for path, cls, local in owners]

        def hook(p):
            if not self.capturing:
                return
            with _NO_TORCH_FUNCTION():  # ``p.grad`` would pass through an op mode
                grad = p.grad
            if grad is None:
                return
            called = [o for o in slots if o[0] in self._called]
            if not called and not self.level.modules:  # no module calls are recorded: the first owner
                called = slots[:1]
            for _path, base, scope, local in called:
                with _NO_TORCH_FUNCTION():
                    node = self.parameter_gradient(qual, base, scope, local, grad)
                self.emit_node(node)
            if called:  # under DDP: the reduced gradient too, once the allreduce wrote it
                self._reduced.note(p, qual, [(b, sc, lo) for _pa, b, sc, lo in called], node.name)

        return hook

    # -- optimizer --------------------------------------------------------------------------------
    def _ours(self, opt) -> list[tuple[str, torch.Tensor]]:
        out = []
        for group in opt.param_groups:
            for p in group["params"]:
                info = self._param_info.get(id(p))
                if info is not None and info[0]() is p:
                    out.append((info[1], p))
        return out

    def _opt_pre(self, opt, args, kwargs) -> None:
        params = self._ours(opt) if self.capturing else None
        if params:
            self.monitor_probe.optimizer_pre(opt, params)
            self.section = "optimizer"
            self._opt_frame = sys._getframe(1)  # torch's wrapper of the step: on the stack until it returns
            self._push_mode()

    def _opt_post(self, opt, args, kwargs) -> None:
        self._opt_frame = None  # a finished frame keeps its callers' locals (the model) alive
        params = self._ours(opt)
        if params:
            self.monitor_probe.optimizer_post(opt, params)
            self.optimizer_done(type(opt).__name__, params, self._opt_state(opt, params))

    def _opt_state(self, opt, params: list[tuple[str, torch.Tensor]]) -> list[tuple[str, str, torch.Tensor]]:
        """The optimizer's per-parameter state after its step, ``(qual, key, tensor)`` (L1/mix: the step node's
        ``exp_avg.{qual}`` ... slots, the same whichever implementation ran). A fused kernel bumps no version
        counter: what it updated is measured again."""
        fused = any(g.get("fused") for g in opt.param_groups)
        ops = self.level.ops
        out = []
        for qual, p in params:
            state = opt.state.get(p) if fused or ops else None
            if fused:
                self._seen.pop(id(p), None)
            for key, v in (state or {}).items():
                if isinstance(v, torch.Tensor):
                    if fused:
                        self._seen.pop(id(v), None)
                    if ops:
                        out.append((qual, key, v))
        return out


_INPLACE_OPERATORS = frozenset({
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__setitem__", "__ifloordiv__", "__imod__", "__ipow__",
    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__"})


class _Inert:
    """Stands in for a closed adapter inside a mode object that could not be popped."""

    capturing = False
    busy = False
