"""PyTorch's tensor operations for the capture core: version counter, references checked against it.

>>> import torch
>>> ops = TorchOps()
>>> buf = ops.new_buffer()
>>> t = torch.ones(2)
>>> seen = ops.measure(buf, t, ops.version(t))
>>> ref = ops.reference(t, seen, copy=False)
>>> _ = t.add_(1)
>>> try:
...     ref.numpy()
... except Exception as e:
...     print(type(e).__name__)
NotRetainedError
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from ...session.store import NotRetainedError
from ..core.records import Seen
from .stats import StatsBuffer, local_shard, native_kernels

_NO_VERSION = iter(range(-1, -(1 << 62), -1))
_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


class CopyPool:
    """Buffers of private copies no one holds any more, reused for the next copy of the same layout.

    Every step keeps a copy of each parameter the model used (the optimizer overwrites it in place). A
    fresh allocation of a large CPU tensor is fresh pages from the kernel, and faulting them in costs
    several times the copy itself; the copies of two steps ago, dropped when the store rotates, have
    exactly the needed layouts. A buffer comes back only when nothing else holds it (no reference to the
    tensor, no view of its storage, no NumPy array over it), and buffers not taken again within a step
    are let go (:meth:`trim`), so the pool holds at most one step's worth of evicted copies.

    >>> pool = CopyPool()
    >>> a = torch.zeros(128, 128)   # 64 KiB: smaller copies come from malloc's free lists
    >>> c = pool.copy(a)
    >>> ptr = c.data_ptr()
    >>> pool.give(c); del c
    >>> pool.copy(a + 1).data_ptr() == ptr   # the same memory, new contents
    True
    """

    MIN_BYTES = 1 << 16  # smaller copies come from malloc's free lists anyway

    def __init__(self) -> None:
        self.free: dict[tuple, list[torch.Tensor]] = {}
        self.idle: dict[tuple, list[torch.Tensor]] = {}  # given back before the last trim: dropped at the next
        self.reused = 0  # copies made into a recycled buffer (for tests and benches)
        self.closed = False  # after the Debugger's close: copies still held go back to the allocator

    @staticmethod
    def _key(t: torch.Tensor) -> tuple | None:
        if t.numel() * t.element_size() < CopyPool.MIN_BYTES:  # first: most copies are small
            return None
        if not t.is_cpu or t.layout is not torch.strided or not t.is_contiguous():
            return None
        return (t.dtype, tuple(t.shape))

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A private copy of ``t`` (detached), in a recycled buffer when one of its layout is free."""
        key = self._key(t)
        if key is not None:
            for bins in (self.free, self.idle):
                stack = bins.get(key)
                if stack:
                    try:
                        buf = stack.pop()  # atomic; another thread may have emptied it since the test
                    except IndexError:
                        continue
                    self.reused += 1
                    return buf.copy_(t)
        return t.clone()

    def give(self, buf: torch.Tensor) -> None:
        """``buf`` (a copy made here) is dropped by its holder; kept for reuse when nothing else holds it.
        The caller must drop its own reference right after."""
        key = self._key(buf)
        if self.closed or key is None or buf._base is not None or buf.is_inference():
            return
        # references: the caller's, this frame's argument, getrefcount's own
        if sys.getrefcount(buf) > 3:
            return
        if _USE_COUNT is not None and _USE_COUNT(buf.untyped_storage()._cdata) > 2:
            return  # a view of its storage lives on (this storage object counts one)
        self.free.setdefault(key, []).append(buf)

    def trim(self) -> None:
        """Drop the buffers not reused since the last trim (called at each step end)."""
        self.idle, self.free = self.free, {}

    def clear(self) -> None:
        """Let every buffer go; nothing is kept from now on."""
        self.closed = True
        self.free.clear()
        self.idle.clear()


def version_of(t: torch.Tensor) -> int:
    """``t._version``; inference tensors have none: a fresh negative number (never equal to another)."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return next(_NO_VERSION)


def _no_version(t: torch.Tensor) -> int:
    return next(_NO_VERSION)


#: the native kernel's ``(measure, version)`` (the same as StatsBuffer.measure and version_of, without a frame)
_NATIVE = native_kernels(_no_version)


_all_disabled = torch._C._is_torch_function_all_disabled  # inside DisableTorchFunction (no mode, no subclass)


class TorchRef:
    """Retention handle: a reference (checked against in-place edits) or a private copy.

    ``overwritten_by``: the op that overwrote the value in place after capture without a copy being taken
    (named in the refusal)."""

    __slots__ = ("tensor", "version", "nbytes", "copied", "overwritten_by", "pool", "__weakref__")

    def __init__(self, t: torch.Tensor, copy: bool, version: int | None = None, nbytes: int | None = None,
                 pool: CopyPool | None = None) -> None:
        self.pool = pool
        self.overwritten_by: str | None = None
        if version is not None and version >= 0 and nbytes is not None and not copy and _all_disabled():
            # the capture's common case (a reference, made where no torch function runs): no second block
            self.version, self.copied, self.nbytes = version, False, nbytes
            self.tensor = t.detach()
            return
        with torch._C.DisableTorchFunction():
            self.version = version_of(t) if version is None else version
            copy = copy or self.version < 0  # no version counter: in-place edits are invisible, keep a copy
            self.copied = copy
            if copy:
                self.tensor = pool.copy(t.detach()) if pool is not None else t.detach().clone()
            else:
                self.tensor = t.detach()
            self.nbytes = t.numel() * t.element_size() if nbytes is None else nbytes

    def snapshot(self) -> None:
        """Take a private copy now (called before an in-place op overwrites the value)."""
        if not self.copied:
            with torch._C.DisableTorchFunction():
                pool = self.pool
                self.tensor = pool.copy(self.tensor) if pool is not None else self.tensor.clone()
            self.copied = True

    def __del__(self) -> None:
        pool = self.pool
        if pool is not None and self.copied:
            try:
                t = self.tensor
                self.tensor = None
                pool.give(t)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to recycle
                pass

    def numpy(self):
        with torch._C.DisableTorchFunction():
            t = self.tensor
            if not self.copied and t._version != self.version:
                by = f" by {self.overwritten_by}" if self.overwritten_by else ""
                raise NotRetainedError(
                    f"the value was modified in place{by} after it was captured (version {self.version} -> "
                    f"{t._version}) and no copy was kept" + (
                        " (values the optimizer overwrites are copied only for watched nodes)"
                        if by and "allreduce" not in by else ""))
            if t.dtype == torch.bfloat16:
                t = t.float()
            arr = t.cpu().numpy()
            return arr.copy() if not self.copied else arr


class TorchOps:
    """The :class:`~nbdebug.frameworks.core.tensor_ops.TensorOps` of PyTorch (called with torch functions
    disabled)."""

    tensor_type = torch.Tensor
    has_versions = True
    version = staticmethod(_NATIVE[1] if _NATIVE else version_of)

    def __init__(self) -> None:
        #: buffers of dropped private copies, reused for the next ones (see :class:`CopyPool`)
        self.pool = CopyPool()

    #: ``measure(buf, t, version)``: the buffer's own method, called unbound (no frame in between); the native
    #: kernel's where built (the same, its common case in C: see :func:`.stats.native_kernels`)
    measure = staticmethod(_NATIVE[0] if _NATIVE else StatsBuffer.measure)

    def reference(self, t: torch.Tensor, seen: Seen, copy: bool) -> Any:
        local = local_shard(t)
        if local is not t:  # a DTensor: its local shard, the values its statistics describe (.numpy() refused it)
            return TorchRef(local, copy, None, seen.nbytes, self.pool)
        return TorchRef(t, copy, seen.version, seen.nbytes, self.pool)

    @staticmethod
    def quiet() -> Any:
        """A context in which the capture's own tensor calls are not seen by the op mode."""
        return torch._C.DisableTorchFunction()

    @staticmethod
    def new_buffer() -> StatsBuffer:
        return StatsBuffer()
