"""Tensor statistics for PyTorch without a host sync per tensor.

Each captured tensor gets one raw row ``[max, min, sum, abs_sum, sq_sum, zeros, nans, +infs, -infs]``.
On CPU, dense tensors of the common dtypes go through the single-pass C kernel ``nbdebug.frameworks._fastats``
(reading CPU memory is no device sync). Everything else — CUDA and other devices, rare dtypes —
is reduced with torch ops *on the tensor's device*; the small result vectors stay there and are
moved to the host in one transfer per step (:meth:`StatsBuffer.raw`).

>>> import torch
>>> buf = StatsBuffer()
>>> row, dtype, why = buf.add(torch.tensor([1.0, -2.0, 0.0]))
>>> buf.raw()[row].tolist()
[1.0, -2.0, -1.0, 3.0, 5.0, 1.0, 0.0, 0.0, 0.0]
"""

from __future__ import annotations

from typing import Any
from weakref import ref as _weakref

import numpy as np
import torch

from ...session.session import RAW_WIDTH, RawRows, raw_to_fields
from ..core.native import codes_for
from ..core.native import fastats as _fastats
from ..core.records import Seen

_NAN_ROW = [float("nan")] * 5 + [0.0] * 4


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


_FAST_CODES = codes_for((torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
                         torch.int16, torch.int32, torch.int64, torch.bool), dtype_name)


#: a tensor inside ``torch.vmap`` / ``torch.func`` (a functorch wrapper: CPU, strided, no storage of its own)
_functorch_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)
NO_STORAGE = "unsupported: a tensor inside torch.vmap / torch.func (functorch-wrapped, no storage of its own)"
#: the reason of memory nobody wrote yet (``torch.empty_like``'s result before an op writes it)
UNINITIALIZED = "unsupported: uninitialized memory (made by {}, not written yet)"


#: tensor types that hold their own data (no wrapper subclass): most tensors, told apart by one set lookup
_PLAIN = {torch.Tensor, torch.nn.Parameter}


def _wrapper(t: torch.Tensor) -> bool:
    """A wrapper subclass (a DTensor): no data of its own, its ``data_ptr()`` an offset from address 0."""
    cls = type(t)
    return cls not in _PLAIN and hasattr(cls, "__tensor_flatten__")


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A ``DTensor``'s local shard — the values this rank holds and computes with (FSDP2's sharded parameters,
    gradients and optimizer state; tensor parallelism) —, any other tensor as it is. A DTensor is a wrapper
    with no data of its own (the native kernel read from its ``data_ptr()``, an offset from address 0, and the
    rank died of SIGSEGV), and ops on it may start collectives, which a capture must never do on one rank.

    >>> t = torch.ones(2)
    >>> local_shard(t) is t
    True
    """
    if type(t) in _PLAIN:
        return t
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def unsupported_reason(t: torch.Tensor) -> str | None:
    if _functorch_wrapped(t):
        return NO_STORAGE
    if t.layout != torch.strided:
        return f"unsupported: {str(t.layout).replace('torch.', '')} layout"
    if t.is_complex():
        return f"unsupported: complex dtype {dtype_name(t.dtype)}"
    if t.is_quantized:
        return f"unsupported: quantized dtype {dtype_name(t.dtype)}"
    if t.device.type == "meta":
        return "unsupported: meta tensor (no data)"
    return None


def _device_row(t: torch.Tensor) -> torch.Tensor:
    """Raw row computed with torch ops on ``t``'s device (no sync)."""
    x = t.detach()
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if not x.is_floating_point():
        x = x.to(torch.float64)
    elif x.dtype not in (torch.float32, torch.float64):
        x = x.float()
    mn, mx = torch.aminmax(x)
    acc = torch.float64 if x.device.type != "mps" else torch.float32
    s = x.sum(dtype=acc)
    a = torch.linalg.vector_norm(x, 1, dtype=acc)
    q = torch.linalg.vector_norm(x, 2, dtype=acc)
    n = x.numel()
    zeros = n - torch.count_nonzero(x)
    nans = torch.isnan(x).sum()
    pinf = (x == float("inf")).sum()
    ninf = (x == float("-inf")).sum()
    return torch.stack([mx.to(acc), mn.to(acc), s, a, q * q, zeros.to(acc), nans.to(acc), pinf.to(acc),
                        ninf.to(acc)])


_STRIDED = torch.strided
_ROW_BYTES = RAW_WIDTH * 8
#: dtype -> (kernel code, name, bytes per element) of the dtypes the native kernel reads
_FAST = {dt: (code, dtype_name(dt), torch.empty((), dtype=dt).element_size()) for dt, code in _FAST_CODES.items()}
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction
_NAMES: dict[torch.dtype, str] = {}  # dtype -> its name (``float32``), filled on first sight


def fields_of(arr: np.ndarray) -> np.ndarray:
    """The session's statistics row (:data:`~nbdebug.session.stats.FIELDS`) of a host value, by the same
    reduction the capture applies (for checking a retained value against its recorded statistics).

    >>> fields_of(np.array([1.0, -3.0], dtype=np.float32))[:3].tolist()
    [1.0, -3.0, -1.0]
    """
    buf = StatsBuffer()
    row, _, _ = buf.add(torch.from_numpy(np.ascontiguousarray(arr)))
    return raw_to_fields(buf.raw()[row:row + 1], np.asarray([float(arr.size)]))[0]


class StatsBuffer(RawRows):
    """Raw statistics rows of one step."""

    def __init__(self, capacity: int = 1024) -> None:
        super().__init__(capacity)
        self._pending: list[tuple[int, torch.Tensor]] = []  # rows still on a device
        self.fast = _fastats is not None
        self._ptr = self._host.ctypes.data  # address of row 0 (moves when the matrix grows)
        self._cap = self._host.shape[0]

    def add(self, t: torch.Tensor) -> tuple[int, str, str | None]:
        """Queue the statistics of ``t``; returns (row, dtype name, unsupported reason or None)."""
        dt = t.dtype
        name = _NAMES.get(dt)
        if name is None:
            name = _NAMES[dt] = dtype_name(dt)
        code = _FAST_CODES.get(dt)
        if code is not None and t.is_cpu and t.layout is _STRIDED and self.fast and not _wrapper(t):  # common case
            n = t.numel()
            if n:
                src = t if t.is_contiguous() else t.contiguous()
                try:
                    ptr = src.data_ptr()
                except RuntimeError:  # no storage (inside torch.vmap): unsupported_reason says so below
                    n = 0
            if n:
                row = self._n
                if row == self._host.shape[0]:
                    self._next_row()
                    self._ptr, self._cap = self._host.ctypes.data, self._host.shape[0]
                else:
                    self._n = row + 1
                _fastats.reduce(ptr, n, code, self._ptr + row * (RAW_WIDTH * 8))
                return row, name, None
        local = local_shard(t)
        if local is not t:  # a DTensor: its local shard's statistics
            return self.add(local)
        row = self._next_row()
        self._ptr, self._cap = self._host.ctypes.data, self._host.shape[0]
        why = unsupported_reason(t)
        if why is not None:
            self._host[row] = _NAN_ROW
            return row, name, why
        if t.numel() == 0:
            self._host[row] = _NAN_ROW[:2] + [0.0] * 7
            return row, name, None
        with _NO_TORCH_FUNCTION():  # the statistics' own ops are never recorded (an op mode is on at L1/mix)
            self._pending.append((row, _device_row(t)))
        return row, name, None

    def measure(self, t: torch.Tensor, version: int) -> Seen:
        """Queue the statistics of ``t`` and return its :class:`~nbdebug.frameworks.core.records.Seen` (the
        capture core's ``TensorOps.measure``: one frame for the common case of a dense CPU tensor)."""
        fast = _FAST.get(t.dtype)
        if fast is not None and self.fast and t.is_cpu and t.layout is _STRIDED and not _wrapper(t):
            n = t.numel()
            if n:
                code, name, size = fast
                src = t if t.is_contiguous() else t.contiguous()
                try:
                    ptr = src.data_ptr()
                except RuntimeError:  # no storage (inside torch.vmap): add() gives the reason
                    n = 0
            if n:
                row = self._n
                if row == self._cap:
                    self._next_row()
                    self._ptr, self._cap = self._host.ctypes.data, self._host.shape[0]
                else:
                    self._n = row + 1
                _fastats.reduce(ptr, n, code, self._ptr + row * _ROW_BYTES)
                return Seen(_weakref(t), version, row, name, None, tuple(t.shape), n, n * size)
        t = local_shard(t)
        row, name, why = self.add(t)
        n = t.numel()
        return Seen(_weakref(t), version, row, name, why, tuple(t.shape), n, n * t.element_size())

    def unmeasured(self, t: torch.Tensor, version: int, why: str) -> Seen:
        """The record of ``t`` without statistics (an unsupported row saying ``why``): memory nobody wrote yet,
        whose bytes are not a value the model computed."""
        row = self._next_row()
        self._ptr, self._cap = self._host.ctypes.data, self._host.shape[0]
        self._host[row] = _NAN_ROW
        n = t.numel()
        return Seen(_weakref(t), version, row, _NAMES.get(t.dtype) or dtype_name(t.dtype), why, tuple(t.shape), n,
                    n * t.element_size())

    def raw(self) -> np.ndarray:
        """All rows so far as a host array; device rows come over in one transfer per device.

        Any thread may read (the notebook, the remote agent's) while the training thread queues more: the rows
        queued when this starts are moved and then taken off the queue (not what was queued meanwhile), into
        the matrix in use (under the lock its growth takes)."""
        if self._pending:
            with self._grow_lock:
                count = len(self._pending)
                by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
                for row, vec in self._pending[:count]:
                    by_device.setdefault(vec.device, []).append((row, vec))
                for items in by_device.values():
                    with _NO_TORCH_FUNCTION():
                        host = torch.stack([v for _, v in items]).to("cpu", torch.float64).numpy()
                    self._host[[r for r, _ in items]] = host
                del self._pending[:count]
        return self._host[: self._n]


def native_kernels(no_version: Any = None) -> tuple[Any, Any] | None:
    """The native kernel's ``(measure, version)``: ``measure(buf, t, version)`` is :meth:`StatsBuffer.measure`
    with its common case (a dense CPU tensor the kernel reads) in C, the
    :class:`~nbdebug.frameworks.core.records.Seen` made without a Python frame, every other case through
    :meth:`StatsBuffer.measure` itself; ``version(t)`` is ``t._version``, ``no_version(t)`` where that raises
    RuntimeError (inference tensors). None without the kernel (or one built before it had them). The kernel
    holds one setup per process: :mod:`.ops` makes it, once (``TorchOps.measure`` and ``TorchOps.version``).
    """
    if _fastats is None or not hasattr(_fastats, "version"):
        return None
    _fastats.measure_setup({dt: f for dt, f in _FAST.items()}, _STRIDED, Seen, StatsBuffer.measure, no_version)
    return _fastats.measure, _fastats.version
