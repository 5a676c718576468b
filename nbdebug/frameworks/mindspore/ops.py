"""MindSpore's tensor operations for the capture core: no version counter, so Parameters are copied.

MindSpore tensors have no in-place version counter: a kept reference cannot tell whether the value
changed since it was used. The optimizer updates Parameters in place after the step's flush, and
BatchNorm updates its moving statistics (non-trainable Parameters) in place *during* the forward, while
statistics are still queued. So a Parameter is measured from a private copy taken when it is used (an
asynchronous copy, queued before the op that updates it): its statistics and its retained value are that
copy. A non-trainable Parameter gets a fresh version at every use (measured again each time: its value
may have changed in between); a trainable one is measured again after the optimizer.

>>> import mindspore as ms, numpy as np
>>> p = ms.Parameter(ms.Tensor(np.zeros(2, np.float32)), name="p", requires_grad=False)
>>> o = MindSporeOps()
>>> o.mutable.add(id(p))
>>> o.version(p) != o.version(p)
True
"""

from __future__ import annotations

import contextlib
import itertools
import weakref
from typing import Any

import mindspore as ms
from mindspore import ops
from mindspore.common.parameter import Parameter

from ..core.records import Seen
from .stats import StatsBuffer

Tensor = ms.Tensor
TensorBase = Tensor.__mro__[1]  # TensorPy: Tensor and Parameter both derive from it
_FRESH = itertools.count(1)


class MSRef:
    """Retention handle: a reference to a MindSpore tensor, or a private copy (``ops.deepcopy``)."""

    __slots__ = ("tensor", "nbytes", "copied", "__weakref__")

    def __init__(self, t: Any, copy: bool, nbytes: int = 0, *, taken: bool = False) -> None:
        """``taken``: ``t`` is already a private copy."""
        self.copied = copy or taken
        self.tensor = ops.deepcopy(t) if copy and not taken else t
        self.nbytes = nbytes  # known once the value exists (filled in at the flush before offering)

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


class MindSporeOps:
    """The :class:`~nbdebug.frameworks.core.tensor_ops.TensorOps` of MindSpore PyNative."""

    tensor_type = TensorBase
    has_versions = False

    def __init__(self) -> None:
        #: ids of the model's non-trainable Parameters (filled in at attach; reading ``requires_grad`` of a
        #: Parameter waits for MindSpore's queue)
        self.mutable: set[int] = set()

    def version(self, t: Any) -> int:
        if id(t) in self.mutable:
            return next(_FRESH)  # updated in place by ops during the step (moving statistics)
        return 0

    @staticmethod
    def measure(buf: StatsBuffer, t: Any, version: int) -> Seen:
        """Queue ``t``'s statistics (read nothing of it: MindSpore's queue would wait); a Parameter's are
        those of a copy taken now."""
        if isinstance(t, Parameter):
            snap = ops.deepcopy(t)
            return Seen(weakref.ref(t), version, buf.add(snap), None, None, copy=snap)
        return Seen(weakref.ref(t), version, buf.add(t), None, None)

    @staticmethod
    def reference(t: Any, seen: Seen, copy: bool) -> MSRef:
        if seen.copy is not None:
            return MSRef(seen.copy, True, taken=True)
        return MSRef(t, copy)

    @staticmethod
    def quiet() -> Any:
        """The capture's own calls are kept out by the adapter's ``busy`` flag: nothing to enter."""
        return contextlib.nullcontext()

    @staticmethod
    def new_buffer() -> StatsBuffer:
        return StatsBuffer()
