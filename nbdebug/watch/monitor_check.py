"""TO on the monitor series: what a ``level="monitor"`` run checks for NaN/Inf.

A monitor-level step records no tensors, so the tensor conditions have nothing to read — but a NaN loss, a NaN
gradient norm or an Inf activation norm is exactly what a run left on for hours must stop at. The norm of a
tensor that holds a NaN is NaN (an Inf: Inf), so ``TO`` on a step with no tensor statistics fires on every
monitor series whose value at that step is not finite: ``node`` is the series (``Run``, ``Module.fc1.Linear``,
``Parameter.fc1.weight``), ``slot`` its field. A norm beyond float32's range is clamped when stored (never a
false Inf; :attr:`~nbdebug.session.monitor.Monitor.clamped`). Selected ``nodes`` globs match series names.

>>> import numpy as np
>>> from nbdebug.session.session import Session
>>> from nbdebug.watch.watchpoints import WatchManager
>>> s = Session(framework="none"); wm = WatchManager(s)
>>> wp = wm.watch("TO")
>>> s.monitor.record(0, [("Run", "loss"), ("Parameter.w", "grad_norm")], np.array([np.nan, 1.0]))
>>> [(h.node, h.slot, h.step) for h in monitor_nonfinite(wm.watchpoints.values(), s, 0)]
[('Run', 'loss', 0)]
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from .firing import Hit

ADVICE = ("A monitor series went NaN/Inf at this step. Replay the step at op level to find the op that made it "
          "(dbg.replay(step, level='mix'), or Debugger(..., on_hit='replay')); first look at the loss, the data "
          "batch, the learning rate and the loss scale.")


def monitor_nonfinite(watchpoints: Iterable[Any], session: Any, step: int) -> list[Any]:
    """TO hits on the non-finite monitor series of ``step`` (one per series and enabled TO watchpoint)."""
    from .watchpoints import HitRecord

    wps = [w for w in watchpoints if w.enabled and w.condition == "TO"]
    if not wps:
        return []
    bad = session.monitor.nonfinite(step)
    out = []
    for wp in wps:
        for k, ((name, field), value) in enumerate(bad.items()):
            if wp.nodes is not None and not any(name == p or fnmatch.fnmatchcase(name, p) for p in wp.nodes):
                continue
            count = "nan_count" if value != value else "pos_inf_count" if value > 0 else "neg_inf_count"
            out.append(HitRecord(wp.id, "TO", name, field, step, k, (Hit(count, 0.0, 1.0),), None, (),
                                 f"{field} is {value}: the tensor it measures held at least one "
                                 f"{'NaN' if count == 'nan_count' else 'Inf'}. {ADVICE}"))
    return out
