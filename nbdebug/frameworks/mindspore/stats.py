"""Tensor statistics for MindSpore (PyNative) without a host sync per tensor.

Each captured tensor gets one raw row ``[max, min, sum, abs_sum, sq_sum, zeros, nans, +infs, -infs]``
(the layout of :mod:`nbdebug.frameworks.torch.stats`).

MindSpore executes PyNative ops asynchronously, and reading anything of a fresh result — its memory
(``data_ptr()``, ``asnumpy()``) but also its ``dtype``, ``shape`` or ``device`` — waits for the queue. So
tensors are *queued*: the buffer keeps a reference and, on CPU, reduces them all at once with the native
kernel ``nbdebug.frameworks._fastats`` when the rows are needed (:meth:`StatsBuffer.raw`), before anything updates
them in place (:meth:`StatsBuffer.flush`, called by the adapter before ``optimizer(grads)`` and before
in-place ops), or when ``max_queued`` tensors wait. That is one wait per flush instead of several per
tensor. On other devices (and for dtypes the kernel does not read) the rows are computed with MindSpore
ops on the tensor's device; the small result vectors are stacked and copied to the host in one transfer.

>>> import mindspore as ms, numpy as np
>>> buf = StatsBuffer()
>>> row = buf.add(ms.Tensor(np.array([1.0, -2.0, 0.0], np.float32)))
>>> buf.raw()[row].tolist(), buf.meta[row][:3]
([1.0, -2.0, -1.0, 3.0, 5.0, 1.0, 0.0, 0.0, 0.0], ('float32', (3,), 3))
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
from mindspore import ops

from ...session.session import RAW_WIDTH, RawRows
from ..core.native import codes_for
from ..core.native import fastats as _fastats

_NAN_ROW = [float("nan")] * 5 + [0.0] * 4
_COMPLEX = (ms.complex64, ms.complex128)


def dtype_name(dtype) -> str:
    """``Float32`` -> ``float32`` (the names the PyTorch side uses, so runs compare)."""
    return str(dtype).lower()


_FAST_CODES = codes_for((ms.float32, ms.float64, ms.float16, ms.bfloat16, ms.int8, ms.uint8, ms.int16, ms.int32,
                         ms.int64, ms.bool_), dtype_name)


def _device_row(t, device: str = "cpu"):
    """Raw row computed with MindSpore ops on ``t``'s device (queued, no sync)."""
    x = t
    if x.dtype == ms.bool_:
        x = x.astype(ms.uint8)
    acc = ms.float32 if device == "ascend" else ms.float64
    x = x.astype(acc)
    inf = ops.isinf(x)
    parts = [
        x.max(), x.min(), x.sum(), ops.abs(x).sum(), (x * x).sum(),
        ops.equal(x, 0).astype(acc).sum(),
        ops.isnan(x).astype(acc).sum(),
        ops.logical_and(inf, ops.gt(x, 0)).astype(acc).sum(),
        ops.logical_and(inf, ops.lt(x, 0)).astype(acc).sum(),
    ]
    return ops.stack([p.astype(acc) for p in parts])


class StatsBuffer(RawRows):
    """Raw statistics rows of one step.

    :meth:`add` only queues the tensor — it reads no metadata, because on MindSpore's asynchronous
    PyNative queue even ``dtype`` or ``shape`` of a fresh result waits for everything queued before it.
    :meth:`flush` waits once and fills the rows and :attr:`meta` (dtype name, shape, count, unsupported
    reason, bytes) of every queued tensor.
    """

    def __init__(self, capacity: int = 1024, *, max_queued: int = 2048, fast: bool | None = None,
                 device: str | None = None) -> None:
        super().__init__(capacity)
        self._queued: list[tuple[int, object]] = []  # (row, tensor): reduced at flush
        self._queued_ids: set[int] = set()
        self._pending: list[tuple[int, object]] = []  # (row, device result vector)
        self.meta: dict[int, tuple[str, tuple[int, ...], int, str | None, int]] = {}
        self.max_queued = max_queued
        self.device = (device or str(ms.get_context("device_target"))).lower()
        self.fast = (_fastats is not None) if fast is None else (fast and _fastats is not None)
        self.flushes = 0

    def add(self, t) -> int:
        """Queue the statistics of ``t``; returns its row (filled in at :meth:`flush`)."""
        row = self._next_row()
        self._queued.append((row, t))
        self._queued_ids.add(id(t))
        if len(self._queued) >= self.max_queued:
            self.flush()
        return row

    def is_queued(self, t) -> bool:
        """True while ``t``'s statistics wait for a flush (an in-place update must flush first)."""
        return id(t) in self._queued_ids

    def flush(self) -> None:
        """Reduce every queued tensor now (on CPU: waits once for MindSpore's queue)."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []  # another thread may queue meanwhile
        self._queued_ids = set()
        out = self._host.ctypes.data
        for row, t in queued:
            dtype = t.dtype
            name = dtype_name(dtype)
            n = int(t.size)
            shape = tuple(int(d) for d in t.shape)
            nbytes = n * int(t.itemsize)
            why = None
            code = _FAST_CODES.get(dtype)
            if dtype in _COMPLEX:
                self._host[row] = _NAN_ROW
                why = f"unsupported: complex dtype {name}"
            elif n == 0:
                self._host[row] = _NAN_ROW[:2] + [0.0] * 7
            elif self.fast and code is not None and self.device == "cpu":
                if not t.is_contiguous():
                    t = t.contiguous()
                _fastats.reduce(t.data_ptr(), n, code, out + row * RAW_WIDTH * 8)
            else:
                try:
                    self._pending.append((row, _device_row(t, self.device)))
                except Exception as exc:  # noqa: BLE001 - a dtype the ops do not take: say so, keep going
                    self._host[row] = _NAN_ROW
                    why = f"unsupported: {type(exc).__name__} reducing {name}"
            self.meta[row] = (name, shape, n, why, nbytes)
        self.flushes += 1

    def raw(self) -> np.ndarray:
        """All rows so far as a host array; device rows come over in one transfer."""
        self.flush()
        if self._pending:
            host = ops.stack([v for _, v in self._pending]).astype(ms.float64).asnumpy().copy()
            host[host[:, 6] > 0, 0:2] = np.nan  # numpy semantics: NaN present -> max/min NaN
            self._host[[r for r, _ in self._pending]] = host
            self._pending.clear()
        return self._host[: self._n]
