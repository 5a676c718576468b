"""A tensor as the dump writer saw it at one moment, for either framework.

The dump I/O of each framework (``torch/io.py``, ``mindspore/io.py``) fills one :class:`Snap` per tensor when
the tensor is recorded: its description, its statistics (possibly still on the device until the step ends),
an optional copy of the data (tensor task) and the tensor the CRC is computed from. Both frameworks'
tensors report their size as ``.nbytes``.

>>> import numpy as np
>>> s = Snap("float32", [2, 3], None, (1.0, 0.0, 0.5, 1.2), np.zeros((2, 3), np.float32), None)
>>> s.nbytes, s.data_name
(24, None)
"""

from __future__ import annotations

from typing import Any


class Snap:
    """Description, statistics (maybe still on device), optional copy and CRC source of one tensor."""

    __slots__ = ("dtype", "shape", "requires_grad", "stats", "data", "crc_src", "data_name")

    def __init__(self, dtype: str, shape: list[int], requires_grad: bool | None, stats: tuple, data: Any,
                 crc_src: Any) -> None:
        self.dtype, self.shape, self.requires_grad = dtype, shape, requires_grad
        self.stats, self.data, self.crc_src = stats, data, crc_src
        self.data_name: str | None = None

    @property
    def nbytes(self) -> int:
        t = self.data if self.data is not None else self.crc_src
        return 0 if t is None else int(t.nbytes)


def untap(adapter: Any, pending: dict) -> None:
    """Detach a dump I/O from ``adapter``: no tap, the adapter's own ``run_op`` again, nothing pending."""
    adapter.tap = None
    if "run_op" in vars(adapter):
        del adapter.run_op
    pending.clear()
