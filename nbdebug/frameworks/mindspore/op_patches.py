"""MindSpore's op and optimizer calls patched while a PyNative capture is attached (restored after the last
one detaches): which ``ops`` / ``mint`` functions, ``Tensor`` methods and ``Primitive`` classes are recorded
(and which never are), the wrappers that hand a call to the active adapter's ``run_op``, and the optimizer
call that tells the adapter where its step begins and ends.

>>> _OPS.active is None   # no PyNative capture attached
True
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mindspore import mint, nn, ops
from mindspore.common.parameter import Parameter
from mindspore.mint.nn import functional as mint_functional

try:  # mindspore.common.api is deprecated since 2.9 and says so on stderr when imported
    from mindspore.graph.api import _JitExecutor, _pynative_executor
except ImportError:  # pragma: no cover - older MindSpore
    from mindspore.common.api import _JitExecutor, _pynative_executor

from .ops import Tensor, TensorBase

if TYPE_CHECKING:  # the adapter imports this module
    from .pynative import PyNativeAdapter

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
    "custom_vjp", "stop_gradient", "depend", "print_", "tensor_dump", "TensorDump", "dtype", "rank",
    "size", "is_tensor", "is_nonzero", "is_floating_point", "is_complex", "numel", "typeof", "isconstant",
    "tensor_shape", "dyn_shape", "hook", "HookBackward", "get_grad", "clear_compile_cache", "no_grad",
    "enable_grad", "set_grad_enabled", "is_grad_enabled", "is_autocast_enabled", "constexpr", "primitive",
    "prim_attr_register", "kernel", "ms_class", "ms_function", "custom_info_register", "op_info_register",
    "get_vm_impl_fn", "DataType", "deepcopy", "make_sparse_tensor", "finfo", "iinfo", "set_printoptions",
    "seed", "manual_seed", "initial_seed", "get_rng_state", "set_rng_state",
})
_INPLACE_FUNCS = frozenset({"assign", "assign_add", "assign_sub"})
# Primitives that answer questions about a tensor rather than compute one.
_SKIP_PRIMITIVES = frozenset({"DType", "Rank", "Size", "TensorShape", "DynamicShape", "IsInstance",
                              "Depend", "UpdateState", "Load", "HookBackward", "CellBackwardHook"})
_NAMESPACES = (("Functional", ops), ("Mint", mint), ("MintFunctional", mint_functional))


def _is_tensor(obj: Any) -> bool:
    return isinstance(obj, TensorBase)


def _grad_recording() -> bool:
    """True inside a forward that MindSpore records for a gradient (``value_and_grad``, ``grad``...)."""
    return bool(_pynative_executor.requires_grad())


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
        # a Parameter's class is (Parameter, Tensor, TensorPy): names Parameter resolves past Tensor (object's
        # __eq__, TensorPy's type_as) are Tensor's for a real Parameter; wrapped on Parameter they would shadow it
        tensor_attr = {name: inspect.getattr_static(Tensor, name, None) for name in dir(Tensor)}
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
                if owner is Parameter and orig is not tensor_attr[name]:
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
                    a.optimizer_pre(opt, *args)
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


JIT_HOOKS_REFUSED = (
    "nbdebug: this mindspore.jit function runs Cells that a PyNative-mode Debugger has hooked, and MindSpore "
    "compiles Cell hooks into the graph, which it cannot do with nbdebug's. To see inside the compiled step, "
    "create the Debugger in GRAPH mode (mindspore.set_context(mode=mindspore.GRAPH_MODE) before the first "
    "compile of the process: it reads the kernel dump of every graph run, @jit steps included); or call the "
    "step without @jit while debugging in PyNative mode.")


class _JitCompilePatch:
    """``_JitExecutor.compile`` while PyNative Debuggers are attached: MindSpore compiles the Cells' forward
    hooks into a ``mindspore.jit`` graph, and nbdebug's cannot be compiled (``Unsupported statement 'Try'``
    pointing into ``Cell._forward_pre_hook``): that failure gets :data:`JIT_HOOKS_REFUSED` (refcounted)."""

    def __init__(self) -> None:
        self.adapters: list[PyNativeAdapter] = []
        self.orig: Any = None

    def install(self, adapter: PyNativeAdapter) -> None:
        self.adapters.append(adapter)
        if len(self.adapters) == 1:
            self.orig = orig = _JitExecutor.__dict__["compile"]

            @functools.wraps(orig)
            def compile(executor, *args, **kwargs):  # noqa: A001 - the method's own name
                try:
                    return orig(executor, *args, **kwargs)
                except Exception as err:
                    if "_forward_pre_hook" in str(err) or "_forward_hook" in str(err):
                        raise RuntimeError(JIT_HOOKS_REFUSED) from err
                    raise

            _JitExecutor.compile = compile

    def uninstall(self, adapter: PyNativeAdapter) -> None:
        if adapter in self.adapters:
            self.adapters.remove(adapter)
            if not self.adapters:
                _JitExecutor.compile = self.orig


_JIT = _JitCompilePatch()
