"""The capture level, decoded once: what a level records.

A :class:`Level` is a ``str`` (``"L0"``, ``"L1"``, ``"mix"``, ``"monitor"``: it compares, prints and
serializes as before) that answers the questions code used to ask by string tests:

- ``modules``: module (Cell) calls are nodes of the graph (L0, mix);
- ``ops``: every op (API call) is a node (L1, mix);
- ``records_tensors``: statistics of every tensor of a step are recorded (all but monitor; at "monitor"
  the per-step series of ``Session.monitor`` are the only record).

>>> lv = Level("mix")
>>> lv == "mix", lv.modules, lv.ops, lv.records_tensors
(True, True, True, True)
>>> Level("monitor").records_tensors, Level("L1").modules
(False, False)
>>> Level("L2")
Traceback (most recent call last):
ValueError: unknown level 'L2'; choose one of L0, L1, mix, monitor
"""

from __future__ import annotations

#: the capture levels, in the order the documentation lists them
LEVELS = ("L0", "L1", "mix", "monitor")


class Level(str):
    """One of :data:`LEVELS`, with what it records (see the module docstring)."""

    __slots__ = ()

    def __new__(cls, value: str) -> Level:
        if isinstance(value, Level):
            return value
        if value not in LEVELS:
            raise ValueError(f"unknown level {value!r}; choose one of {', '.join(LEVELS)}")
        return super().__new__(cls, value)

    @property
    def modules(self) -> bool:
        """Module (Cell) calls are recorded as nodes."""
        return self in ("L0", "mix")

    @property
    def ops(self) -> bool:
        """Every op (API call) is recorded as a node."""
        return self in ("L1", "mix")

    @property
    def records_tensors(self) -> bool:
        """Every tensor of a step gets a statistics row (False at "monitor": the monitor series only)."""
        return self != "monitor"

    def __repr__(self) -> str:
        return str.__repr__(str(self))
