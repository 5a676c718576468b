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

import weakref
from typing import Any

import torch

from ...session.store import NotRetainedError
from ..core.records import Seen
from .stats import StatsBuffer

_NO_VERSION = iter(range(-1, -(1 << 62), -1))


def version_of(t: torch.Tensor) -> int:
    """``t._version``; inference tensors have none: a fresh negative number (never equal to another)."""
    try:
        return t._version
    except RuntimeError:  # "Inference tensors do not track version counter"
        return next(_NO_VERSION)


class TorchRef:
    """Retention handle: a reference (checked against in-place edits) or a private copy.

    ``overwritten_by``: the op that overwrote the value in place after capture without a copy being taken
    (named in the refusal)."""

    __slots__ = ("tensor", "version", "nbytes", "copied", "overwritten_by", "__weakref__")

    def __init__(self, t: torch.Tensor, copy: bool, version: int | None = None, nbytes: int | None = None) -> None:
        with torch._C.DisableTorchFunction():
            self.version = version_of(t) if version is None else version
            copy = copy or self.version < 0  # no version counter: in-place edits are invisible, keep a copy
            self.copied = copy
            self.tensor = t.detach().clone() if copy else t.detach()
            self.nbytes = t.numel() * t.element_size() if nbytes is None else nbytes
        self.overwritten_by: str | None = None

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
                by = f" by {self.overwritten_by}" if self.overwritten_by else ""
                raise NotRetainedError(
                    f"the value was modified in place{by} after it was captured (version {self.version} -> "
                    f"{t._version}) and no copy was kept" + (
                        " (values the optimizer overwrites are copied only for watched nodes)" if by else ""))
            if t.dtype == torch.bfloat16:
                t = t.float()
            arr = t.cpu().numpy()
            return arr.copy() if not self.copied else arr


class TorchOps:
    """The :class:`~nbdebug.frameworks.core.tensor_ops.TensorOps` of PyTorch (called with torch functions
    disabled)."""

    tensor_type = torch.Tensor
    has_versions = True
    version = staticmethod(version_of)

    @staticmethod
    def measure(buf: StatsBuffer, t: torch.Tensor, version: int) -> Seen:
        row, dtype, why = buf.add(t)
        n = t.numel()
        return Seen(weakref.ref(t), version, row, dtype, why, tuple(t.shape), n, n * t.element_size())

    @staticmethod
    def reference(t: torch.Tensor, seen: Seen, copy: bool) -> Any:
        return TorchRef(t, copy, seen.version, seen.nbytes)

    @staticmethod
    def quiet() -> Any:
        """A context in which the capture's own tensor calls are not seen by the op mode."""
        return torch._C.DisableTorchFunction()

    @staticmethod
    def new_buffer() -> StatsBuffer:
        return StatsBuffer()
