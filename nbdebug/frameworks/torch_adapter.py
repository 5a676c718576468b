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
import dis
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as _F
import torch.optim.optimizer as _optim
from torch.overrides import TorchFunctionMode
from torch.utils.hooks import RemovableHandle

from ..session.session import Session
from ..session.store import NotRetainedError, TensorStore
from . import torch_api_names as _names
from .torch_stats import StatsBuffer

LEVELS = ("L0", "L1", "mix")

# Tensor methods / functions that only read metadata or leave torch: never graph nodes.
_SKIP_NAMES = frozenset({
    "__get__", "__set__", "__delete__", "dim", "size", "stride", "numel", "nelement", "data_ptr",
    "is_contiguous", "element_size", "storage_offset", "untyped_storage", "_typed_storage", "storage",
    "__repr__", "__str__", "__format__", "item", "tolist", "numpy", "__bool__", "__len__", "__index__",
    "__int__", "__float__", "__complex__", "__hash__", "__iter__", "__reversed__", "__dir__", "__array__",
    "__reduce_ex__", "__setstate__", "__getstate__", "__deepcopy__", "backward", "register_hook",
    "register_post_accumulate_grad_hook", "retain_grad", "requires_grad_", "is_floating_point",
    "is_complex", "get_device", "__contains__", "__array_wrap__", "_is_view", "is_set_to", "dim_order",
    "_set_grad_enabled", "_record_function_enter_new", "_record_function_exit", "has_names",
    "is_nonzero", "equal", "allclose", "_version", "is_shared", "is_pinned", "__torch_function__",
    "_has_compatible_shallow_copy_type", "__instancecheck__", "__subclasscheck__",
})


# Ops that write into arguments other than the first without bumping their version counter:
# (prefix, api) -> positions / keyword names of those arguments (copied before the op runs).
_MUTATED_ARGS: dict[tuple[str, str], tuple[Any, ...]] = {
    ("Functional", "batch_norm"): (1, 2, "running_mean", "running_var"),
    ("Functional", "instance_norm"): (1, 2, "running_mean", "running_var"),
    ("Torch", "batch_norm"): (3, 4, "running_mean", "running_var"),
    ("Torch", "instance_norm"): (3, 4, "running_mean", "running_var"),
    ("Torch", "_amp_foreach_non_finite_check_and_unscale_"): (1, "found_inf"),
    ("Torch", "_amp_update_scale_"): (1, "growth_tracker"),
}


def mutated_args(info: tuple[str, str], args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors an op overwrites besides its first argument (BatchNorm running statistics ...)."""
    where = _MUTATED_ARGS.get(info)
    if where is None:
        return []
    out = []
    for w in where:
        t = args[w] if isinstance(w, int) and w < len(args) else kwargs.get(w) if isinstance(w, str) else None
        if isinstance(t, torch.Tensor):
            out.append(t)
    return out


_PASS = ("", "")  # a torch call msProbe does not record: runs unrecorded, its result keeps its input's producer


def _api_prefix(func: Any) -> tuple[str, str] | None:
    """(msProbe prefix, api name) for a function seen by the mode; ``_PASS`` for a torch call msProbe does
    not record (not in its support list); None when not an op at all (metadata, leaves torch).

    ``("Tensor?", name)``: a Tensor method msProbe records only when reached through an operator
    (``x // y`` reaches the mode as ``floor_divide``; msProbe hooks ``__floordiv__``)."""
    name = getattr(func, "__name__", None)
    if name is None or name in _SKIP_NAMES:
        return None
    qual = getattr(func, "__qualname__", "") or ""
    mod = getattr(func, "__module__", None) or ""
    if qual.startswith(("TensorBase.", "Tensor.", "_TensorBase.")) or isinstance(
            func, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        # operators (``x + y`` reaches the mode as ``add``) are renamed at the call site
        if name in _names.TENSOR:
            return "Tensor", name
        return _PASS if name.startswith("__") else ("Tensor?", name)
    if mod in ("torch.nn.functional", "torch._C._nn") or getattr(_F, name, None) is func:
        # ``F.conv2d`` is ``torch.conv2d`` (one builtin): msProbe hooks it as Functional
        if name in _names.FUNCTIONAL:
            return "Functional", name
    if mod.startswith("torch.distributed"):
        return ("Distributed", name) if name in _names.DISTRIBUTED else _PASS
    if mod == "torch._VF" or mod.startswith("torch._C._VariableFunctions") and name in _names.VF:
        if name in _names.VF:
            return "VF", name
    if mod in ("torch", "torch.functional", "torch._C._VariableFunctions", "torch.random") or \
            qual.startswith("_VariableFunctionsClass.") or mod.startswith(
                ("torch._C._linalg", "torch.linalg", "torch._C._fft", "torch.fft", "torch._C._special",
                 "torch.special", "torch.nn.functional", "torch._C._nn")):
        return ("Torch", name) if name in _names.TORCH else _PASS
    return None


def _tensors(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Flatten args/outputs into msProbe data names (``input.0``, ``output.1.0`` ...)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{prefix}.{i}")
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from _tensors(item, f"{prefix}.{k}")


def _outputs(obj: Any, prefix: str = "output") -> Iterator[tuple[str, torch.Tensor]]:
    """Outputs are a list in msProbe's data names: a lone tensor is ``output.0``."""
    return _tensors((obj,) if isinstance(obj, torch.Tensor) else obj, prefix)


def _args_tensors(args: tuple, kwargs: dict | None) -> Iterator[tuple[str, torch.Tensor]]:
    for i, a in enumerate(args):
        yield from _tensors(a, f"input.{i}")
    if kwargs:
        for k, v in kwargs.items():
            yield from _tensors(v, f"input.{k}")


def _user_stack(limit: int = 8) -> list[str]:
    """The caller's Python frames, innermost first, without torch's and nbdebug's own frames."""
    out: list[str] = []
    f = sys._getframe(2)
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if "/torch/" not in fn and "/nbdebug/frameworks/" not in fn and "/nbdebug/control/" not in fn:
            out.append(f"File {fn}, line {f.f_lineno}, in {f.f_code.co_name}")
        f = f.f_back
    return out


_NO_VERSION = iter(range(-1, -(1 << 62), -1))


def _version_of(t: torch.Tensor) -> int:
    """``t._version``; inference tensors have none: a fresh negative number (never equal to another)."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return next(_NO_VERSION)


class TorchRef:
    """Retention handle: a reference (checked against in-place edits) or a private copy."""

    __slots__ = ("tensor", "version", "nbytes", "copied", "__weakref__")

    def __init__(self, t: torch.Tensor, copy: bool) -> None:
        with torch._C.DisableTorchFunction():
            self.version = _version_of(t)
            copy = copy or self.version < 0  # no version counter: in-place edits are invisible, keep a copy
            self.copied = copy
            self.tensor = t.detach().clone() if copy else t.detach()
            self.nbytes = t.numel() * t.element_size()

    def snapshot(self) -> None:
        """Take a private copy now (called before an in-place op overwrites the value)."""
        if not self.copied:
            with torch._C.DisableTorchFunction():
                self.tensor = self.tensor.clone()
            self.copied = True

    def numpy(self):
        with torch._C.DisableTorchFunction():
            t = self.tensor
            if not self.copied and t._version != self.version:
                raise NotRetainedError(
                    f"the value was modified in place after it was captured (version {self.version} -> "
                    f"{t._version}) and no copy was kept")
            if t.dtype == torch.bfloat16:
                t = t.float()
            arr = t.cpu().numpy()
            return arr.copy() if not self.copied else arr


class _Seen:
    """What the step knows of one tensor object at one version."""

    __slots__ = ("ref", "version", "row", "dtype", "why", "handle", "producer")

    def __init__(self, ref, version, row, dtype, why) -> None:
        self.ref, self.version, self.row, self.dtype, self.why = ref, version, row, dtype, why
        self.handle: TorchRef | None = None
        self.producer: tuple[str, str] | None = None


_SYMBOLS = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "**": "pow",
            "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift",
            "<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge"}
_UNARY = {"UNARY_NEGATIVE": "neg", "UNARY_INVERT": "invert", "UNARY_POSITIVE": "pos"}
_OPERATOR_SITES: dict[tuple[Any, int], str | None] = {}


def _operator_at(code: Any, lasti: int) -> str | None:
    """The Python operator a bytecode instruction applies (``+`` -> ``add``, ``+=`` -> ``iadd``), if any.

    ``x + y`` reaches the mode as ``Tensor.add``; msProbe names it ``Tensor.__add__``. Cached per site."""
    key = (code, lasti)
    if key in _OPERATOR_SITES:
        return _OPERATOR_SITES[key]
    name = None
    for ins in dis.get_instructions(code):
        if ins.offset == lasti:
            if ins.opname in ("BINARY_OP", "COMPARE_OP"):
                sym = ins.argrepr
                if sym.endswith("=") and sym not in ("<=", "==", "!=", ">="):
                    name = "i" + _SYMBOLS.get(sym[:-1], "") if sym[:-1] in _SYMBOLS else None
                else:
                    name = _SYMBOLS.get(sym)
            else:
                name = _UNARY.get(ins.opname)
            break
    _OPERATOR_SITES[key] = name
    return name


_REFLECTED_SITES: dict[tuple[Any, int], Any] = {}
_LOADS = ("LOAD_FAST", "LOAD_DEREF", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_CLASSDEREF")


def _left_operand(code: Any, lasti: int) -> list[Any] | None:
    """The instructions that compute the left operand of the binary operator at ``lasti`` (None when the
    bytecode does not let us tell: jumps inside the operands, unknown stack effects)."""
    ins = list(dis.get_instructions(code))
    idx = next((k for k, i in enumerate(ins) if i.offset == lasti), None)
    if idx is None:
        return None
    bounds = []
    end, net = idx, 0
    for j in range(idx - 1, -1, -1):  # walk back over the right operand, then over the left one
        i = ins[j]
        if i.is_jump_target or i.opcode in dis.hasjrel or i.opcode in dis.hasjabs:
            return None
        try:
            net += dis.stack_effect(i.opcode, i.arg if i.opcode >= dis.HAVE_ARGUMENT else None)
        except ValueError:
            return None
        if net == 1:
            bounds.append((j, end))
            if len(bounds) == 2:
                return ins[j:end]
            end, net = j, 0
    return None


def _reflected_at(frame: Any) -> bool:
    """Whether the binary operator running in ``frame`` — a tensor and a Python scalar — has the scalar on
    its left (``0.5 * h``, ``math.sqrt(2) * h``: msProbe's ``Tensor.__rmul__``). Decided once per call
    site from the bytecode: the left operand is the tensor if it reads a variable holding a tensor."""
    key = (frame.f_code, frame.f_lasti)
    hit = _REFLECTED_SITES.get(key)
    if hit is not None:
        return hit
    left = _left_operand(frame.f_code, frame.f_lasti)
    out = left is not None
    for i in left or ():
        if i.opname == "LOAD_CONST" and isinstance(i.argval, torch.Tensor):
            out = False
        elif i.opname in _LOADS:
            name = i.argval
            if i.opname in ("LOAD_GLOBAL", "LOAD_NAME") and name not in frame.f_locals:
                value = frame.f_globals.get(name, frame.f_builtins.get(name))
            else:
                value = frame.f_locals.get(name)
            if isinstance(value, torch.Tensor):
                out = False
    _REFLECTED_SITES[key] = out
    return out


class _OpMode(TorchFunctionMode):
    """Sees every torch-level call while pushed on the training thread."""

    def __init__(self, adapter: TorchAdapter) -> None:
        super().__init__()
        self.adapter = adapter
        self.armed = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        a = self.adapter
        if not a.capturing or a.busy or not self.armed:
            return func(*args, **kwargs)
        info = a.api_info(func)
        if info is None or torch._C._current_autograd_node() is not None:
            return func(*args, **kwargs)
        caller = sys._getframe(1)
        if a._scope and caller is not a._ok_frame:  # inside a module call, or left one by an interrupt?
            if not a._root_alive(caller):
                a.interrupted()
                return func(*args, **kwargs)
            a._ok_frame = caller
        a.site = (caller.f_code, caller.f_lasti)  # the call site: a node's identity (see Session.node)
        if info[0] in ("Tensor", "Tensor?") and not info[1].startswith("__"):
            op = _operator_at(caller.f_code, caller.f_lasti)
            if op is not None:
                reflected = not op.startswith("i") and len(args) > 1 and \
                    not isinstance(args[1], torch.Tensor) and _reflected_at(caller)
                name = f"__{'r' if reflected else ''}{op}__"
                info = ("Tensor", name) if name in _names.TENSOR else _PASS
            elif info[0] == "Tensor?":
                info = _PASS
        if info is _PASS:
            return a.pass_op(func, args, kwargs)
        return a.run_op(info, func, args, kwargs)


_LIVE: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_at_exit() -> None:
    """Detach every live adapter while the interpreter still works (not from a weakref callback during
    teardown, when module globals are gone)."""
    for adapter in list(_LIVE):
        try:
            adapter.close()
        except Exception:  # pragma: no cover - best effort at exit
            pass


class TorchAdapter:
    """Attaches to one ``torch.nn.Module`` and feeds a :class:`Session`."""

    framework = "pytorch"

    def __init__(self, model: torch.nn.Module, level: str, session: Session, *, retain: bool = True,
                 retain_copy: bool = False) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
        self.level = level
        self.session = session
        # a model garbage-collected without close(): drop the global optimizer hooks with it
        self.model_ref = weakref.ref(model, lambda _ref: self.close())
        self.model_class = type(model).__name__
        self.capturing = True
        self.busy = False
        self.site: tuple | None = None  # call site of the op being recorded (set by the op mode)
        self._root_frame = None  # frame of the outermost module call in progress
        self._ok_frame = None  # last op caller frame known to be inside it
        self._disarmed: dict[int, _OpMode] = {}  # thread -> mode left on its stack by an interrupt
        self.retain = retain
        self.retain_copy = retain_copy
        self.closed = False
        #: optional observer of every completed node with its tensors and call (dump writers):
        #: ``tap(node, [(slot, tensor), ...], (args, kwargs, output) or None)`` on the training thread
        self.tap: Callable[[Any, list[tuple[str, torch.Tensor]], tuple | None], None] | None = None
        self.auto_step = True
        self.section = "forward"
        self._handles: list[RemovableHandle] = []
        self._step_handles: list[Any] = []
        self._api_cache: dict[Any, tuple[str, str] | None] = {}
        self._modes: dict[int, _OpMode] = {}
        self._scope: list[str] = []
        self._lock = threading.RLock()
        self._module_info: dict[int, tuple[str, str, bool, bool]] = {}
        self._param_info: dict[int, tuple[weakref.ref, str, str, str]] = {}
        self._buffer_info: dict[int, tuple[weakref.ref, str]] = {}
        self._new_step_state()
        self._attach(model)
        session.raw_source = self.buf.raw
        _LIVE.add(self)

    # -- step state -------------------------------------------------------------------------------
    def _new_step_state(self) -> None:
        self.buf = StatsBuffer()
        self.session.raw_source = self.buf.raw
        self._seen: dict[int, _Seen] = {}
        self._counts: dict[Any, int] = {}
        self._module_calls: dict[int, list[str]] = {}
        self._bwd_started: set[str] = set()
        self._done: set[str] = set()
        self._tapped: dict[str, list[tuple[str, torch.Tensor]]] = {}
        self._calls: dict[str, tuple] = {}
        self._inputs = 0
        self._param_seen: set[int] = set()
        self._opt_calls = 0
        self._pgrad_calls: dict[tuple[str, str], int] = {}
        self._pgrad_last: dict[str, tuple[str, str]] = {}
        #: id(tensor) -> (ref to it, ref to the tensor it stands for): a module's alias of its input, the
        #: result of an unrecorded call (weak both ways: nothing is kept alive for the graph's sake)
        self._alias: dict[int, tuple[weakref.ref, weakref.ref]] = {}
        self._called: set[str] = set()  # module paths called this step
        self._wrapped: dict[str, list[torch.Tensor]] = {}

    def end_step(self) -> None:
        with self._lock:
            raw = self.buf.raw()
            for h in self._step_handles:
                h.remove()
            self._step_handles = []
            self._pop_mode()
            self._scope.clear()
            self.section = "forward"
            self.session.end_step(raw)
            self._new_step_state()
        self.busy = True  # observers (watchpoints, control) run torch-free code; keep hooks quiet
        try:
            self.session.emit("step", self.session.step_index - 1)
        finally:
            self.busy = False

    def thread_exit(self) -> None:
        """The training thread is ending (finished, terminated or failed): close a partial step."""
        self.busy = False
        if len(self.session.recorder) and not self.closed:
            self.end_step()
        else:
            self._pop_mode()
            self._scope.clear()
            self.section = "forward"

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
        self._root_frame = self._ok_frame = None
        mode = self._modes.get(threading.get_ident())
        if mode is not None and not any(m is mode for m in torch.overrides._get_current_function_mode_stack()):
            # called from inside the mode's own dispatch (torch re-pushes it when we return): disarm it
            # (it passes everything through); the next outermost module call takes it off
            mode.armed = False
            self._modes.pop(threading.get_ident())
            self._disarmed[threading.get_ident()] = mode
        if len(self.session.recorder) and not self.closed:
            self.end_step()
        else:
            self._pop_mode()
            self._scope.clear()
            self.section = "forward"

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
        want_modules = self.level in ("L0", "mix")
        for path, mod in model.named_modules(remove_duplicate=False):
            if id(mod) in self._module_info:
                continue
            leaf = next(iter(mod.children()), None) is None
            self._module_info[id(mod)] = (path, type(mod).__name__, leaf, bool(getattr(mod, "inplace", False)))
            self._handles.append(mod.register_forward_pre_hook(self._pre_hook(want_modules), with_kwargs=True))
            self._handles.append(mod.register_forward_hook(self._post_hook(want_modules), with_kwargs=True,
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
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_hook(qual, owners[id(p)])))
            if self.retain:
                self.session.store.offer((f"Parameter.{qual}", "output.0"), TorchRef(p, copy=True), "initial")
        self._handles.append(_optim.register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(_optim.register_optimizer_step_post_hook(self._opt_post))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.capturing = False
        for h in self._handles + self._step_handles:
            h.remove()
        self._handles, self._step_handles = [], []
        self._pop_mode()
        self._drop_disarmed()  # this thread's, if any
        for mode in list(self._modes.values()) + list(self._disarmed.values()):
            mode.adapter = _Inert()  # modes left on other (finished) threads pass through now
        self._modes.clear()
        self._disarmed.clear()

    # -- L1 mode management -----------------------------------------------------------------------
    def _push_mode(self) -> None:
        if self.level == "L0" or self.closed:
            return
        tid = threading.get_ident()
        mode = self._modes.get(tid)
        if mode is None:
            mode = _OpMode(self)
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

    # -- recording --------------------------------------------------------------------------------
    def api_info(self, func: Any) -> tuple[str, str] | None:
        try:
            return self._api_cache[func]
        except KeyError:
            info = self._api_cache[func] = _api_prefix(func)
            return info
        except TypeError:  # unhashable callable
            return _api_prefix(func)

    def _scope_str(self) -> str:
        return self._scope[-1] if self._scope else ""

    def _slot(self, node, slot: str, t: torch.Tensor, *, as_input: bool, copy: bool = False,
              origin: bool = True, keep: bool = True) -> _Seen:
        """Record one tensor of ``node``: stats row (deduplicated), shape, retention, edge.

        ``origin``: an input nobody produced becomes a parameter/constant/input node (forward only).
        """
        tid = id(t)
        ver = _version_of(t)
        seen = self._seen.get(tid)
        if seen is None or seen.version != ver or seen.ref() is not t:
            row, dtype, why = self.buf.add(t)
            old = seen if seen is not None and seen.ref() is t else None
            seen = _Seen(weakref.ref(t), ver, row, dtype, why)
            if old is not None:  # modified in place by something not captured: same producer
                seen.producer = old.producer
            self._seen[tid] = seen
        shape = tuple(t.shape)
        key = (node.name, slot)
        rec = self.session.recorder
        rec.add(key, seen.row, seen.dtype, shape, t.numel())
        if seen.why is not None:
            rec.unsupported[rec.index[key]] = seen.why
        node.shapes[slot] = shape
        node.dtypes[slot] = seen.dtype
        if self.tap is not None:
            self._tapped.setdefault(node.name, []).append((slot, t))
        pinned = node.name in self.session.pinned
        if keep and (self.retain or pinned) and seen.why is None:
            store: TensorStore = self.session.store
            if seen.handle is None:
                if pinned or store.fits(t.numel() * t.element_size()):
                    seen.handle = TorchRef(t, copy=copy or self.retain_copy)
                    store.offer(key, seen.handle, force=pinned)
                else:
                    store.offer(key, _Size(t.numel() * t.element_size()))
            else:
                store.offer(key, seen.handle, force=pinned)
        if as_input:
            if seen.producer is None and origin:
                seen.producer = self._origin(t)
            if seen.producer is not None:
                self.session.graph.add_edge(seen.producer[0], node.name, seen.producer[1], slot)
        return seen

    def _origin(self, t: torch.Tensor) -> tuple[str, str]:
        """A tensor nobody produced this step: a parameter, a buffer (constant) or an input."""
        alias = self._alias.get(id(t))
        base = alias[1]() if alias is not None and alias[0]() is t else None
        if base is not None:  # a module's alias of its input / an unrecorded call's result: the input's origin
            seen = self._seen.get(id(base))
            seen = seen if seen is not None and seen.ref() is base else None
            if seen is not None and seen.producer is not None:
                return seen.producer
            producer = self._origin(base)
            if seen is not None:
                seen.producer = producer
            return producer
        info = self._param_info.get(id(t))
        if info is not None and info[0]() is t:
            return self._param_node(t, info), "output.0"
        binfo = self._buffer_info.get(id(t))
        s = self.session
        if binfo is not None and binfo[0]() is t:
            name = f"Constant.{binfo[1]}"
            node = s.node(name, kind="constant", op_type="buffer", scope=self._scope_str())
        else:
            name = f"Input.{self._inputs}"
            self._inputs += 1
            node = s.node(name, kind="input", op_type="input", scope="")
        self._slot(node, "output.0", t, as_input=False)
        return name, "output.0"

    def _param_node(self, p: torch.Tensor, info) -> str:
        _, qual, path, _cls = info
        name = f"Parameter.{qual}"
        if id(p) not in self._param_seen:
            self._param_seen.add(id(p))
            node = self.session.node(name, kind="parameter", op_type="Parameter", scope=path.replace(".", "/"))
            seen = self._slot(node, "output.0", p, as_input=False, copy=True)
            seen.producer = (name, "output.0")
        return name

    def _emit_node(self, node) -> None:
        """``node`` finished executing: its execution order is its completion order."""
        s = self.session
        if self.tap is not None:
            self.tap(node, self._tapped.pop(node.name, []), self._calls.pop(node.name, None))
        if node.name in self._done:  # a node with several gradient slots completes once
            return
        self._done.add(node.name)
        node.order = s.order
        s.order += 1
        if s.has_listeners("node"):
            self.busy = True
            try:
                self.session.emit("node", node)
            finally:
                self.busy = False

    # -- L1 ---------------------------------------------------------------------------------------
    def pass_op(self, func, args, kwargs):
        """Run a torch call msProbe does not record; its tensor result keeps the producer of its first
        tensor argument (a ``contiguous()`` copy, a ``x[0]`` view) so the graph stays connected."""
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and args and isinstance(args[0], torch.Tensor) and out is not args[0]:
            self._alias[id(out)] = (weakref.ref(out), weakref.ref(args[0]))
        return out

    def run_op(self, info: tuple[str, str], func, args, kwargs):
        prefix, api = info
        inplace = (api.endswith("_") and not api.endswith("__")) or api in (
            "__iadd__", "__isub__", "__imul__", "__itruediv__", "__setitem__", "__ifloordiv__", "__imod__",
            "__ipow__", "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__") or "out" in kwargs
        self.busy = True
        try:
            with torch._C.DisableTorchFunction():
                count = self._counts.get(info, 0)
                self._counts[info] = count + 1
                name = f"{prefix}.{api}.{count}.forward"
                section = self.section
                scope = "optimizer" if section == "optimizer" else self._scope_str()
                site, self.site = (scope, self.site), None
                node = self.session.node(name, kind="op", op_type=api, scope=scope, section=section,
                                         stack=_user_stack, pair=f"{prefix}.{api}.{count}.backward", site=site)
                for slot, t in _args_tensors(args, kwargs):
                    self._slot(node, slot, t, as_input=True)
                targets = [t for _, t in _args_tensors(args[:1], kwargs.get("out") and {"out": kwargs["out"]})] \
                    if inplace else []
                if info in _MUTATED_ARGS:
                    targets += mutated_args(info, args, kwargs)
                for t in targets:
                    seen = self._seen.get(id(t))
                    if seen is not None and seen.handle is not None:
                        seen.handle.snapshot()
        finally:
            self.busy = False
        out = func(*args, **kwargs)
        self.busy = True
        try:
            with torch._C.DisableTorchFunction():
                grad_fns = []
                for slot, t in _outputs(out):
                    seen = self._slot(node, slot, t, as_input=False)
                    seen.producer = (name, slot)
                    gf = t.grad_fn
                    if gf is not None and section != "optimizer" and gf not in grad_fns:
                        grad_fns.append(gf)
                for gf in grad_fns:
                    self._step_handles.append(gf.register_hook(self._op_bwd_hook(prefix, api, count, node)))
                if self.tap is not None:
                    self._calls[name] = (args, kwargs, out)
        finally:
            self.busy = False
        self._emit_node(node)
        return out

    def _op_bwd_hook(self, prefix: str, api: str, count: int, fwd) -> Callable:
        name = f"{prefix}.{api}.{count}.backward"
        scope = fwd.scope

        def hook(grad_inputs, grad_outputs):
            if not self.capturing:
                return None
            with torch._C.DisableTorchFunction():
                node = self.session.node(name, kind="op", op_type=api, scope=scope, section="backward",
                                         pair=fwd.name)
                for slot, g in _tensors(tuple(grad_outputs), "input"):
                    self._slot(node, slot, g, as_input=True, origin=False)
                for slot, g in _tensors(tuple(grad_inputs), "output"):
                    self._slot(node, slot, g, as_input=False).producer = (name, slot)
            self._emit_node(node)
            return None

        return hook

    # -- L0 ---------------------------------------------------------------------------------------
    def _pre_hook(self, want: bool) -> Callable:
        def pre(mod, args, kwargs):
            if not self.capturing or self.busy:
                return None
            if self._scope and not self._root_alive(sys._getframe(1)):
                self.interrupted()  # the previous outermost call never returned (KeyboardInterrupt)
            if not self._scope:  # the outermost call: make sure the op mode is on in this thread
                self._root_frame = sys._getframe(1)
                if self._disarmed:
                    self._drop_disarmed()
                self._push_mode()
            path, cls, leaf, inplace = self._module_info[id(mod)]
            self._called.add(path)
            self._scope.append(path.replace(".", "/"))
            if not want or not path:  # msProbe does not name the root module; neither do we
                return None
            self.busy = True
            try:
                with torch._C.DisableTorchFunction():
                    calls = self._module_calls.setdefault(id(mod), [])
                    n = len(calls)
                    name = f"Module.{path}.{cls}.forward.{n}" if path else f"Module.{cls}.forward.{n}"
                    calls.append(name)
                    parent = path.rpartition(".")[0].replace(".", "/") if path else ""
                    node = self.session.node(name, kind="module", op_type=cls, scope=parent,
                                             stack=_user_stack, pair=name.replace(".forward.", ".backward."))
                    for slot, t in _args_tensors(args, kwargs):
                        seen = self._slot(node, slot, t, as_input=leaf)
                        if inplace and seen.handle is not None:
                            seen.handle.snapshot()
                    for local, p in mod.named_parameters(recurse=False):
                        pname = self._param_node(p, self._param_info[id(p)])
                        self._slot(node, f"parameters.{local}", p, as_input=False, copy=True)
                        self.session.graph.add_edge(pname, name, "output.0", f"parameters.{local}")
                    if not inplace and torch.is_grad_enabled():
                        return self._wrap_inputs(name, args, kwargs)
            finally:
                self.busy = False
            return None

        return pre

    def _wrap_inputs(self, name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """Give the module its own alias (a view) of each input that needs a gradient.

        A hook on the input itself would see its *total* gradient (every consumer's share); a hook on
        the module's alias sees the module's share only, which is what a full backward hook reports —
        and never fires when no gradient flows through the module."""
        wrapped: list[torch.Tensor] = []

        def wrap(t: Any) -> Any:
            if not isinstance(t, torch.Tensor) or not t.requires_grad:
                return t
            v = t.view_as(t)
            base = self._seen.get(id(t))
            if base is not None:
                seen = _Seen(weakref.ref(v), _version_of(v), base.row, base.dtype, base.why)
                seen.handle, seen.producer = base.handle, base.producer
                self._seen[id(v)] = seen
            self._alias[id(v)] = (weakref.ref(v), weakref.ref(t))
            wrapped.append(v)
            return v

        new_args = tuple(wrap(a) for a in args)  # positional inputs only, as a full backward hook
        if not wrapped:
            return None
        self._wrapped[name] = wrapped
        return new_args, kwargs

    def _post_hook(self, want: bool) -> Callable:
        def post(mod, args, kwargs, output):
            if self._scope and not self.busy:
                self._scope.pop()
                if not self._scope:  # the outermost call returned
                    self._root_frame = self._ok_frame = None
            if not want or not self.capturing or self.busy:
                return None
            path, cls, leaf, inplace = self._module_info[id(mod)]
            if not path:
                return None
            calls = self._module_calls.get(id(mod))
            if not calls:
                return None
            name = calls[-1]
            node = self.session.graph.nodes[name]
            n = int(name.rsplit(".", 1)[1])
            self.busy = True
            try:
                with torch._C.DisableTorchFunction():
                    produced = False
                    for slot, t in _outputs(output):
                        seen = self._slot(node, slot, t, as_input=False)
                        if seen.producer is None or seen.producer[0].startswith("Input."):
                            seen.producer = (name, slot)
                            produced = True
                    if produced and not leaf:  # a container computing its own result: connect its inputs
                        for slot, t in _args_tensors(args, kwargs):
                            s = self._seen.get(id(t))
                            if s is not None and s.producer is not None and s.producer[0] != name:
                                self.session.graph.add_edge(s.producer[0], name, s.producer[1], slot)
                    self._module_bwd_hooks(path, cls, n, node, args, kwargs, output, inplace)
                    if self.tap is not None:
                        self._calls[name] = (args, kwargs, output)
            finally:
                self.busy = False
            self._emit_node(node)
            return None

        return post

    def _module_bwd_hooks(self, path, cls, n, fwd, args, kwargs, output, inplace) -> None:
        if inplace:  # msProbe's full backward hook never reports a module that overwrites its input
            return
        base = f"Module.{path}.{cls}" if path else f"Module.{cls}"
        name = f"{base}.backward.{n}"
        scope = fwd.scope
        # numbered as a full backward hook numbers them (msProbe): the output's tensors that need a
        # gradient, flattened (a dict / ModelOutput included), and the positional inputs that do
        k = 0
        for _slot, t in _outputs(output, "input"):
            if t.requires_grad and t.grad_fn is not None:
                hook = self._module_grad(name, scope, fwd.name, f"input.{k}", True)
                self._step_handles.append(t.register_hook(hook))
                k += 1
        for j, t in enumerate(self._wrapped.pop(fwd.name, None) or ()):  # the module's own input aliases
            self._step_handles.append(t.register_hook(self._module_grad(name, scope, fwd.name, f"output.{j}", False)))

    def _module_grad(self, name, scope, pair, slot, is_input) -> Callable:
        def hook(grad):
            if not self.capturing or grad is None:
                return None
            with torch._C.DisableTorchFunction():
                node = self._bwd_node(name, scope, pair, "module")
                seen = self._slot(node, slot, grad, as_input=is_input, origin=False)
                if not is_input:
                    seen.producer = (name, slot)
            self._emit_node(node)
            return None

        return hook

    def _bwd_node(self, name, scope, pair, kind):
        if name in self._bwd_started:
            return self.session.graph.nodes[name]
        self._bwd_started.add(name)
        op_type = name.split(".")[-3] if kind == "module" else name
        return self.session.node(name, kind=kind, op_type=op_type, scope=scope, section="backward", pair=pair)

    # -- parameter gradients ----------------------------------------------------------------------
    def _grad_hook(self, qual: str, owners: list[tuple[str, str, str]]) -> Callable:
        """One ``parameters_grad`` entry per owning module called this step (tied weights: each owner),
        as msProbe writes them: a parameter used without a call of its module has none at L0/mix (at L1,
        where no module call is recorded, it is recorded under its first owner)."""
        slots = []
        for path, cls, local in owners:
            base = f"Module.{path}.{cls}.parameters_grad" if path else f"Module.{cls}.parameters_grad"
            slots.append((path, base, path.rpartition(".")[0].replace(".", "/") if path else "", local))

        def hook(p):
            if not self.capturing or p.grad is None:
                return
            called = [o for o in slots if o[0] in self._called]
            if not called and self.level == "L1":  # no module calls are recorded: the first owner
                called = slots[:1]
            for _path, base, scope, local in called:
                with torch._C.DisableTorchFunction():
                    n = self._pgrad_calls.get((base, local), 0)  # one more backward into this parameter
                    self._pgrad_calls[(base, local)] = n + 1
                    name = f"{base}.{n}"
                    self._pgrad_last[qual] = (name, local)
                    if name in self._bwd_started:
                        node = self.session.graph.nodes[name]
                    else:
                        self._bwd_started.add(name)
                        node = self.session.node(name, kind="parameter", op_type="parameters_grad", scope=scope,
                                                 section="backward")
                    seen = self._slot(node, local, p.grad, as_input=False)
                    if seen.producer is None:
                        seen.producer = (name, local)
                    if f"Parameter.{qual}" in self.session.graph.nodes:  # L0: used without a module call
                        self.session.graph.add_edge(f"Parameter.{qual}", name, "output.0", local)
                self._emit_node(node)

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
        if self.capturing and self._ours(opt):
            self.section = "optimizer"
            self._push_mode()

    def _opt_post(self, opt, args, kwargs) -> None:
        params = self._ours(opt)
        if not params:
            return
        if self.capturing:
            with torch._C.DisableTorchFunction():
                name = f"Optimizer.{type(opt).__name__}.step.{self._opt_calls}"
                self._opt_calls += 1
                node = self.session.node(name, kind="op", op_type="step", scope="optimizer",
                                         section="optimizer")
                for qual, p in params:
                    slot = f"parameters.{qual}"
                    self.busy = True
                    try:
                        # updated values: statistics only; the value is next step's Parameter node
                        self._slot(node, slot, p, as_input=False, keep=False)
                    finally:
                        self.busy = False
                    pnode = f"Parameter.{qual}"
                    if pnode in self.session.graph.nodes:
                        self.session.graph.add_edge(pnode, name, "output.0", slot)
                    last = self._pgrad_last.get(qual)
                    if last is not None:
                        self.session.graph.add_edge(last[0], name, last[1], slot)
            self._emit_node(node)
        self.section = "forward"
        if self.auto_step and self.capturing:
            self.end_step()


class _Inert:
    """Stands in for a closed adapter inside a mode object that could not be popped."""

    capturing = False
    busy = False


class _Size:
    """A handle that only states a size (for a tensor refused for the budget)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def numpy(self):  # pragma: no cover - never stored
        raise NotRetainedError("not retained")
