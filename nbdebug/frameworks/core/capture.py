"""The capture core: per-step state and step end, shared by the PyTorch and MindSpore adapters.

An adapter subclasses :class:`Capture`, passes its framework's
:class:`~nbdebug.frameworks.core.tensor_ops.TensorOps`, and calls the core from its hooks:
:meth:`~.calls.Calls.module_call` / :meth:`~.calls.Calls.module_return` around a module call,
:meth:`~.recording.Recording.slot` for an op's tensors, :meth:`~.calls.Calls.gradient` and
:meth:`~.calls.Calls.parameter_gradient` in backward, :meth:`~.calls.Calls.optimizer_step` after the
optimizer, :meth:`~.recording.Recording.emit_node` when a node completes and :meth:`end_step` at the step
boundary. What the adapter adds is framework-specific only: how to hook, gradient probes, in-place
snapshots before ops, interrupted calls, closing.

>>> from nbdebug.frameworks.core.calls import parent_scope
>>> parent_scope("encoder.layer.0")
'encoder/layer'
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from ...session.handle import Handles
from ...session.level import LEVELS, Level
from ...session.session import Session
from .calls import Calls
from .interrupts import interrupts_deferred
from .monitoring import MonitorRows
from .recording import Recording
from .records import flatteners, user_stack

#: the capture levels (:class:`~nbdebug.session.level.Level`). ``monitor``: no graph, no statistics tables,
#: no retained values — only the per-step monitor series (``Session.monitor``), which every other level
#: records too
__all__ = ["LEVELS", "Capture", "Level"]


class Capture(Recording, Calls):
    """Per-step capture state of one attached model and the step boundary."""

    framework = ""
    module_prefix = "Module"  # msProbe's prefix of module calls: "Module" (PyTorch), "Cell" (MindSpore)
    framework_dir = "/"  # frames under this path are the framework's (left out of node stacks)

    def __init__(self, ops: Any, level: str, session: Session, *, retain: bool, retain_copy: bool) -> None:
        self.level = Level(level)  # ValueError naming the levels for an unknown one
        self.ops = ops
        self.session = session
        self.capturing = True
        self.busy = False
        self.retain = retain
        self.retain_copy = retain_copy
        self.closed = False
        #: the framework hook handles (module, parameter, optimizer hooks; per-step tensor hooks)
        self.hooks = Handles()
        #: optional observer of every completed node with its tensors and call (dump writers):
        #: ``tap(node, [(slot, tensor), ...], (args, kwargs, output) or None)`` on the training thread
        self.tap: Callable[[Any, list[tuple[str, Any]], tuple | None], None] | None = None
        self.auto_step = True
        self.section = "forward"
        self.stack = functools.partial(user_stack, self.framework_dir)
        _flatten, self.outputs, self.arguments = flatteners(ops.tensor_type)
        self.version = ops.version  # the hot path's two calls into the framework, bound once
        self.measure = ops.measure
        self._scope: list[str] = []
        self._open: list[str | None] = []  # node of each module call in progress (None: not a node)
        self._lock = threading.RLock()
        #: id(parameter) -> (weak reference, qualified name, owner path, owner class)
        self._param_info: dict[int, tuple[Any, str, str, str]] = {}
        #: id(buffer) -> (weak reference, qualified name): ``Constant`` nodes
        self._buffer_info: dict[int, tuple[Any, str]] = {}
        self._module_names: dict[int, tuple[str, str]] = {}  # module key -> (node name base, parent scope)
        #: the framework's monitor probe (``collect() -> (keys, values)`` at each step end), set by the adapter
        self.monitor_probe: Any = None
        self._monitor_rows = MonitorRows(self.module_prefix, derive=self.level.records_tensors)
        #: module call node -> the module call node it ran inside (None: the top), kept across steps
        self._parents: dict[str, str | None] = {}
        #: optimizer step node -> {qual or (key, qual): its slot's names and refusal}, kept across steps
        self._opt_names: dict[str, dict[Any, tuple]] = {}
        self.new_step_state()

    def new_step_state(self) -> None:
        self.buf = self.ops.new_buffer()
        self._seen: dict[int, Any] = {}  # by id; a weak reference tells a reused id apart
        self._counts: dict[Any, int] = {}
        self._module_calls: dict[int, list[str]] = {}
        self._bwd_started: set[str] = set()
        self._done: set[str] = set()
        self._tapped: dict[str, list[tuple[str, Any]]] = {}
        self._inputs = 0
        self._param_seen: set[int] = set()
        self._opt_calls = 0
        self._pgrad_calls: dict[tuple[str, str], int] = {}
        self._pgrad_last: dict[str, tuple[str, str]] = {}
        #: id(tensor) -> (ref to it, ref to the tensor it stands for): a module's alias of its input, the
        #: result of an unrecorded call (weak both ways: nothing is kept alive for the graph's sake)
        self._alias: dict[int, tuple[Any, Any]] = {}
        #: id(tensor) -> (ref to it, producers of the other data inputs of the unrecorded call that made it)
        self._also: dict[int, tuple[Any, list[tuple[str, str]]]] = {}
        self._root_args: set[int] = set()
        self._unresolved: list[tuple[int, Any, str, int]] = []  # deferred metadata (recorder index, ...)
        self._offers: list[tuple[tuple[str, str], Any, int]] = []  # retention offered once the size is known

    # -- step boundary ----------------------------------------------------------------------------
    def raw_rows(self) -> Any:
        """The step's raw statistics rows (the session's ``raw_source``)."""
        return self.buf.raw()

    def closing_step(self) -> None:
        """Framework work at the step boundary, before the session closes the step (hook handles ...)."""

    def end_step(self) -> None:
        with interrupts_deferred(), self._lock:  # a Ctrl-C here is raised once the boundary is whole
            raw = self.raw_rows()
            self.link_backward()
            self.closing_step()
            self.reset_calls()
            table = self.session.end_step(raw)
            self.new_step_state()
            self.record_monitor(self.session.step_index - 1, table)
        self.busy = True  # observers (watchpoints, control) run framework-free code; keep hooks quiet
        try:
            self.session.emit("step", self.session.step_index - 1)
        finally:
            self.busy = False

    def record_monitor(self, step: int, table: Any) -> None:
        """The step's monitor row (probe + statistics table) into ``Session.monitor``."""
        probe = self.monitor_probe
        keys, values = probe.collect() if probe is not None else ((), ())
        present = getattr(probe, "present", None) if probe is not None else None
        row_keys, row, has = self._monitor_rows.row(table, keys, values, present)
        if len(row_keys):
            self.session.monitor.record(step, row_keys, row, has)

    def note_loss(self, loss: Any, priority: int = 2) -> None:
        """The step's loss for the monitor (see the framework's monitor probe)."""
        if self.monitor_probe is not None:
            self.monitor_probe.note_loss(loss, priority)

    def note_scaled(self, loss: Any, scale: Any) -> None:
        """A loss scaler's ``scale(loss)``: the loss as computed and the scale of the step (monitor)."""
        if self.monitor_probe is not None:
            self.monitor_probe.note_loss(loss, 1)
            self.monitor_probe.note_value("loss_scale", scale)

    def reset_calls(self) -> None:
        """No module call is in progress any more (step end, interrupted or ended thread)."""
        self._scope.clear()
        self._open.clear()
        self.section = "forward"

    def close_partial_step(self) -> bool:
        """Close a step left partial (a thread ended or a call was interrupted); False when empty."""
        if len(self.session.recorder) and not self.closed:
            self.end_step()
            return True
        self.reset_calls()
        return False

