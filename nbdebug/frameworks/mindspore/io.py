"""MindSpore side of msProbe-format dumps: statistics, value descriptions and ``.npy`` files as msProbe writes them.

:class:`MindSporeIO` plugs a dump writer into the PyNative adapter
(:class:`~nbdebug.frameworks.mindspore.pynative.PyNativeAdapter`):

* statistics as msProbe computes them for MindSpore: ``mint.max/min/mean/norm`` after a cast to float32
  for integer and float64 tensors (so all four are set), numpy any/all-style ``Max``/``Min`` for bool;
* tensors are ``{"type": "mindspore.Tensor", "dtype": "Float32", "shape": [...], "Max" ... "Norm"}`` —
  no ``requires_grad`` key, as msProbe writes for MindSpore;
* tensor files are ``.npy`` (bfloat16 saved as float32), written atomically;
* ``dtype`` arguments are ``{"type": "mindspore.dtype", "value": "Float32"}``.

>>> import mindspore as ms
>>> io = MindSporeIO(None)
>>> [round(v, 4) for v in io.stats_values(io.snapshot(ms.Tensor([1.0, -3.0]), data=False, crc=False))]
[1.0, -3.0, -1.0, 3.1623]
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import mint, ops

from ..core.snapshot import Snap, untap
from ..encode import describe_plain

try:
    from mindspore._c_expression.typing import Number as _MSNumber
except ImportError:  # pragma: no cover
    _MSNumber = type(ms.float32)

_TENSOR_TYPES: tuple[type, ...] = (ms.Tensor,)
try:
    from mindspore._c_expression import TensorPy as _TensorPy

    _TENSOR_TYPES = (ms.Tensor, _TensorPy)
except ImportError:  # pragma: no cover
    pass
_NP_SCALARS = (np.integer, np.floating, np.bool_, np.complexfloating, np.str_, np.bytes_)
_MS_DTYPE = type(ms.float32)
_LEAF_TYPES = (bool, int, float, str, slice, type(Ellipsis), _MSNumber, _MS_DTYPE, *_NP_SCALARS)
_FLOATS = (ms.float16, ms.float32, ms.float64, ms.bfloat16)
_DIFFERENTIABLE = (*_FLOATS, ms.complex64, ms.complex128)  # what a backward hook gives a gradient


def _is_tensor(x: Any) -> bool:
    return isinstance(x, _TENSOR_TYPES)


def _host(t: Any) -> np.ndarray:
    if t.dtype == ms.bfloat16:
        t = t.to(ms.float32) if hasattr(t, "to") else ops.cast(t, ms.float32)
    return t.asnumpy()


def ms_tensor_stats(t: Any, precision: str = "low") -> tuple[Any, Any, Any, Any]:
    """msProbe's (Max, Min, Mean, Norm) for a MindSpore tensor (0-d tensors or Python values)."""
    if int(t.size) == 0:
        return None, None, None, None
    if t.dtype == ms.bool_:
        arr = t.asnumpy()
        return np.max(arr).item(), np.min(arr).item(), None, None
    if len(t.shape) == 0:
        v = t.copy()
        return v, v, v, v
    if t.dtype in (ms.complex64, ms.complex128):
        a = np.abs(t.asnumpy())
        return np.max(a).item(), np.min(a).item(), np.mean(a).item(), np.linalg.norm(a).item()
    x = t
    if precision == "high" or t.dtype not in _FLOATS or t.dtype == ms.float64:
        x = ops.cast(t, ms.float32)
    return mint.max(x), mint.min(x), mint.mean(x), _norm(x)


def _norm(x: Any) -> Any:
    """``mint.norm`` as msProbe uses it; ``ops.norm`` on CPU, where MindSpore 2.10 has no kernel for it
    (the failure would only surface later, asynchronously)."""
    if hasattr(mint, "norm") and str(ms.get_context("device_target")).upper() != "CPU":
        return mint.norm(x)
    return ops.norm(x)


def _item(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    return v.item()


class MindSporeIO:
    """The MindSpore half of a dump writer (see the module docstring)."""

    framework = "mindspore"
    ext = ".npy"
    module_prefix = "Cell"
    tensor_type = "mindspore.Tensor"
    has_requires_grad = False
    leaf_types = _LEAF_TYPES
    snap_class = Snap

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        self.precision = "low"
        self._snap: Callable[[Any], Any] | None = None
        self._pre: dict[int, tuple[Any, Any]] = {}
        self.classes: dict[str, str] = {}
        model = adapter.model_ref() if adapter is not None else None
        if model is not None:
            for path, cell in model.cells_and_names():
                self.classes.setdefault(path.replace(".", "/"), type(cell).__name__)

    # -- wiring -----------------------------------------------------------------------------------
    def install(self, tap: Callable[..., None], snap: Callable[[Any], Any]) -> None:
        a = self.adapter
        self._snap = snap
        if a is None:
            return
        if a.tap is not None:
            raise RuntimeError("this model's debugger already writes a dump (its adapter has a tap)")
        a.tap = tap
        if not hasattr(type(a), "run_op"):  # GRAPH mode capture: no per-op calls to wrap
            return
        original = type(a).run_op.__get__(a)

        def run_op(info, func, args, kwargs):  # inputs of in-place ops are captured before the op runs
            if len(info) > 3 and info[3] and args and _is_tensor(args[0]):
                self._pre[id(args[0])] = (args[0], snap(args[0]))
            try:
                return original(info, func, args, kwargs)
            finally:
                self._pre.clear()

        a.run_op = run_op

    def uninstall(self) -> None:
        a = self.adapter
        if a is None:
            return
        untap(a, self._pre)

    def input_snap(self, node_name: str, t: Any) -> Any | None:
        hit = self._pre.get(id(t))
        return hit[1] if hit is not None and hit[0] is t else None

    def node_done(self, node_name: str) -> None:
        return None

    @staticmethod
    def module_path(name: str) -> str:
        body = name.split(".", 1)[1]
        return body.rsplit(".", 3)[0].replace(".", "/")

    def module_class(self, path: str) -> str | None:
        return self.classes.get(path)

    # -- training thread --------------------------------------------------------------------------
    @staticmethod
    def is_tensor(x: Any) -> bool:
        return _is_tensor(x)

    def snapshot(self, t: Any, *, data: bool, crc: bool) -> Snap:
        a = self.adapter
        busy = a.busy if a is not None else False
        if a is not None:
            a.busy = True  # our own statistics ops are not nodes
        try:
            stats = ms_tensor_stats(t, self.precision)
            copy = _host(t).copy() if (data or crc) and int(t.size) else None
        finally:
            if a is not None:
                a.busy = busy
        return Snap(str(t.dtype), [int(s) for s in t.shape], None, stats, copy if data else None,
                      copy if crc else None)

    def describe(self, x: Any, key: Any) -> Any:
        if not isinstance(x, _LEAF_TYPES):
            return None
        if key == "dtype" or isinstance(x, (_MSNumber, _MS_DTYPE)):
            return {"type": "mindspore.dtype", "value": str(x)}
        plain = describe_plain(x)
        if plain is not None:
            return plain
        if isinstance(x, _NP_SCALARS):
            return {"type": type(x).__name__, "value": x.item()}
        return None

    @staticmethod
    def as_called(name: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        return args, kwargs  # the adapter wraps the functions themselves: arguments are as passed

    @staticmethod
    def grad_arity(out: Any) -> None:
        return None

    @staticmethod
    def module_grad_arity(args: tuple, out: Any = None) -> tuple[int, int] | None:
        """(0, gradients a Cell's backward produces) as msProbe writes them: one per positional argument
        when any is a differentiable tensor (its hook wraps all of them; a data input's is ``None``, so
        ``Cell.fc1.Dense.backward.0`` ``output`` is ``[None]`` when ``fc1`` reads the batch); ``out``: unused."""
        if any(_is_tensor(a) and a.dtype in _DIFFERENTIABLE for a in args):
            return 0, len(args)
        return None

    @staticmethod
    def register_grad_hook(t: Any, fn: Callable[[Any], None]) -> Any:
        if not _is_tensor(t) or not hasattr(t, "register_hook"):
            return None

        def hook(grad):
            fn(grad)
            return None

        try:
            return t.register_hook(hook)
        except Exception:  # noqa: BLE001 - tensors outside a differentiated function
            return None

    @staticmethod
    def rank() -> int | None:
        try:
            from mindspore import communication

            if communication.GlobalComm.INITED:
                return int(communication.get_rank())
        except Exception:  # noqa: BLE001 - no communication support in this build
            pass
        return None

    def begin(self) -> None:
        a = self.adapter
        if a is not None and hasattr(a, "_threads") and a.level.ops:
            a._threads.add(threading.get_ident())

    @staticmethod
    def on_model_call(model: Any, fn: Callable[[], None]) -> Any:
        return model.register_forward_pre_hook(lambda cell, inputs: fn())

    # -- writer thread ----------------------------------------------------------------------------
    @staticmethod
    def stats_values(snap: Snap) -> list[Any]:
        return [_item(v) for v in snap.stats]

    @staticmethod
    def save(snap: Snap, path: str) -> None:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.save(f, snap.data, allow_pickle=False)
        os.replace(tmp, path)

    @staticmethod
    def save_ndarray(arr: np.ndarray, path: str) -> str:
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, path)
        return os.path.basename(path)

    @staticmethod
    def crc32(snap: Snap) -> str | None:
        if snap.crc_src is None:
            return None
        return f"{zlib.crc32(np.ascontiguousarray(snap.crc_src).tobytes()):08x}"


def custom_api_wrapper(get_adapter: Callable[[], Any], func: Callable, prefix: str, api: str) -> Callable:
    """``func`` recorded as one API node ``{prefix}.{api}.{n}.forward`` while the adapter captures (L1/mix)."""

    def wrapper(*args, **kwargs):
        a = get_adapter()
        if a is None or a.closed or not a.level.ops or not a.wants_op():
            return func(*args, **kwargs)
        return a.run_op((prefix, api, api, False), func, args, kwargs)

    wrapper.__wrapped__ = func  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(func, "__name__", api)
    return wrapper


def stand_in_model() -> Any:
    """An empty root Cell for L1 dumps started without a model."""
    return ms.nn.Cell()


def step_callback(debugger: Any) -> Any:
    """msProbe's ``MsprobeStep``: a ``mindspore.train.Callback`` calling ``debugger.start()`` at each step
    begin and ``debugger.stop()``, ``debugger.step()`` at each step end."""
    from mindspore.train.callback import Callback

    class MsprobeStep(Callback):
        def __init__(self, pd: Any) -> None:
            super().__init__()
            self.debugger = pd

        def on_train_step_begin(self, run_context: Any) -> None:
            self.debugger.start()

        def on_train_step_end(self, run_context: Any) -> None:
            self.debugger.stop()
            self.debugger.step()

    return MsprobeStep(debugger)
