"""Loss-scale history: each step's scale and overflow flag, and persisting overflow.

With mixed precision the loss is scaled; a step whose gradients overflow is skipped and the scale
lowered. A few such steps are normal; overflow that persists step after step means something in the
network overflows on its own (seed 003: "if it keeps overflowing, find out why first"). The tracker is
framework-neutral: PyTorch's ``GradScaler`` is read by :mod:`nbdebug.frameworks.torch.loss_scale`; for
MindSpore's ``TrainOneStepWithLossScaleCell`` (which returns ``loss, overflow, scale``) call
``tracker.record(scale, overflow)`` yourself — MindSpore tensors are accepted.

This is deliberately not one of the 17 watchpoint conditions: it watches a per-step scalar, not tensors.

>>> t = LossScaleTracker()
>>> for s, o in [(1024, False), (512, True), (256, True), (128, True)]:
...     _ = t.record(s, o)
>>> t.persisting(3)
[(1, 3)]
>>> t.overflow_run
3
"""

from __future__ import annotations

import html
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..session.handle import Handle


@dataclass(frozen=True)
class LossScaleRecord:
    """One step: the scale the step ran with and whether its gradients overflowed."""

    step: int
    scale: float
    overflow: bool


@dataclass(frozen=True)
class LossScaleHit:
    """Overflow persisted for ``k`` consecutive steps, from ``first_step`` to ``step``."""

    k: int
    first_step: int
    step: int
    scale: float

    def describe(self) -> str:
        return (f"loss-scale overflow persisted for {self.k} consecutive steps ({self.first_step}..{self.step}); "
                f"scale now {self.scale:g}. Persistent overflow is not the usual occasional skip: look for the "
                f"first inf/nan (first_nonfinite, watchpoint TO) in one of these steps.")


def _as_float(x: Any) -> float:
    if hasattr(x, "asnumpy"):  # mindspore.Tensor
        x = x.asnumpy()
    if hasattr(x, "item"):
        x = x.item()
    return float(x)


def _as_bool(x: Any) -> bool:
    if hasattr(x, "asnumpy"):
        x = x.asnumpy()
    if hasattr(x, "item"):
        x = x.item()
    return bool(x)


class LossScaleTracker:
    """Per-step ``(scale, overflow)`` history with persistent-overflow watches."""

    def __init__(self) -> None:
        self._records: list[LossScaleRecord] = []
        self._watches: dict[int, tuple[int, Callable[[LossScaleHit], Any]]] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self.overflow_run = 0  # consecutive overflowing steps up to the latest record

    def record(self, scale: Any, overflow: Any, step: int | None = None) -> LossScaleRecord:
        """Add one step (``step`` defaults to the previous record's + 1, starting at 0); fires watches."""
        rec_scale, rec_over = _as_float(scale), _as_bool(overflow)
        with self._lock:
            if step is None:
                step = self._records[-1].step + 1 if self._records else 0
            rec = LossScaleRecord(int(step), rec_scale, rec_over)
            self._records.append(rec)
            self.overflow_run = self.overflow_run + 1 if rec_over else 0
            run = self.overflow_run
            watches = list(self._watches.values())
        for k, fn in watches:
            if run == k:  # fires once when a run reaches k steps
                fn(LossScaleHit(k, rec.step - k + 1, rec.step, rec.scale))
        return rec

    def history(self) -> list[LossScaleRecord]:
        """Every recorded step, in order."""
        with self._lock:
            return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    def persisting(self, k: int) -> list[tuple[int, int]]:
        """``(first_step, last_step)`` of every run of at least ``k`` consecutive overflowing steps."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        out: list[tuple[int, int]] = []
        start: int | None = None  # first step of the overflow run in progress
        last = -1
        for r in self.history():
            if start is not None and (not r.overflow or r.step != last + 1):  # the run ends
                if last - start + 1 >= k:
                    out.append((start, last))
                start = None
            if r.overflow and start is None:
                start = r.step
            last = r.step
        if start is not None and last - start + 1 >= k:
            out.append((start, last))
        return out

    def watch(self, k: int, callback: Callable[[LossScaleHit], Any]) -> Handle:
        """Call ``callback(LossScaleHit)`` whenever overflow has persisted for ``k`` consecutive steps;
        returns a :class:`~nbdebug.session.handle.Handle` that removes the watch (``.remove()``, ``with``,
        or called)."""
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        with self._lock:
            wid = self._next_id
            self._next_id += 1
            self._watches[wid] = (k, callback)

        def remove() -> None:
            with self._lock:
                self._watches.pop(wid, None)

        return Handle(remove)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self.overflow_run = 0

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr style='background:{'#f8d0d0' if r.overflow else '#fff'}'><td>{r.step}</td><td>{r.scale:g}</td>"
            f"<td>{'overflow' if r.overflow else ''}</td></tr>" for r in self.history()[-200:])
        return (f"<div><b>{html.escape(repr(self))}</b><table><tr><th>step</th><th>scale</th><th></th></tr>"
                f"{rows}</table></div>")

    def __repr__(self) -> str:
        n = len(self._records)
        over = sum(1 for r in self._records if r.overflow)
        return f"<LossScaleTracker {n} steps, {over} with overflow, current run {self.overflow_run}>"
