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

Parameters are nodes (``Parameter.{name}``); ``optimizer(grads)`` — any ``mindspore.nn.Optimizer``
holding the model's parameters — is its own section (``Optimizer.SGD.step.0``) and ends the step
unless the user marks steps with ``Debugger.step()`` (or :class:`~nbdebug.frameworks.mindspore_adapter.StepCallback`
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
import inspect
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import mindspore as ms
from mindspore import mint, nn, ops
from mindspore.common.parameter import Parameter
from mindspore.mint.nn import functional as mint_functional
from mindspore.ops.primitive import Primitive

try:  # mindspore.common.api is deprecated since 2.9 and says so on stderr when imported
    from mindspore.graph.api import _pynative_executor
except ImportError:  # pragma: no cover - older MindSpore
    from mindspore.common.api import _pynative_executor

from ..session.session import Session
from ..session.store import NotRetainedError, TensorStore
from .mindspore_stats import StatsBuffer

LEVELS = ("L0", "L1", "mix")

Tensor = ms.Tensor
TensorBase = Tensor.__mro__[1]  # TensorPy: Tensor and Parameter both derive from it

# Tensor attributes that read metadata, convert, or manage hooks: never graph nodes.
_SKIP_TENSOR = frozenset({
    "asnumpy", "numpy", "item", "tolist", "data_ptr", "data_sync", "is_contiguous", "contiguous", "dim",
    "ndimension", "numel", "nelement", "size", "stride", "storage_offset", "element_size", "itemsize",
    "register_hook", "init_data", "set_dtype", "set_data", "assign_value", "has_init", "is_init",
    "is_persistent_data", "flush_from_cache", "offload", "move_to", "is_signed", "is_floating_point",
    "is_complex", "get_bytes", "untyped_storage", "storage", "requires_grad_", "set_const_arg",
    "from_numpy", "index_of_parent_", "parent_tensor_", "set_", "delete_", "to_", "slice_num_of_persistent_data",
    "slice_shape_of_persistent_data", "is_slice", "setitem_index_info", "convert_bytes_to_tensor", "_offload",
    "type", "device", "is_pinned", "pin_memory", "check_param_init", "backward", "get_device", "tensor",
})
_DUNDER_OPS = frozenset({
    "__add__", "__radd__", "__iadd__", "__sub__", "__rsub__", "__isub__", "__mul__", "__rmul__", "__imul__",
    "__truediv__", "__rtruediv__", "__itruediv__", "__floordiv__", "__rfloordiv__", "__ifloordiv__", "__mod__",
    "__rmod__", "__imod__", "__pow__", "__rpow__", "__ipow__", "__matmul__", "__rmatmul__", "__neg__",
    "__pos__", "__abs__", "__invert__", "__and__", "__or__", "__xor__", "__rand__", "__ror__", "__rxor__",
    "__lshift__", "__rshift__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__", "__getitem__",
    "__setitem__",
})
_INPLACE_DUNDER = frozenset({
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__", "__setitem__",
})
# Functions that take functions, control compilation, or only read metadata: never wrapped.
_SKIP_FUNCS = frozenset({
    "grad", "value_and_grad", "vjp", "jvp", "vmap", "jacfwd", "jacrev", "hessian", "derivative", "jit",
    "custom_vjp", "stop_gradient", "depend", "print_", "tensor_dump", "TensorDump", "shape", "dtype", "rank",
    "size", "is_tensor", "is_nonzero", "is_floating_point", "is_complex", "numel", "typeof", "isconstant",
    "tensor_shape", "dyn_shape", "hook", "HookBackward", "get_grad", "clear_compile_cache", "no_grad",
    "enable_grad", "set_grad_enabled", "is_grad_enabled", "is_autocast_enabled", "constexpr", "primitive",
    "prim_attr_register", "kernel", "ms_class", "ms_function", "custom_info_register", "op_info_register",
    "get_vm_impl_fn", "DataType", "deepcopy", "make_sparse_tensor", "finfo", "iinfo", "set_printoptions",
    "seed", "manual_seed", "initial_seed", "get_rng_state", "set_rng_state",
})
_INPLACE_FUNCS = frozenset({"assign", "assign_add", "assign_sub"})
# Primitives that answer questions about a tensor rather than compute one.
_SKIP_PRIMITIVES = frozenset({"Shape", "DType", "Rank", "Size", "TensorShape", "DynamicShape", "IsInstance",
                              "Depend", "UpdateState", "Load", "HookBackward", "CellBackwardHook"})
_NAMESPACES = (("Functional", ops), ("Mint", mint), ("MintFunctional", mint_functional))


def _is_tensor(obj: Any) -> bool:
    return isinstance(obj, TensorBase)


def _tensors(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """Flatten args/outputs into msProbe data names (``input.0``, ``output.1.0`` ...)."""
    if isinstance(obj, TensorBase):
        yield prefix, obj
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _tensors(item, f"{prefix}.{i}")
    elif isinstance(obj, dict):
        for k, item in obj.items():
            yield from _tensors(item, f"{prefix}.{k}")


def _outputs(obj: Any, prefix: str = "output") -> Iterator[tuple[str, Any]]:
    """Outputs are a list in msProbe's data names: a lone tensor is ``output.0``."""
    return _tensors((obj,) if isinstance(obj, TensorBase) else obj, prefix)


def _args_tensors(args: tuple, kwargs: dict | None) -> Iterator[tuple[str, Any]]:
    for i, a in enumerate(args):
        yield from _tensors(a, f"input.{i}")
    if kwargs:
        for k, v in kwargs.items():
            yield from _tensors(v, f"input.{k}")


def _user_stack(limit: int = 8) -> list[str]:
    """The caller's Python frames, innermost first, without MindSpore's and nbdebug's own frames."""
    out: list[str] = []
    f = sys._getframe(2)
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if "/mindspore/" not in fn and "/nbdebug/frameworks/" not in fn and "/nbdebug/control/" not in fn:
            out.append(f"File {fn}, line {f.f_lineno}, in {f.f_code.co_name}")
        f = f.f_back
    return out


def _grad_recording() -> bool:
    """True inside a forward that MindSpore records for a gradient (``value_and_grad``, ``grad``...)."""
    return bool(_pynative_executor.requires_grad())


class MSRef:
    """Retention handle: a reference to a MindSpore tensor, or a private copy (``ops.deepcopy``)."""

    __slots__ = ("tensor", "nbytes", "copied", "__weakref__")

    def __init__(self, t: Any, copy: bool, nbytes: int = 0) -> None:
        self.copied = copy
        self.tensor = ops.deepcopy(t) if copy else t
        self.nbytes = nbytes  # known once the value exists (the adapter fills it in before offering)

    def snapshot(self) -> None:
        """Take a private copy now (called before an in-place op overwrites the value)."""
        if not self.copied:
            self.tensor = ops.deepcopy(self.tensor)
            self.copied = True

    def numpy(self):
        t = self.tensor
        if t.dtype == ms.bfloat16:
            t = t.astype(ms.float32)
        return t.asnumpy().copy()  # asnumpy is a view of MindSpore's memory on CPU


class _Size:
    """A handle that only states a size (for a tensor refused for the budget)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def numpy(self):  # pragma: no cover - never stored
        raise NotRetainedError("not retained")


class _Seen:
    """What the step knows of one tensor object."""

    __slots__ = ("ref", "row", "handle", "producer")

    def __init__(self, ref, row) -> None:
        self.ref, self.row = ref, row
        self.handle: MSRef | None = None
        self.producer: tuple[str, str] | None = None


# -- global op wrappers ---------------------------------------------------------------------------

class _OpPatches:
    """Wrappers around ops / mint / mint.nn.functional functions and Tensor methods.

    Installed while at least one L1/mix adapter is attached; the most recently attached one records.
    """

    def __init__(self) -> None:
        self.adapters: list[PyNativeAdapter] = []
        self.saved: list[tuple[Any, str, bool, Any]] = []  # (owner, name, had its own attribute, original)
        self.lock = threading.Lock()

    @property
    def active(self) -> PyNativeAdapter | None:
        return self.adapters[-1] if self.adapters else None

    def install(self, adapter: PyNativeAdapter) -> None:
        with self.lock:
            self.adapters.append(adapter)
            if len(self.adapters) == 1:
                self._patch()

    def uninstall(self, adapter: PyNativeAdapter) -> None:
        with self.lock:
            if adapter in self.adapters:
                self.adapters.remove(adapter)
            if not self.adapters:
                self._restore()

    def _set(self, owner: Any, name: str, wrapper: Any) -> None:
        had = name in owner.__dict__
        self.saved.append((owner, name, had, owner.__dict__.get(name)))
        setattr(owner, name, wrapper)

    def _patch(self) -> None:
        for prefix, module in _NAMESPACES:
            for name, fn in list(vars(module).items()):
                if name.startswith("_") or name in _SKIP_FUNCS or not isinstance(fn, types.FunctionType):
                    continue
                if not (getattr(fn, "__module__", "") or "").startswith("mindspore"):
                    continue
                self._set(module, name, _wrap_function(fn, (prefix, name, name, name in _INPLACE_FUNCS)))
        for owner in (Tensor, Parameter):
            for name in dir(Tensor):
                if name in _SKIP_TENSOR or (name.startswith("_") and name not in _DUNDER_OPS):
                    continue
                if owner is Parameter and name in Parameter.__dict__:
                    continue  # Parameter's own methods (copy, clone ...) manage the parameter itself
                try:
                    orig = inspect.getattr_static(owner, name)
                except AttributeError:  # Tensor-only attribute
                    continue
                if not isinstance(orig, (types.FunctionType, types.MethodDescriptorType,
                                         types.WrapperDescriptorType)):
                    continue
                inplace = name in _INPLACE_DUNDER or (name.endswith("_") and not name.endswith("__"))
                self._set(owner, name, _wrap_method(orig, ("Tensor", name, name, inplace)))

    def _restore(self) -> None:
        for owner, name, had, orig in reversed(self.saved):
            if had:
                setattr(owner, name, orig)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
        self.saved.clear()


_OPS = _OpPatches()


def _wrap_function(fn: Callable, info: tuple) -> Callable:
    def wrapper(*args, **kwargs):
        a = _OPS.active
        if a is None or not a.wants_op():
            return fn(*args, **kwargs)
        return a.run_op(info, fn, args, kwargs)

    functools.update_wrapper(wrapper, fn)
    wrapper.__nbdebug_wrapped__ = True
    return wrapper


def _wrap_method(method: Any, info: tuple) -> Callable:
    def wrapper(*args, **kwargs):
        a = _OPS.active
        if a is None or not a.wants_op():
            return method(*args, **kwargs)
        return a.run_op(info, method, args, kwargs)

    try:
        functools.update_wrapper(wrapper, method)
    except (AttributeError, TypeError):  # pragma: no cover - descriptors without metadata
        wrapper.__name__ = info[1]
    wrapper.__nbdebug_wrapped__ = True
    return wrapper


# Primitive instances held by the model's Cells get a recording subclass while attached.
_PRIM_INFO: dict[int, tuple[str, str, str, bool]] = {}
_PRIM_CLASSES: dict[type, type] = {}


def _recording_class(cls: type) -> type:
    sub = _PRIM_CLASSES.get(cls)
    if sub is None:
        base_call = cls.__call__

        def __call__(self, *args, **kwargs):
            a = _OPS.active
            info = _PRIM_INFO.get(id(self))
            if a is None or info is None or not a.wants_op():
                return base_call(self, *args, **kwargs)
            return a.run_op(info, functools.partial(base_call, self), args, kwargs)

        sub = type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__, "__nbdebug_base__": cls})
        _PRIM_CLASSES[cls] = sub
    return sub


# -- optimizer ------------------------------------------------------------------------------------

class _OptimizerPatch:
    """``mindspore.nn.Optimizer.__call__`` routed through the attached adapters (refcounted)."""

    def __init__(self) -> None:
        self.adapters: list[PyNativeAdapter] = []
        self.had: bool = False
        self.orig: Any = None

    def install(self, adapter: PyNativeAdapter) -> None:
        self.adapters.append(adapter)
        if len(self.adapters) == 1:
            self.had = "__call__" in nn.Optimizer.__dict__
            self.orig = nn.Optimizer.__dict__.get("__call__")
            base = nn.Optimizer.__call__

            def __call__(opt, *args, **kwargs):
                mine = [a for a in self.adapters if a.owns_optimizer(opt)]
                for a in mine:
                    a.optimizer_pre(opt)
                try:
                    out = base(opt, *args, **kwargs)
                except BaseException:
                    for a in mine:
                        a.section = "forward"
                    raise
                for a in mine:
                    a.optimizer_post(opt)
                return out

            __call__.__nbdebug_wrapped__ = True
            nn.Optimizer.__call__ = __call__

    def uninstall(self, adapter: PyNativeAdapter) -> None:
        if adapter in self.adapters:
            self.adapters.remove(adapter)
            if not self.adapters:
                if self.had:
                    nn.Optimizer.__call__ = self.orig
                else:
                    del nn.Optimizer.__call__


_OPT = _OptimizerPatch()


class PyNativeAdapter:
    """Attaches to one ``mindspore.nn.Cell`` (PyNative mode) and feeds a :class:`Session`."""

    framework = "mindspore"

    def __init__(self, model: nn.Cell, level: str, session: Session, *, retain: bool = True,
                 retain_copy: bool = False) -> None:
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
        self.level = level
        self.session = session
        self.model_ref = weakref.ref(model)
        self.model_class = type(model).__name__
        self.capturing = True
        self.busy = False
        self.retain = retain
        self.retain_copy = retain_copy
        self.closed = False
        #: optional observer of every completed node: ``tap(node, [(slot, tensor), ...], call or None)``
        self.tap: Callable[[Any, list[tuple[str, Any]], tuple | None], None] | None = None
        self.auto_step = True
        self.section = "forward"
        self._depth = 0
        self._threads: set[int] = set()
        self._handles: list[Any] = []
        self._scope: list[str] = []
        self._lock = threading.RLock()
        self._cell_info: dict[int, tuple[str, str, bool]] = {}
        self._param_info: dict[int, tuple[weakref.ref, str, str, str, str]] = {}
        self._prims: list[tuple[Any, type]] = []
        self._hb_cache: dict[tuple[str, str], Any] = {}
        self._opt_owned: dict[int, bool] = {}
        self._new_step_state()
        self._attach(model)
        # values of the step in progress are offered to the store at a flush
        session.before_read = lambda: None if self.closed else self.sync()

    # -- step state -------------------------------------------------------------------------------
    def _new_step_state(self) -> None:
        self.buf = StatsBuffer()
        self.session.raw_source = self._raw
        self._unresolved: list[tuple[int, Any, str, int]] = []  # (recorder index, node, slot, row)
        self._offers: list[tuple[tuple[str, str], MSRef, int]] = []  # retention, offered at flush
        self._seen: dict[int, _Seen] = {}  # by id; a weak reference tells a reused id apart
        self._counts: dict[Any, int] = {}
        self._cell_calls: dict[int, list[str]] = {}
        self._bwd_started: set[str] = set()
        self._done: set[str] = set()
        self._tapped: dict[str, list[tuple[str, Any]]] = {}
        self._calls: dict[str, tuple] = {}
        self._inputs = 0
        self._param_seen: set[int] = set()
        self._opt_calls = 0
        self._pgrad_calls: dict[tuple[str, str], int] = {}
        self._pgrad_last: dict[str, tuple[str, str]] = {}

    def _raw(self):
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
        meta = self.buf.meta
        rec = self.session.recorder
        unresolved, self._unresolved = self._unresolved, []
        offers, self._offers = self._offers, []
        for item in unresolved:
            i, node, slot, row = item
            if row not in meta:  # queued by the training thread after this flush started
                self._unresolved.append(item)
                continue
            dtype, shape, count, why, _ = meta[row]
            node.shapes[slot] = shape
            node.dtypes[slot] = dtype
            if i < len(rec.rows) and rec.rows[i] == row:
                rec.dtypes[i], rec.shapes[i], rec.counts[i] = dtype, shape, count
                if why is not None:
                    rec.unsupported[i] = why
        store: TensorStore = self.session.store
        for item in offers:
            key, handle, row = item
            if row not in meta:
                self._offers.append(item)
                continue
            if not handle.nbytes:
                handle.nbytes = meta[row][4]
            store.offer(key, handle)

    def end_step(self) -> None:
        with self._lock:
            raw = self._raw()
            self._backward_edges()
            self._threads.discard(threading.get_ident())
            self._scope.clear()
            self.section = "forward"
            self.session.end_step(raw)
            self._new_step_state()
        self.busy = True  # observers (watchpoints, control) run framework-free code; keep hooks quiet
        try:
            self.session.emit("step", self.session.step_index - 1)
        finally:
            self.busy = False

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
        if len(self.session.recorder) and not self.closed:
            self.end_step()
        else:
            self._threads.discard(threading.get_ident())
            self._scope.clear()
            self.section = "forward"

    # -- attach / detach --------------------------------------------------------------------------
    def _attach(self, model: nn.Cell) -> None:
        want_cells = self.level in ("L0", "mix")
        for path, cell in model.cells_and_names():
            if id(cell) in self._cell_info:
                continue
            leaf = next(iter(cell.cells()), None) is None
            self._cell_info[id(cell)] = (path, type(cell).__name__, leaf)
            self._handles.append(cell.register_forward_pre_hook(self._pre_hook(want_cells), with_kwargs=True))
            self._handles.append(cell.register_forward_hook(self._post_hook(want_cells), with_kwargs=True,
                                                            always_call=True))
        owners: dict[int, tuple[str, str, str]] = {}
        for path, cell in model.cells_and_names():
            for local, p in cell._params.items():
                if p is not None and id(p) not in owners:
                    owners[id(p)] = (path, type(cell).__name__, local)
        for qual, p in model.parameters_and_names():
            path, cls, local = owners.get(id(p), ("", type(model).__name__, qual))
            self._param_info[id(p)] = (weakref.ref(p), qual, path, cls, local)
            if p.requires_grad:
                self._handles.append(p.register_hook(self._grad_hook(qual, path, cls, local)))
            if self.retain:
                self.session.store.offer((f"Parameter.{qual}", "output.0"),
                                         MSRef(p, copy=True, nbytes=int(p.size) * int(p.itemsize)), "initial")
        if self.level in ("L1", "mix"):
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

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.capturing = False
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001 - a tensor hook whose tensor is gone
                pass
        self._handles = []
        for prim, cls in self._prims:
            prim.__class__ = cls
            _PRIM_INFO.pop(id(prim), None)
        self._prims.clear()
        if self.level in ("L1", "mix"):
            _OPS.uninstall(self)
        _OPT.uninstall(self)
        self._threads.clear()
        self._hb_cache.clear()
        self._seen.clear()

    # -- recording --------------------------------------------------------------------------------
    def wants_op(self) -> bool:
        """Whether an API call right now, on this thread, is a node."""
        return (self.capturing and not self.busy and not self._depth
                and threading.get_ident() in self._threads)

    def _scope_str(self) -> str:
        return self._scope[-1] if self._scope else ""

    def _slot(self, node, slot: str, t: Any, *, as_input: bool, copy: bool = False,
              origin: bool = True) -> _Seen:
        """Record one tensor of ``node``: stats row (deduplicated), retention, edge — reading nothing
        of the tensor (its shape and dtype are filled in at the next flush)."""
        tid = id(t)
        seen = self._seen.get(tid)
        if seen is None or seen.ref() is not t:
            seen = _Seen(weakref.ref(t), self.buf.add(t))  # the buffer holds t until it is reduced
            self._seen[tid] = seen
        key = (node.name, slot)
        rec = self.session.recorder
        rec.add(key, seen.row, "", (), 0)
        self._unresolved.append((rec.index[key], node, slot, seen.row))
        node.shapes.setdefault(slot, ())
        if self.tap is not None:
            self._tapped.setdefault(node.name, []).append((slot, t))
        if self.retain:
            if seen.handle is None or (copy and not seen.handle.copied):
                seen.handle = MSRef(t, copy=copy or self.retain_copy)
            self._offers.append((key, seen.handle, seen.row))
        if as_input:
            if seen.producer is None and origin:
                seen.producer = self._origin(t)
            if seen.producer is not None:
                self.session.graph.add_edge(seen.producer[0], node.name, seen.producer[1], slot)
        return seen

    def _alias(self, new: Any, old: Any) -> None:
        """``new`` (an identity of ``old`` inserted for a backward hook) carries ``old``'s record."""
        seen = self._seen.get(id(old))
        if seen is None or seen.ref() is not old:
            return
        alias = _Seen(weakref.ref(new), seen.row)
        alias.handle, alias.producer = seen.handle, seen.producer
        self._seen[id(new)] = alias

    def _origin(self, t: Any) -> tuple[str, str]:
        """A tensor nobody produced this step: a parameter or an input."""
        info = self._param_info.get(id(t))
        if info is not None and info[0]() is t:
            return self._param_node(t, info), "output.0"
        name = f"Input.{self._inputs}"
        self._inputs += 1
        node = self.session.node(name, kind="input", op_type="input", scope="")
        self._slot(node, "output.0", t, as_input=False)
        return name, "output.0"

    def _param_node(self, p: Any, info) -> str:
        _, qual, path, _cls, _local = info
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

    def _hook_backward(self, name: str, scope: str, pair: str, kind: str, slot: str, is_input: bool = False) -> Any:
        """A cached ``HookBackward`` identity whose gradient is ``slot`` of backward node ``name``."""
        key = (name, slot)
        hb = self._hb_cache.get(key)
        if hb is None:
            def fn(grad, self=self, name=name, scope=scope, pair=pair, kind=kind, slot=slot, is_input=is_input):
                g = grad[0] if isinstance(grad, tuple) else grad
                if self.capturing and not self.closed and _is_tensor(g):
                    self._grad_slot(name, scope, pair, kind, slot, g, is_input=is_input)
                return None

            hb = self._hb_cache[key] = ops.HookBackward(fn)
        return hb

    def _hooked_outputs(self, name: str, scope: str, pair: str, kind: str, output: Any) -> Any:
        """Gradients of a node's outputs are the ``input.*`` slots of its backward node: a gradient probe
        goes behind every output tensor (top level), and the probed tensors are what the caller gets."""
        if _is_tensor(output):
            new = self._hook_backward(name, scope, pair, kind, "input.0", True)(output)
            self._alias(new, output)
            return new
        if isinstance(output, tuple) and any(_is_tensor(o) for o in output):
            items = list(output)
            for i, o in enumerate(items):
                if _is_tensor(o):
                    items[i] = self._hook_backward(name, scope, pair, kind, f"input.{i}", True)(o)
                    self._alias(items[i], o)
            return type(output)(items) if type(output) is tuple else output
        return output

    def _hooked_inputs(self, args: tuple, kwargs: dict, name: str, scope: str, pair: str,
                       kind: str) -> tuple[tuple, dict, bool]:
        """Put a gradient probe in front of every floating-point input (top-level tensors)."""
        changed = False
        new_args = list(args)
        for i, a in enumerate(args):
            if _is_tensor(a) and not isinstance(a, Parameter):  # a Parameter may be updated in place
                new_args[i] = self._hook_backward(name, scope, pair, kind, f"output.{i}")(a)
                self._alias(new_args[i], a)
                changed = True
        new_kwargs = kwargs
        if kwargs:
            for k, v in kwargs.items():
                if _is_tensor(v) and not isinstance(v, Parameter):
                    if new_kwargs is kwargs:
                        new_kwargs = dict(kwargs)
                    new_kwargs[k] = self._hook_backward(name, scope, pair, kind, f"output.{k}")(v)
                    self._alias(new_kwargs[k], v)
                    changed = True
        return tuple(new_args), new_kwargs, changed

    def _grad_slot(self, name, scope, pair, kind, slot, grad, *, is_input: bool) -> None:
        with self._lock:
            self.busy = True
            try:
                node = self._bwd_node(name, scope, pair, kind)
                seen = self._slot(node, slot, grad, as_input=is_input, origin=False)
                if not is_input:
                    seen.producer = (name, slot)
            finally:
                self.busy = False
        self._emit_node(node)

    def _bwd_node(self, name, scope, pair, kind):
        if name in self._bwd_started:
            return self.session.graph.nodes[name]
        self._bwd_started.add(name)
        if kind == "module":
            op_type = name.split(".")[-3]
        else:
            op_type = self.session.graph.nodes[pair].op_type if pair in self.session.graph.nodes else name
        return self.session.node(name, kind=kind, op_type=op_type, scope=scope, section="backward", pair=pair)

    def _backward_edges(self) -> None:
        """Backward data flow mirrors the forward edges of the nodes whose backward ran this step."""
        g = self.session.graph
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
            scope = "optimizer" if section == "optimizer" else self._scope_str()
            node = self.session.node(name, kind="op", op_type=op_type, scope=scope, section=section,
                                     stack=_user_stack, pair=bwd)
            for slot, t in _args_tensors(args, kwargs):
                self._slot(node, slot, t, as_input=True)
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
            for slot, t in _outputs(out):
                seen = self._slot(node, slot, t, as_input=False)
                seen.producer = (name, slot)
            if grad:
                out = self._hooked_outputs(bwd, scope, name, "op", out)
            if self.tap is not None:
                self._calls[name] = (args, kwargs, out)
        finally:
            self.busy = False
        self._emit_node(node)
        return out

    # -- L0 ---------------------------------------------------------------------------------------
    def _pre_hook(self, want: bool) -> Callable:
        def pre(cell, args, kwargs):
            if not self.capturing or self.busy or self._depth:
                return None
            if not self._scope:  # the outermost call: ops on this thread are nodes from now on
                self._threads.add(threading.get_ident())
            path, cls, leaf = self._cell_info[id(cell)]
            self._scope.append(path.replace(".", "/"))
            if not want or not path:  # msProbe does not name the root Cell; neither do we
                return None
            self.busy = True
            try:
                calls = self._cell_calls.setdefault(id(cell), [])
                n = len(calls)
                name = f"Cell.{path}.{cls}.forward.{n}"
                bwd = f"Cell.{path}.{cls}.backward.{n}"
                calls.append(name)
                parent = path.rpartition(".")[0].replace(".", "/")
                node = self.session.node(name, kind="module", op_type=cls, scope=parent, stack=_user_stack,
                                         pair=bwd)
                for slot, t in _args_tensors(args, kwargs):
                    self._slot(node, slot, t, as_input=leaf)
                for local, p in cell._params.items():
                    info = self._param_info.get(id(p))
                    if info is None:
                        continue
                    pname = self._param_node(p, info)
                    self._slot(node, f"parameters.{local}", p, as_input=False, copy=True)
                    self.session.graph.add_edge(pname, name, "output.0", f"parameters.{local}")
                if _grad_recording():
                    new_args, new_kwargs, changed = self._hooked_inputs(args, kwargs, bwd, parent, name, "module")
                    if changed:
                        return new_args, new_kwargs
            finally:
                self.busy = False
            return None

        return pre

    def _post_hook(self, want: bool) -> Callable:
        def post(cell, args, kwargs, output):
            if self._scope and not self.busy and not self._depth:
                self._scope.pop()
            if not want or not self.capturing or self.busy or self._depth:
                return None
            path, cls, leaf = self._cell_info[id(cell)]
            if not path:
                return None
            calls = self._cell_calls.get(id(cell))
            if not calls:
                return None
            name = calls[-1]
            node = self.session.graph.nodes[name]
            self.busy = True
            try:
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
                new = output
                if _grad_recording():
                    new = self._hooked_outputs(node.pair, node.scope, name, "module", output)
                if self.tap is not None:
                    self._calls[name] = (args, kwargs, output)
            finally:
                self.busy = False
            self._emit_node(node)
            return None if new is output else new

        return post

    # -- parameter gradients ----------------------------------------------------------------------
    def _grad_hook(self, qual, path, cls, local) -> Callable:
        base = f"Cell.{path}.{cls}.parameters_grad" if path else f"Cell.{cls}.parameters_grad"
        scope = path.rpartition(".")[0].replace(".", "/") if path else ""

        def hook(grad):
            if not self.capturing or self.closed or not _is_tensor(grad):
                return None
            with self._lock:
                self.busy = True
                try:
                    n = self._pgrad_calls.get((base, local), 0)
                    self._pgrad_calls[(base, local)] = n + 1
                    name = f"{base}.{n}"
                    self._pgrad_last[qual] = (name, local)
                    if name in self._bwd_started:
                        node = self.session.graph.nodes[name]
                    else:
                        self._bwd_started.add(name)
                        node = self.session.node(name, kind="parameter", op_type="parameters_grad", scope=scope,
                                                 section="backward")
                    seen = self._slot(node, local, grad, as_input=False)
                    seen.producer = (name, local)
                    self.session.graph.add_edge(f"Parameter.{qual}", name, "output.0", local)
                finally:
                    self.busy = False
            self._emit_node(node)
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

    def optimizer_pre(self, opt: Any) -> None:
        if not self.capturing:
            return
        self.sync()  # parameters and gradients change in place from here on
        self.section = "optimizer"
        self._threads.add(threading.get_ident())

    def optimizer_post(self, opt: Any) -> None:
        if self.capturing:
            params = [(info[1], p) for p in opt.parameters
                      if (info := self._param_info.get(id(p))) is not None and info[0]() is p]
            self.busy = True
            try:
                name = f"Optimizer.{type(opt).__name__}.step.{self._opt_calls}"
                self._opt_calls += 1
                node = self.session.node(name, kind="op", op_type="step", scope="optimizer", section="optimizer")
                for qual, p in params:
                    slot = f"parameters.{qual}"
                    # updated values: a new version of the parameter, retained as a copy
                    seen = self._seen.pop(id(p), None)
                    self._slot(node, slot, p, as_input=False, copy=True)
                    if seen is not None:
                        self._seen[id(p)] = seen
                    pnode = f"Parameter.{qual}"
                    if pnode in self.session.graph.nodes:
                        self.session.graph.add_edge(pnode, name, "output.0", slot)
                    last = self._pgrad_last.get(qual)
                    if last is not None:
                        self.session.graph.add_edge(last[0], name, last[1], slot)
            finally:
                self.busy = False
            self._emit_node(node)
        self.section = "forward"
        if self.auto_step and self.capturing:
            self.end_step()
