"""Retained tensor values: current step, previous step and initial parameter values, under a budget.

Adapters hand in *handles* (objects with ``nbytes`` and ``numpy()``); the store decides what fits the
memory budget and remembers why anything else was not kept.

>>> import numpy as np
>>> class H:
...     def __init__(self, a): self.a, self.nbytes = a, a.nbytes
...     def numpy(self): return self.a
>>> s = TensorStore(budget_bytes=64)
>>> s.offer(("n", "output.0"), H(np.zeros(4)))
True
>>> s.offer(("n", "output.1"), H(np.zeros(100)))
False
>>> s.reason(("n", "output.1"), "current")
'not retained: 800 B would exceed the memory budget of 64 B (32 B retained)'
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Handle(Protocol):
    nbytes: int

    def numpy(self) -> np.ndarray: ...


class NotRetainedError(LookupError):
    """A tensor value is not available; the message says why."""


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover


class TensorStore:
    """Values of the current and previous step plus initial parameter values, within ``budget_bytes``."""

    def __init__(self, budget_bytes: int = 512 * 2**20) -> None:
        if budget_bytes < 0:
            raise ValueError(f"memory budget must be >= 0 bytes, got {budget_bytes}")
        self.budget = int(budget_bytes)
        #: whether values no watchpoint reads are kept (the Debugger's ``retain``); a value watchpoint
        #: forces its nodes' outputs only: their inputs and parameters are other nodes' outputs
        self.keep_unpinned = True
        self.current: dict[tuple[str, str], Any] = {}
        self.previous: dict[tuple[str, str], Any] = {}
        self.initial: dict[tuple[str, str], Any] = {}
        self._reasons: dict[str, dict[tuple[str, str], str]] = {"current": {}, "previous": {}, "initial": {}}
        self._bytes = {"current": 0, "previous": 0, "initial": 0}
        self._ids: dict[str, set[int]] = {"current": set(), "previous": set(), "initial": set()}
        #: keys given no value on purpose (:meth:`refuse`): a later offer for them is turned down
        self._refused: dict[str, set[tuple[str, str]]] = {"current": set(), "previous": set(), "initial": set()}
        self._used = 0  # sum of _bytes (read on every offer: kept as a running total)

    @property
    def used(self) -> int:
        return self._used

    def fits(self, nbytes: int) -> bool:
        return self._used + nbytes <= self.budget

    def offer(self, key: tuple[str, str], handle: Handle, which: str = "current", force: bool = False,
              inputs_too: bool = False) -> bool:
        """Keep ``handle`` under ``key`` if it fits; otherwise record why not. Returns whether kept.

        ``force`` keeps an output regardless of the budget (values a watchpoint needs are always kept);
        ``inputs_too`` forces inputs and parameters as well (a node the user keeps)."""
        if key in self._refused[which]:
            return False
        table = getattr(self, which)
        ids = self._ids[which]
        if id(handle) in ids:  # the same tensor under another name costs nothing more
            table[key] = handle
            return True
        if force and not inputs_too and key[1].startswith(("input", "parameters")):
            if not self.keep_unpinned:
                self._reasons[which][key] = (f"not retained: {key[1]} of a watched node is another node's "
                                             f"output (read it there); only watched outputs are kept")
                return False
            force = False  # an input is kept like any unwatched value: within the budget
        if not force and self._used + handle.nbytes > self.budget:
            self._reasons[which][key] = (
                f"not retained: {fmt_bytes(handle.nbytes)} would exceed the memory budget of "
                f"{fmt_bytes(self.budget)} ({fmt_bytes(self.used)} retained)"
            )
            return False
        table[key] = handle
        ids.add(id(handle))
        self._bytes[which] += handle.nbytes
        self._used += handle.nbytes
        return True

    def refuse(self, key: tuple[str, str], reason: str, which: str = "current") -> None:
        """``key`` has no value in ``which``, for ``reason``: a value offered for it before is dropped (its
        bytes stay counted until the step rotates out), one offered later turned down."""
        getattr(self, which).pop(key, None)
        self._refused[which].add(key)
        self._reasons[which][key] = reason

    def rotate(self) -> None:
        """Step boundary: current becomes previous, the old previous is released."""
        self.previous, self.current = self.current, {}
        self._reasons["previous"], self._reasons["current"] = self._reasons["current"], {}
        self._refused["previous"], self._refused["current"] = self._refused["current"], set()
        self._used -= self._bytes["previous"]
        self._bytes["previous"], self._bytes["current"] = self._bytes["current"], 0
        self._ids["previous"], self._ids["current"] = self._ids["current"], set()

    def has(self, key: tuple[str, str], which: str = "current") -> bool:
        return key in getattr(self, which)

    def reason(self, key: tuple[str, str], which: str) -> str | None:
        return self._reasons[which].get(key)

    def get(self, key: tuple[str, str], which: str = "current") -> np.ndarray:
        """The value as numpy, or :class:`NotRetainedError` saying why it is not available."""
        handle = getattr(self, which).get(key)
        if handle is None:
            why = self._reasons[which].get(key)
            if why is None:
                why = f"no value retained for {key[0]} {key[1]} in the {which} step"
            raise NotRetainedError(why)
        return handle.numpy()

    def clear(self) -> None:
        for which in ("current", "previous", "initial"):
            getattr(self, which).clear()
            self._reasons[which].clear()
            self._refused[which].clear()
            self._bytes[which] = 0
            self._ids[which].clear()
        self._used = 0
