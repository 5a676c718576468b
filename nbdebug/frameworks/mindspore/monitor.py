"""MindSpore PyNative monitor probe: the per-step norms of ``Session.monitor`` at ``level="monitor"``.

The series and their names are PyTorch's (:mod:`nbdebug.frameworks.torch.monitor`), with MindSpore's prefix:

* per Cell (``Cell.{path}.{Class}``): ``output_norm`` and ``output_max_abs`` of its first output tensor at its
  **first call of the step** (floating-point outputs only), and ``grad_input_norm``, the gradient backward hands
  that output (``Tensor.register_hook``, only while MindSpore records a gradient: ``value_and_grad``,
  ``TrainOneStepCell``);
* per parameter (``Parameter.{name}``), around ``optimizer(grads)`` — any ``mindspore.nn.Optimizer`` holding the
  model's parameters: ``weight_norm`` (the weight the step started from), ``grad_norm`` (the gradient handed to
  the optimizer), ``update_norm`` (``|Δw|``: a copy of each weight taken before the call, subtracted after it),
  and the optimizer's state: ``exp_avg_norm`` / ``exp_avg_sq_norm`` (``nn.Adam``'s ``moment1``/``moment2``,
  ``nn.AdamWeightDecay``'s ``moments1``/``moments2``), ``momentum_norm`` (``nn.Momentum``'s ``moments``);
* ``Run``: ``loss`` — the value given to ``Debugger.record_loss``, else the model's own output when it is a
  single value (``nn.WithLossCell``, a network returning its loss); ``grad_norm_total`` (2-norm of the
  gradients).

Nothing is read on the hot path (MindSpore runs PyNative ops asynchronously; even a result's ``dtype`` waits for
its queue): tensors are queued in a :class:`~nbdebug.frameworks.mindspore.stats.StatsBuffer` and reduced at a
flush — before the optimizer updates in place, and at the step end — one wait each; on CPU with the native
kernel. A step without an optimizer call has Cell and loss series only. At L0, L1 and mix the other series come
from the statistics tables and :class:`LossMonitor` records ``Run.loss`` alone (the same two sources).

>>> import mindspore as ms, numpy as np
>>> from mindspore import nn
>>> from nbdebug.session.session import Session
>>> from nbdebug.frameworks.mindspore.pynative import PyNativeAdapter
>>> ms.set_context(mode=ms.PYNATIVE_MODE)
>>> net = nn.SequentialCell(nn.Dense(3, 2)); opt = nn.SGD(net.trainable_params(), 0.5)
>>> s = Session(framework="mindspore"); a = PyNativeAdapter(net, "monitor", s)
>>> grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)
>>> loss, grads = grad_fn(ms.Tensor(np.ones((1, 3), np.float32)))
>>> _ = opt(grads)
>>> round(s.monitor.value(0, "Parameter.0.bias", "update_norm"), 6)  # lr × |grad| = 0.5 × √2
0.707107
>>> sorted(s.monitor.fields("Cell.0.Dense"))
['grad_input_norm', 'output_max_abs', 'output_norm']
>>> a.close()
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...session.handle import Handles
from ...session.monitor import RUN, Key
from ..core.monitoring import KeyColumns, total_norm
from .ops import TensorBase
from .stats import StatsBuffer

#: optimizer attribute holding a per-parameter state (a ``ParameterTuple`` in ``opt.parameters``' order) -> field
MOMENTS = (("moment1", "exp_avg_norm"), ("moments1", "exp_avg_norm"), ("moment2", "exp_avg_sq_norm"),
           ("moments2", "exp_avg_sq_norm"), ("moments", "momentum_norm"))
_NORM, _MAX, _MIN, _SUM = 4, 0, 1, 2  # raw row columns (see stats.py)


def _first_tensor(output: Any) -> Any:
    if isinstance(output, TensorBase):
        return output
    if isinstance(output, (tuple, list)):
        for o in output:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def _floating(meta: tuple) -> bool:
    return meta[3] is None and meta[2] > 0 and ("float" in meta[0])


class MindSporeMonitor(KeyColumns):
    """The monitor probe of one attached Cell (see the module docstring)."""

    def __init__(self, adapter: Any, model: Any, grad_recording: Any) -> None:
        self.adapter = adapter
        KeyColumns.__init__(self)
        self._grad_recording = grad_recording
        self._new_step()
        self._gen = 0  # step generation: gradient hooks of an earlier step's outputs do nothing
        self.closed = False
        self._loss_col = self.col((RUN, "loss"))
        self._total_col = self.col((RUN, "grad_norm_total"))
        self._handles = Handles()
        for path, cell in model.cells_and_names():
            if path:
                self._handles.add(cell.register_forward_hook(self._cell_hook(f"Cell.{path}.{type(cell).__name__}")))
        self._handles.add(model.register_forward_hook(self._root_hook))
        self._params: dict[int, tuple[list[Any], list[str]]] = {}  # id(optimizer) -> its parameters, names
        self._old: list[tuple[Any, int]] = []  # weight copies before optimizer(grads), update column

    def _new_step(self) -> None:
        self._buf = StatsBuffer()
        self._rows: list[tuple[int, int, int]] = []  # (buffer row, norm column, max |x| column or -1)
        self._loss: tuple[int, Any] | None = None  # (priority, buffer row or float)
        self._seen: set[int] = set()
        self._grad_cols: list[int] = []

    def close(self) -> None:
        self.closed = True
        self._handles.remove_all()
        self._old = []

    # -- forward and backward -----------------------------------------------------------------------
    def _active(self) -> bool:
        a = self.adapter
        if self.closed or not a.capturing or a.busy:
            return False
        a.session.recorder.active = True
        return True

    def _cell_hook(self, name: str) -> Any:
        c_norm, c_max, c_grad = (self.col((name, f)) for f in ("output_norm", "output_max_abs", "grad_input_norm"))

        def grad_hook(grad: Any, gen: int) -> None:
            if gen == self._gen and not self.closed and isinstance(grad, TensorBase):
                self._rows.append((self._buf.add(grad), c_grad, -1))

        def hook(cell: Any, args: Any, output: Any) -> None:
            if id(cell) in self._seen or not self._active():
                return
            self._seen.add(id(cell))
            t = _first_tensor(output)
            if t is None:
                return
            self._rows.append((self._buf.add(t), c_norm, c_max))
            if self._grad_recording():
                gen = self._gen
                t.register_hook(lambda g: grad_hook(g, gen))

        return hook

    def _root_hook(self, cell: Any, args: Any, output: Any) -> None:
        if self._active() and isinstance(output, TensorBase) and (self._loss is None or self._loss[0] == 0):
            self._loss = (0, self._buf.add(output))  # the loss if a single floating-point value (at collect)

    def note_loss(self, loss: Any, priority: int = 2) -> None:
        """The step's loss (the last one of the highest priority; 2: ``Debugger.record_loss``)."""
        if isinstance(loss, TensorBase):
            if int(loss.size) != 1:
                raise ValueError(f"the loss must be a single value, got a tensor of shape {tuple(loss.shape)}")
            value: Any = self._buf.add(loss)
        else:
            value = float(loss)
        if self._loss is None or priority >= self._loss[0]:
            self._loss = (priority, value)

    def note_value(self, field: str, value: Any) -> None:  # loss scale: no MindSpore loss scaler is tracked
        pass

    # -- optimizer ----------------------------------------------------------------------------------
    def _names(self, opt: Any, params: list[Any]) -> list[str]:
        info = self.adapter._param_info
        return [f"Parameter.{info[id(p)][1]}" if id(p) in info else "" for p in params]

    def optimizer_pre(self, opt: Any, grads: Any) -> None:
        """Before ``optimizer(grads)``: weight and gradient norms queued and reduced, the weights copied."""
        if self.closed or not self.adapter.capturing:
            return
        self.adapter.session.recorder.active = True
        params = list(getattr(opt, "parameters", ()) or ())
        entry = self._params.get(id(opt))
        if entry is None or len(entry[0]) != len(params) or \
                any(a is not b for a, b in zip(entry[0], params, strict=True)):
            entry = self._params[id(opt)] = (params, self._names(opt, params))
        names = entry[1]
        grads = list(grads) if isinstance(grads, (tuple, list)) else []
        self._old = []
        for i, (p, name) in enumerate(zip(params, names, strict=True)):
            if not name:
                continue
            self._rows.append((self._buf.add(p), self.col((name, "weight_norm")), -1))
            if i < len(grads) and isinstance(grads[i], TensorBase):
                gc = self.col((name, "grad_norm"))
                self._rows.append((self._buf.add(grads[i]), gc, -1))
                self._grad_cols.append(gc)
            self._old.append((p.copy(), self.col((name, "update_norm"))))
        self._buf.flush()  # the weights are updated in place from here on

    def optimizer_post(self, opt: Any) -> None:
        """After ``optimizer(grads)``: update norms (from the copies) and the optimizer's moment norms."""
        entry = self._params.get(id(opt))
        if entry is None or self.closed or not self._old:
            self._old = []
            return
        params, names = entry
        by_name = {n: p for p, n in zip(params, names, strict=True) if n}
        for (old, col), name in zip(self._old, [n for n in names if n], strict=True):
            self._rows.append((self._buf.add(old - by_name[name]), col, -1))
        self._old = []
        for attr, field in MOMENTS:
            state = getattr(opt, attr, None)
            if state is None or len(state) != len(params):
                continue
            for t, name in zip(state, names, strict=True):
                if name and isinstance(t, TensorBase):
                    self._rows.append((self._buf.add(t), self.col((name, field)), -1))
        self._buf.flush()  # the moments change in place at the next call

    # -- step end -----------------------------------------------------------------------------------
    def collect(self) -> tuple[list[Key], np.ndarray]:
        """The step's values (NaN where absent) under :attr:`keys`; one wait for MindSpore's queue."""
        raw = self._buf.raw()
        meta = self._buf.meta
        out = np.full(len(self.keys), np.nan)
        has = np.zeros(len(self.keys), bool)  # what was measured this step (a NaN there is the model's)
        for row, c_norm, c_max in self._rows:
            if _floating(meta[row]):
                out[c_norm] = np.sqrt(raw[row, _NORM])
                has[c_norm] = True
                if c_max >= 0:
                    out[c_max] = max(abs(raw[row, _MAX]), abs(raw[row, _MIN]))
                    has[c_max] = True
        if self._loss is not None:
            value = self._loss[1]
            if isinstance(value, float):
                out[self._loss_col] = value
                has[self._loss_col] = True
            elif meta[value][2] == 1 and _floating(meta[value]):
                out[self._loss_col] = raw[value, _SUM]
                has[self._loss_col] = True
        if self._grad_cols:
            out[self._total_col] = total_norm(out[np.asarray(self._grad_cols, dtype=np.intp)])
            has[self._total_col] = True
        #: the columns of :attr:`keys` measured by the last :meth:`collect`
        self.present = has
        self._new_step()
        self._gen += 1
        return self.keys, out


def train_loss(net_outputs: Any) -> Any:
    """The loss in what ``Model.train``'s train network returned (``cb_params.net_outputs``): the single value
    itself, or the first of a tuple (``TrainOneStepWithLossScaleCell``: loss, overflow, scale); else None."""
    if isinstance(net_outputs, (tuple, list)) and net_outputs:
        net_outputs = net_outputs[0]
    if isinstance(net_outputs, TensorBase) and int(net_outputs.size) == 1:
        return net_outputs
    return None


class LossMonitor(MindSporeMonitor):
    """The probe at L0, L1 and mix: only ``Run.loss`` (``Debugger.record_loss``, else the attached Cell's
    single-value output, e.g. an ``nn.WithLossCell``); the other series come from the statistics tables."""

    def __init__(self, adapter: Any, model: Any, grad_recording: Any) -> None:
        self.adapter = adapter
        KeyColumns.__init__(self)
        self._grad_recording = grad_recording
        self._new_step()
        self._gen = 0
        self.closed = False
        self._loss_col = self.col((RUN, "loss"))
        self._total_col = -1  # no gradient norms measured here (_grad_cols stays empty)
        self._handles = Handles()
        self._handles.add(model.register_forward_hook(self._root_hook))
        self._params = {}
        self._old = []

    def optimizer_pre(self, opt: Any, grads: Any) -> None:
        pass

    def optimizer_post(self, opt: Any) -> None:
        pass
