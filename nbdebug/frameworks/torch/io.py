"""PyTorch side of msProbe-format dumps: statistics, value descriptions and ``.pt`` files as msProbe writes them.

:class:`TorchIO` plugs a dump writer into a :class:`~nbdebug.frameworks.torch.adapter.TorchAdapter`:

* statistics are computed like msProbe (``torch.max/min/mean/norm`` in the tensor's own dtype, on its
  device, as 0-d tensors; read on the writer thread, so the training thread never waits for a device);
  ``Mean``/``Norm`` are None for int, bool and float64 tensors, ``Max``/``Min`` of bool are any/all;
* non-tensor arguments are described as msProbe does (``{"type": "int", "value": 1}``, ``torch.Size``,
  ``dtype``/``device`` keyword arguments, ``{}`` for other torch objects, ``null`` for None and unknowns);
* tensor files are ``torch.save`` of a detached contiguous CPU copy (``.pt``), written atomically;
* the inputs of in-place ops (``add_``, ``relu(inplace=True)``, ``out=``) and of in-place modules are
  captured *before* the op runs, as msProbe does (the adapter's tap only runs after a node completes).

>>> import torch
>>> io = TorchIO.__new__(TorchIO)
>>> io.describe(3, "input"), io.describe(torch.Size([2, 4]), "0")
({'type': 'int', 'value': 3}, {'type': 'torch.Size', 'value': [2, 4]})
>>> io.describe(torch.float16, "dtype"), io.describe(torch.float16, 1)
({'type': 'torch.dtype', 'value': 'torch.float16'}, {})
>>> [v.item() for v in tensor_stats(torch.tensor([1.0, -3.0]))]
[1.0, -3.0, -1.0, 3.1622776985168457]
"""

from __future__ import annotations

import dis
import inspect
import os
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from ...session.handle import Handles
from ...session.level import Level
from ..core.snapshot import Snap, untap
from ..encode import describe_plain
from .op_calls import mutated_args
from .stats import UNINITIALIZED
from .stats import _functorch_wrapped as _wrapped  # a vmap / torch.func tensor: no storage, no data

_INPLACE_DUNDERS = frozenset({
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__setitem__", "__ifloordiv__", "__imod__", "__ipow__",
    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__",
})
_UNWRITTEN = UNINITIALIZED.split(" (")[0]  # the reason's constant part
_NP_SCALARS = (np.integer, np.floating, np.bool_, np.complexfloating, np.str_, np.bytes_)
_FP8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
             if hasattr(torch, n))
_NOT_DESCRIBED = (torch.dtype, torch.device, torch.layout, torch.Generator)
# leaves msProbe describes (or writes as {}) instead of walking into: checked before lists/tuples/dicts
_LEAF_TYPES = (bool, int, float, str, slice, type(Ellipsis), torch.Size, torch.memory_format, *_NP_SCALARS,
               *_NOT_DESCRIBED)


def tensor_stats(t: torch.Tensor, precision: str = "low") -> tuple[Any, Any, Any, Any]:
    """msProbe's (Max, Min, Mean, Norm) of ``t`` as 0-d tensors on ``t``'s device (None where not computed:
    empty, meta, fp8, storage-less (functorch's inside ``vmap`` too) and sparse tensors — a sparse gradient of
    ``nn.Embedding(sparse=True)`` — as the session's statistics, which call those layouts unsupported)."""
    with torch._C.DisableTorchFunction():
        x = t.detach()
        if x.layout is not torch.strided or x.numel() == 0 or x.is_meta or x.dtype in _FP8 or _wrapped(x) or \
                x.untyped_storage().data_ptr() == 0:
            return None, None, None, None
        if x.is_complex():
            a = x.abs()
            return torch.max(a), torch.min(a), torch.mean(a), None
        if x.dtype == torch.bool:
            return torch.any(x), torch.all(x), None, None
        if x.dim() == 0:
            v = x.clone()
            return v, v, v, v
        if x.is_floating_point() or x.dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
            mx, mn = torch.aminmax(x)[::-1]
        else:
            mx, mn = torch.max(x), torch.min(x)
        if precision != "high" and x.dtype != torch.float64 and x.is_floating_point():
            return mx, mn, torch.mean(x), torch.norm(x)
        return mx, mn, None, None


_CALL_SITES: dict[tuple[Any, int], tuple[int, tuple[str, ...]] | None] = {}
_SIGNATURES: dict[Any, list[str] | None] = {}


def call_site(code: Any, lasti: int) -> tuple[int, tuple[str, ...]] | None:
    """(positional count, keyword names) of the call instruction at ``lasti`` in ``code``, or None.

    Reads the bytecode (CPython 3.10-3.13): ``KW_NAMES`` + ``CALL`` (3.11, 3.12), ``CALL_KW`` (3.13),
    ``CALL_FUNCTION_KW`` (3.10). Calls with ``*args`` / ``**kwargs`` unpacking give None."""
    key = (code, lasti)
    if key in _CALL_SITES:
        return _CALL_SITES[key]
    result = None
    try:
        ins = [i for i in dis.get_instructions(code) if i.offset <= lasti]
        call = ins[-1] if ins else None
        if call is not None and call.opname in ("CALL", "CALL_FUNCTION", "CALL_METHOD", "CALL_KW",
                                                "CALL_FUNCTION_KW"):
            names: tuple[str, ...] = ()
            if call.opname in ("CALL_KW", "CALL_FUNCTION_KW"):
                prev = ins[-2] if len(ins) > 1 else None
                if prev is None or prev.opname != "LOAD_CONST" or not isinstance(prev.argval, tuple):
                    raise LookupError
                names = prev.argval
            else:
                for back in reversed(ins[-4:-1]):
                    if back.opname == "KW_NAMES":
                        names = code.co_consts[back.arg]
                        break
            result = (int(call.arg) - len(names), tuple(names))
    except Exception:
        result = None
    _CALL_SITES[key] = result
    return result


def _params(fn: Any) -> list[str] | None:
    if fn not in _SIGNATURES:
        try:
            _SIGNATURES[fn] = [p.name for p in inspect.signature(fn).parameters.values()
                               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        except (TypeError, ValueError):
            _SIGNATURES[fn] = None
    return _SIGNATURES[fn]


def as_called(fn: Any, args: tuple, kwargs: dict, depth: int = 2) -> tuple[tuple, dict]:
    """The arguments of a Python-level torch function as its caller wrote them.

    ``torch.nn.functional`` functions forward every parameter to ``__torch_function__`` (``mse_loss(x, y)``
    arrives with ``reduction="mean", weight=None ...``); msProbe, which wraps the function itself, sees only
    what the caller passed. Found from the caller's call instruction; unchanged when that is not possible."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return args, kwargs
    f = sys._getframe(depth)
    while f is not None and f.f_code is not code:
        f = f.f_back
    caller = f.f_back if f is not None else None
    site = call_site(caller.f_code, caller.f_lasti) if caller is not None else None
    params = _params(fn)
    if site is None or params is None:
        return args, kwargs
    npos, names = site
    merged = dict(zip(params, args, strict=False))
    merged.update(kwargs)
    if npos < len(args) or any(k not in merged for k in names) or len(params) < npos:
        return args, kwargs
    new_args = tuple(merged[p] for p in params[:npos] if p in merged)
    if len(new_args) != npos:
        return args, kwargs
    return new_args, {k: merged[k] for k in names}


def api_parameters(node: str) -> tuple[str, ...] | None:
    """The parameter names of the Python-level torch function a forward API node called, in order (None for
    other nodes): the ones whose arguments :func:`as_called` names as the caller passed them in a dump, where
    the live capture names them as the function handed them to ``__torch_function__``."""
    prefix, _, rest = node.partition(".")
    owner = {"Functional": torch.nn.functional, "Torch": torch}.get(prefix)
    if owner is None or not node.endswith(".forward"):
        return None
    fn = getattr(owner, rest.rsplit(".", 2)[0], None)
    params = _params(fn) if fn is not None and hasattr(fn, "__code__") else None
    return tuple(params) if params else None


def _item(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return v.item()
    return v


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A detached contiguous copy on the tensor's device (no host sync)."""
    with torch._C.DisableTorchFunction():
        x = t.detach()
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        out.copy_(x)
        return out


def _flat_tensors(obj: Any) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for o in obj:
            yield from _flat_tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _flat_tensors(o)


class TorchIO:
    """The PyTorch half of a dump writer (see the module docstring)."""

    framework = "pytorch"
    ext = ".pt"
    module_prefix = "Module"
    tensor_type = "torch.Tensor"
    has_requires_grad = True

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.precision = "low"
        self._snap: Callable[[torch.Tensor], Any] | None = None
        self._pre: dict[int, tuple[torch.Tensor, Any]] = {}
        self._mod_pre: dict[str, list[dict[int, tuple[torch.Tensor, Any]]]] = {}
        self._handles = Handles()
        self._tls = threading.local()
        self.classes: dict[str, str] = {}
        model = adapter.model_ref() if adapter is not None else None
        # modules whose inputs are measured before the call: a module may write into its input with any op
        # (``x.mul_``, ``x[:, 0] = 0``, ``inplace=True``) and the entry describes the input it was given
        self._pre_modules: list[tuple[str, torch.nn.Module]] = []
        if model is not None:
            seen: set[int] = set()
            level = Level(getattr(adapter, "level", "L0"))
            for path, mod in model.named_modules(remove_duplicate=False):
                key = path.replace(".", "/")
                self.classes.setdefault(key, type(mod).__name__)
                if path and id(mod) not in seen and (level.modules or not level.ops):  # all but L1
                    self._pre_modules.append((key, mod))  # a module shared by two paths: its first (its name)
                seen.add(id(mod))

    # -- wiring -----------------------------------------------------------------------------------
    def install(self, tap: Callable[..., None], snap: Callable[[torch.Tensor], Any]) -> None:
        """Become the adapter's tap; capture in-place inputs before the op (``snap(t)`` makes the copy)."""
        a = self.adapter
        self._snap = snap
        if a is None:  # single-point saving only (level "debug"): nothing to tap
            return
        if a.tap is not None:
            raise RuntimeError("this model's debugger already writes a dump (its adapter has a tap)")
        a.tap = tap
        original = type(a).run_op.__get__(a)

        def run_op(info, func, args, kwargs):  # same signature as TorchAdapter.run_op
            targets = self._inplace_targets(args, kwargs) if self._inplace(info[1], kwargs) else []
            for t in targets + mutated_args(info, args, kwargs):
                self._pre[id(t)] = (t, snap(t))
            try:
                return original(info, func, args, kwargs)
            finally:
                self._pre.clear()

        a.run_op = run_op
        for path, mod in self._pre_modules:
            self._handles.add(mod.register_forward_pre_hook(torch.compiler.disable(self._module_pre(path)),
                                                                       with_kwargs=True))

    def uninstall(self) -> None:
        a = self.adapter
        if a is None:
            return
        untap(a, self._pre)
        self._handles.remove_all()
        self._mod_pre.clear()

    @staticmethod
    def _inplace(api: str, kwargs: dict) -> bool:
        return ((api.endswith("_") and not api.endswith("__")) or api in _INPLACE_DUNDERS or "out" in kwargs
                or kwargs.get("inplace") is True)

    @staticmethod
    def _inplace_targets(args: tuple, kwargs: dict) -> list[torch.Tensor]:
        out = [t for t in _flat_tensors(kwargs.get("out"))] if "out" in kwargs else []
        if args and isinstance(args[0], torch.Tensor) and "out" not in kwargs:
            out.append(args[0])
        elif args and isinstance(args[0], (list, tuple)) and "out" not in kwargs:
            # a fused optimizer kernel (``_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, …)``) writes
            # into the tensors of its list arguments, with no version bump: all of them, before it runs
            out += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
        return out

    def _module_pre(self, path: str) -> Callable:
        def pre(mod, args, kwargs):
            a = self.adapter
            if not a.capturing or a.busy or self._snap is None:
                return None
            snaps = {id(t): (t, self._snap(t)) for t in _flat_tensors((args, kwargs))}
            self._mod_pre.setdefault(path, []).append(snaps)
            return None

        return pre

    def input_snap(self, node_name: str, t: torch.Tensor) -> Any | None:
        """The snapshot of input ``t`` taken before an in-place op / module changed it, if any."""
        hit = self._pre.get(id(t))
        if hit is not None and hit[0] is t:
            return hit[1]
        if self._mod_pre and node_name.startswith("Module."):
            path = self.module_path(node_name)
            stack = self._mod_pre.get(path)
            if stack:
                hit = stack[-1].get(id(t))
                if hit is not None and hit[0] is t:
                    return hit[1]
        return None

    def node_done(self, node_name: str) -> None:
        if self._mod_pre and node_name.startswith("Module.") and ".forward." in node_name:
            stack = self._mod_pre.get(self.module_path(node_name))
            if stack:
                stack.pop()

    @staticmethod
    def module_path(name: str) -> str:
        """``Module.block.lin.Linear.forward.0`` -> ``block/lin`` (the adapter's scope form)."""
        body = name.split(".", 1)[1]
        return body.rsplit(".", 3)[0].replace(".", "/")

    # -- training thread --------------------------------------------------------------------------
    @staticmethod
    def is_tensor(x: Any) -> bool:
        return isinstance(x, torch.Tensor)

    def snapshot(self, t: torch.Tensor, *, data: bool, crc: bool) -> Snap:
        """Statistics now (device-side), plus a private copy when the file or the CRC needs the value (none of
        either for memory nobody wrote yet: the capture's record of ``t`` says so, as its statistics do)."""
        if self._unwritten(t):
            return Snap(str(t.dtype), [int(s) for s in t.shape], bool(t.requires_grad), (None,) * 4, None, None)
        with torch._C.DisableTorchFunction():
            copy = _copy(t) if (data or crc) and t.numel() and not t.is_meta and t.layout is torch.strided \
                and not _wrapped(t) else None
            return Snap(str(t.dtype), [int(s) for s in t.shape], bool(t.requires_grad),
                             tensor_stats(t, self.precision), copy if data else None, copy if crc else None)

    def _unwritten(self, t: torch.Tensor) -> bool:
        seen = self.adapter._seen.get(id(t)) if self.adapter is not None else None
        return seen is not None and seen.why is not None and seen.why.startswith(_UNWRITTEN) and \
            seen.ref() is t and seen.version == t._version

    leaf_types = _LEAF_TYPES
    snap_class = Snap

    def describe(self, x: Any, key: Any) -> Any:
        """msProbe's JSON for a non-tensor leaf ``x``; ``key`` is its keyword / dict key or list index.

        Objects msProbe does not know become None (JSON null)."""
        if not isinstance(x, _LEAF_TYPES):
            return None
        if key in ("dtype", "output_dtype"):
            return {"type": "torch.dtype", "value": str(x)}
        if key == "device":
            if isinstance(x, (int, str)):
                return {"type": "torch.device", "value": x}
            if isinstance(x, torch.device):
                return {"type": "torch.device", "value": f"{x.type}:{x.index}"}
            return {"type": "torch.device"}
        plain = describe_plain(x)
        if plain is not None:
            return plain
        if isinstance(x, torch.Size):
            return {"type": "torch.Size", "value": [int(v) for v in x]}
        if isinstance(x, torch.memory_format):
            return {"type": "torch.memory_format", "format": str(x).replace("torch.", "")}
        if isinstance(x, _NP_SCALARS):
            return {"type": type(x).__name__, "value": x.item()}
        if isinstance(x, _NOT_DESCRIBED):
            return {}
        return None

    @staticmethod
    def as_called(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """``args``/``kwargs`` of API node ``name`` as the user's code passed them (see :func:`as_called`)."""
        prefix, _, rest = name.partition(".")
        owner = {"Functional": torch.nn.functional, "Torch": torch}.get(prefix)
        if owner is None or not kwargs:
            return args, kwargs
        fn = getattr(owner, rest.rsplit(".", 2)[0], None)
        if fn is None or not hasattr(fn, "__code__"):
            return args, kwargs
        return as_called(fn, args, kwargs, depth=3)

    @staticmethod
    def grad_arity(out: Any) -> tuple[int, int] | None:
        """(grads flowing into the backward node, grads it produces) for the op whose output is ``out``."""
        for t in _flat_tensors(out):
            gf = t.grad_fn
            if gf is not None:
                n_out = len(getattr(gf, "_input_metadata", ()) or ()) or 1
                return n_out, len(gf.next_functions)
        return None

    @staticmethod
    def module_grad_arity(args: tuple, out: Any = None) -> tuple[int, int] | None:
        """(gradients coming into a module's backward, 0): one per output tensor that needs a gradient, as a
        full backward hook numbers them (msProbe writes ``None`` for one that gets none: T5's
        ``position_bias`` returned by its last block); the gradients it produces are given as they are."""
        n = sum(1 for t in _flat_tensors(out) if t.requires_grad and t.grad_fn is not None)
        return (n, 0) if n else None

    @staticmethod
    def register_grad_hook(t: torch.Tensor, fn: Callable[[Any], None]) -> Any:
        if not (isinstance(t, torch.Tensor) and t.requires_grad):
            return None

        def hook(grad):
            fn(grad)
            return None

        return t.register_hook(hook)

    @staticmethod
    def rank() -> int | None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
        return None

    def module_class(self, path: str) -> str | None:
        return self.classes.get(path)

    # -- writer thread ----------------------------------------------------------------------------
    @staticmethod
    def stats_values(snap: Snap) -> list[Any]:
        return [_item(v) for v in snap.stats]

    @staticmethod
    def save(snap: Snap, path: str) -> None:
        """``torch.save`` of the CPU copy, via a temporary file renamed into place."""
        t = snap.data
        if t.device.type != "cpu":
            t = t.cpu()
        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(t, tmp)
        os.replace(tmp, path)

    @staticmethod
    def save_ndarray(arr: np.ndarray, path: str) -> str:
        """msProbe saves numpy arrays as ``.pt`` (string arrays as ``.npy``); returns the file name used."""
        if arr.dtype.kind in ("U", "S"):
            path = path[: -len(".pt")] + ".npy" if path.endswith(".pt") else path
            tmp = f"{path}.tmp{os.getpid()}.npy"
            np.save(tmp, arr, allow_pickle=False)
        else:
            tmp = f"{path}.tmp{os.getpid()}"
            torch.save(torch.tensor(arr), tmp)
        os.replace(tmp, path)
        return os.path.basename(path)

    @staticmethod
    def crc32(snap: Snap) -> str | None:
        """CRC32 (8 hex digits) of the raw bytes, msProbe's ``md5`` field."""
        t = snap.crc_src
        if t is None:
            return None
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16 or t.dtype in _FP8:
            raw = t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        return f"{zlib.crc32(raw):08x}"

    @staticmethod
    def on_model_call(model: Any, fn: Callable[[], None]) -> Any:
        """Call ``fn()`` before every forward call of ``model``; returns a handle with ``remove()``."""
        return model.register_forward_pre_hook(lambda mod, args: fn())

    def begin(self) -> None:
        """Start capturing ops on this thread now (msProbe's ``start()`` captures APIs from that point)."""
        push = getattr(self.adapter, "_push_mode", None)
        if push is not None and self.adapter.level.ops:
            push()


def custom_api_wrapper(get_adapter: Callable[[], Any], func: Callable, prefix: str, api: str) -> Callable:
    """``func`` recorded as one API node ``{prefix}.{api}.{n}.forward`` (+ backward) while the adapter
    returned by ``get_adapter()`` captures at L1/mix; the torch ops inside are not recorded separately."""

    def inner(*args, **kwargs):
        with torch._C.DisableTorchFunction():
            return func(*args, **kwargs)

    def wrapper(*args, **kwargs):
        a = get_adapter()
        if a is None or a.closed or not a.capturing or a.busy or not a.level.ops:
            return func(*args, **kwargs)
        return a.run_op((prefix, api), inner, args, kwargs)

    wrapper.__wrapped__ = func  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(func, "__name__", api)
    return wrapper


def stand_in_model() -> torch.nn.Module:
    """An empty root module for L1 dumps started without a model (``PrecisionDebugger.start()``)."""
    return torch.nn.Module()
