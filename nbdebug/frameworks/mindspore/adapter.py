"""MindSpore entry point for :class:`nbdebug.Debugger`.

``MindSporeAdapter(cell, level, session, retain=...)`` picks the capture that fits the execution mode
at attach time:

* PyNative (``mindspore.PYNATIVE_MODE``): Cell hooks and op wrappers —
  :class:`~nbdebug.frameworks.mindspore.pynative.PyNativeAdapter` (levels L0, L1, mix, monitor).
* GRAPH (``mindspore.GRAPH_MODE``): MindSpore's own kernel-by-kernel dump, read back after every graph
  run — :class:`~nbdebug.frameworks.mindspore.graph_live.GraphAdapter` (kernel level whatever the
  level asked for); ``level="monitor"`` is refused there (a ``ValueError`` naming ``graph_every`` sampling).

Under ``mindspore.train.Model`` pass :class:`StepCallback` so that each training step is a debugger
step, with ``dataset_sink_mode=False``::

    model.train(1, dataset, callbacks=[StepCallback(dbg)], dataset_sink_mode=False)
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
from mindspore.train.callback import Callback

from ...session.session import Session
from .kernel_config import check_every
from .monitor import train_loss
from .pynative import LEVELS as _PYNATIVE_LEVELS
from .pynative import PyNativeAdapter

LEVELS = _PYNATIVE_LEVELS


def mindspore_info() -> tuple[str, str]:
    """(MindSpore version, device target in lower case: ``cpu`` / ``gpu`` / ``ascend``)."""
    return ms.__version__, str(ms.get_context("device_target")).lower()


def graph_mode() -> bool:
    return ms.get_context("mode") == ms.GRAPH_MODE


def MindSporeAdapter(model: Any, level: str, session: Session, *, retain: bool = True,  # noqa: N802
                     retain_copy: bool = False, graph_every: int = 1) -> Any:
    """The capture for ``model`` in the current execution mode (see the module docstring)."""
    if level not in LEVELS:
        raise ValueError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
    graph_every = check_every(graph_every)
    if graph_mode() and level == "monitor":
        raise ValueError(
            "level='monitor' needs MindSpore's PyNative mode (its per-step norms come from Cell hooks and "
            "optimizer(grads), which a compiled graph does not run through Python). In GRAPH mode the only "
            "capture is MindSpore's kernel dump: attach at level 'L1' with graph_every=N to capture every N-th "
            "graph run (its statistics, with TO and the temporal watchpoints on them), or switch to "
            "mindspore.set_context(mode=mindspore.PYNATIVE_MODE) for level='monitor'")
    if graph_mode():
        from .graph_live import GraphAdapter

        return GraphAdapter(model, level, session, retain=retain, graph_every=graph_every)
    if graph_every != 1:
        raise ValueError("graph_every samples MindSpore's GRAPH-mode kernel dump; in PyNative mode every step "
                         "is captured (use Debugger(capture=False) and dbg.capture(...) to pick steps)")
    return PyNativeAdapter(model, level, session, retain=retain, retain_copy=retain_copy)


def note_train_loss(adapter: Any, run_context: Any) -> None:
    """The loss ``Model.train``'s step returned is the monitor's ``Run.loss`` (below ``dbg.record_loss``)."""
    note = getattr(adapter, "note_loss", None)  # GRAPH mode's capture keeps no monitor
    loss = train_loss(getattr(run_context.original_args(), "net_outputs", None)) if note else None
    if loss is not None:
        note(loss, 1)


class StepCallback(Callback):
    """``mindspore.train.Model`` callback: every training step is one debugger step.

    Like MindInsight's debugger it needs ``dataset_sink_mode=False`` (with sink mode a whole epoch
    runs on the device as one call and no step boundary is visible); it raises a ``ValueError`` at
    ``on_train_begin`` otherwise. (On CPU MindSpore itself turns sink mode off.)

    >>> # model.train(2, dataset, callbacks=[StepCallback(dbg)], dataset_sink_mode=False)
    """

    def __init__(self, debugger: Any) -> None:
        super().__init__()
        self.debugger = debugger

    def on_train_begin(self, run_context: Any) -> None:
        params = run_context.original_args()
        if params.get("dataset_sink_mode", False):
            raise ValueError(
                "nbdebug needs Model.train(..., dataset_sink_mode=False): with dataset sink mode a whole "
                "epoch runs as one device call, so steps cannot be observed or paused (MindInsight's "
                "debugger had the same requirement)")
        adapter = self.debugger._adapter
        if adapter.auto_step:  # steps are marked here from now on
            adapter.auto_step = False

    def on_train_step_end(self, run_context: Any) -> None:
        dbg = self.debugger
        if dbg.closed:
            return
        a = dbg._adapter
        if len(dbg.session.recorder):
            note_train_loss(a, run_context)
            a.end_step()
