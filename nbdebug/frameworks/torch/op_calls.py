"""Which msProbe API a torch call is: the names recorded at L1 (``Functional.linear``, ``Tensor.__radd__``),
the calls never recorded (metadata reads, ``_PASS``), the tensors an in-place call writes, and a reflected
operator (``0 + t`` runs ``t.__radd__``) told from the caller's bytecode.

>>> import torch
>>> _api_prefix(torch.nn.functional.relu), _api_prefix(torch.Tensor.add_)
(('Functional', 'relu'), ('Tensor', 'add_'))
>>> mean, var = torch.zeros(3), torch.ones(3)
>>> [t is mean for t in mutated_args(("Functional", "batch_norm"), (torch.ones(2, 3), mean, var), {})]
[True, False]
"""

from __future__ import annotations

import dis
import types
from typing import Any

import torch
import torch.nn.functional as _F

from . import api_names as _names

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


def index_tensors(index: Any) -> list[torch.Tensor]:
    """The tensors of an indexing expression (``x[t]``, ``x[torch.arange(n), idx]``, ``x[[t, u]]``): they pick
    the values of the result, so its consumers read them too."""
    if isinstance(index, torch.Tensor):
        return [index]
    if isinstance(index, (tuple, list)):
        return [t for t in index if isinstance(t, torch.Tensor)]
    return []


#: Tensor properties that return a view or alias of the tensor (``w.T``, ``p.data``)
_VIEW_PROPERTIES = frozenset({"T", "mT", "H", "mH", "data", "real", "imag"})
_PASS = ("", "")  # a torch call msProbe does not record: runs unrecorded, its result keeps its input's producer


def _api_prefix(func: Any) -> tuple[str, str] | None:
    """(msProbe prefix, api name) for a function seen by the mode; ``_PASS`` for a torch call msProbe does
    not record (not in its support list); None when not an op at all (metadata, leaves torch).

    ``("Tensor?", name)``: a Tensor method msProbe records only when reached through an operator
    (``x // y`` reaches the mode as ``floor_divide``; msProbe hooks ``__floordiv__``)."""
    name = getattr(func, "__name__", None)
    if name == "__get__":  # a property: ``w.T`` is a view of ``w`` (its result keeps ``w``'s producer)
        return _PASS if getattr(getattr(func, "__self__", None), "__name__", None) in _VIEW_PROPERTIES else None
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


_SYMBOLS = {"+": "add", "-": "sub", "*": "mul", "/": "truediv", "//": "floordiv", "%": "mod", "**": "pow",
            "@": "matmul", "&": "and", "|": "or", "^": "xor", "<<": "lshift", ">>": "rshift",
            "<": "lt", "<=": "le", "==": "eq", "!=": "ne", ">": "gt", ">=": "ge"}
_UNARY = {"UNARY_NEGATIVE": "neg", "UNARY_INVERT": "invert", "UNARY_POSITIVE": "pos"}
#: (id(code), offset) -> (code, operator or None). Keyed by the code object's id, not the object: hashing a
#: code object hashes its constants (nested functions' code too) on every lookup, the per-op hot path;
#: the entry holds the code object, so its id is not reused while the entry exists.
_OPERATOR_SITES: dict[tuple[int, int], tuple[Any, str | None]] = {}


def _operator_at(code: Any, lasti: int) -> str | None:
    """The Python operator a bytecode instruction applies (``+`` -> ``add``, ``+=`` -> ``iadd``), if any.

    ``x + y`` reaches the mode as ``Tensor.add``; msProbe names it ``Tensor.__add__``. Cached per site."""
    key = (id(code), lasti)
    hit = _OPERATOR_SITES.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
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
    _OPERATOR_SITES[key] = (code, name)
    return name


_REFLECTED_SITES: dict[tuple[int, int], tuple[Any, bool]] = {}  # as _OPERATOR_SITES
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
    code = frame.f_code
    key = (id(code), frame.f_lasti)
    hit = _REFLECTED_SITES.get(key)
    if hit is not None and hit[0] is code:
        return hit[1]
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
    _REFLECTED_SITES[key] = (code, out)
    return out
