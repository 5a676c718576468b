"""PyTorch monitor probe: the per-step norms of ``Session.monitor``, no host sync per tensor.

What it measures, as 0-d tensors on the values' devices, moved to the host once per step (:meth:`collect`):

* per module (``Module.{path}.{Class}``; at levels ``monitor`` and ``L1``, which record no module calls —
  ``L0``/``mix`` read the same values off their statistics, see :mod:`~nbdebug.frameworks.core.monitoring`):
  ``output_norm`` and ``output_max_abs`` of its first output tensor at its **first call of the step** made
  with gradients enabled (an eval pass under ``no_grad``/``inference_mode`` between steps, recorded into the
  next step, stands in only when the step has no such call), and ``grad_input_norm``, the gradient autograd
  hands that output in backward (msProbe's backward ``input.0``; a tensor hook only where the output needs a
  gradient). Forward hooks only, no pre-hooks.
* per parameter (``Parameter.{name}``), around the model's optimizer's ``step()``: ``grad_norm`` (the
  gradient the optimizer uses: unscaled by a GradScaler), ``weight_norm`` (the weight the step started
  from; at ``L0``/``L1``/``mix`` the ``Parameter`` node's statistics give it, and the probe measures only a
  parameter the step did not use — XLNet's ``seg_embed`` without token types — which has no such node),
  ``update_norm`` (``|Δw|``: the weights are copied into buffers kept from step to step before ``step()``,
  subtracted after it, one ``_foreach`` pass each), and the optimizer's state: ``exp_avg_norm``,
  ``exp_avg_sq_norm`` (Adam, AdamW …), ``momentum_norm`` (SGD's ``momentum_buffer``). A step without an
  optimizer step (an overflow skipped by a GradScaler, manual updates) gets weight and gradient norms at its end.
* ``Run``: ``loss`` — the value given to :meth:`note_loss` (``Debugger.record_loss``), else the loss given
  to ``GradScaler.scale()`` (unscaled: the loss as computed) under ``track_loss_scale``, else the model's
  own loss (a ``loss`` field of its output, or a scalar output), the last one of the step;
  ``grad_norm_total`` (the 2-norm of all gradients, as ``clip_grad_norm_`` computes it); ``loss_scale``
  (under ``track_loss_scale``: the scale ``scaler.scale(loss)`` multiplied the step's loss by).

>>> import torch
>>> from nbdebug.session.session import Session
>>> from nbdebug.frameworks.torch.adapter import TorchAdapter
>>> model = torch.nn.Sequential(torch.nn.Linear(3, 2)); opt = torch.optim.SGD(model.parameters(), lr=0.5)
>>> s = Session(framework="pytorch")
>>> a = TorchAdapter(model, "monitor", s)
>>> model(torch.ones(1, 3)).sum().backward(); opt.step()
>>> round(s.monitor.value(0, "Parameter.0.bias", "update_norm"), 6)  # lr × |grad| = 0.5 × √2
0.707107
>>> sorted(s.monitor.fields("Module.0.Linear"))
['grad_input_norm', 'output_max_abs', 'output_norm']
>>> a.close()
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ...session.handle import Handles
from ...session.monitor import RUN, Key
from ..core.monitoring import KeyColumns, total_norm
from ..core.native import fastats as _fastats
from .stats import StatsBuffer, local_shard

_HALF = (torch.float16, torch.bfloat16)
_norm = torch.linalg.vector_norm
#: a float32 norm below this may have lost squares that underflowed (|x| < 2⁻⁶³): it is taken again in float64
_TINY = 2.0 ** -30
_NO_TORCH_FUNCTION = torch._C.DisableTorchFunction  # an op mode (L1) must not record the probe's ops
_MOMENTS = (("exp_avg", "exp_avg_norm"), ("exp_avg_sq", "exp_avg_sq_norm"), ("momentum_buffer", "momentum_norm"))
#: dtypes the one-pass native update kernel reads (``_fastats.update_norms``)
_NATIVE_UPDATE = {} if _fastats is None else {torch.float32: _fastats.FLOAT32, torch.float64: _fastats.FLOAT64}


def first_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor of a module's output (a tensor, tuple/list, dict or ``ModelOutput``), or None."""
    if isinstance(output, torch.Tensor):
        return output
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for o in items:
        t = first_tensor(o)
        if t is not None:
            return t
    return None


def model_loss(output: Any) -> torch.Tensor | None:
    """The loss a model returns: its output's ``loss`` (HF ``ModelOutput``, a dict), or a scalar output."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor):
        loss = output if isinstance(output, torch.Tensor) and output.numel() == 1 else None
    return loss if loss is not None and loss.is_floating_point() else None


class _OptimizerSlots:
    """One optimizer's parameters with their monitor columns and the buffers the update is measured in."""

    def __init__(self, probe: TorchMonitor, params: list[tuple[str, torch.Tensor]]) -> None:
        self.params = [p for _, p in params]
        self.ids = [id(p) for p in self.params]
        #: the data each weight holds on this rank: itself, a DTensor's local shard (FSDP2)
        self.local = [local_shard(p) for p in self.params]
        names = [f"Parameter.{q}" for q, _ in params]
        self.weight = [probe.col((n, "weight_norm")) for n in names]
        self.grad = [probe.col((n, "grad_norm")) for n in names]
        self.update = [probe.col((n, "update_norm")) for n in names]
        #: (optimizer state key, parameter index) -> column, made when the optimizer has that state
        self.moments: dict[tuple[str, int], int] = {}
        self.names = names
        self.bufs: list[torch.Tensor] | None = None  # allocated at the first step (weights' layout)
        self.copied = False
        #: per parameter: the native kernel's dtype code (a dense CPU float32/float64 weight), else None
        self.native: list[int | None] = []
        #: parameter index -> (version, address, |w|²) of the weights the native kernel left in its buffer
        #: after the last step: while the weight is untouched, the buffer needs no new copy and |w| is known
        self.after: dict[int, tuple[int, int, float]] = {}

    def allocate(self) -> None:
        """The buffers the weights are copied into before a step (a sparse weight is its own: not measured)."""
        self.bufs = [torch.empty_like(p) if p.layout is torch.strided else p for p in self.local]
        self.native = [_NATIVE_UPDATE.get(p.dtype) if p.device.type == "cpu" and p.layout is torch.strided
                       and p.is_contiguous() and b.is_contiguous() and p.numel() else None  # (an empty shard)
                       for p, b in zip(self.local, self.bufs, strict=True)]

    def kept(self) -> list[bool]:
        """Per parameter: its buffer still holds its current weights (left by the native kernel, untouched
        since: same version counter and storage)."""
        after = self.after
        return [(a := after.get(i)) is not None and a[0] == p._version and a[1] == p.data_ptr()
                for i, p in enumerate(self.local)]


class TorchMonitor(KeyColumns):
    """The monitor probe of one attached model (see the module docstring)."""

    def __init__(self, adapter: Any, model: torch.nn.Module, *, modules: bool, weights: bool,
                 wrap: Callable[[Callable], Callable]) -> None:
        self.adapter = adapter
        self.weights = weights  # measure weight norms (False where the statistics give them)
        KeyColumns.__init__(self)
        self._idx: list[int] = []  # column of each queued value
        self._vals: list[torch.Tensor] = []  # 0-d tensors, on their devices
        #: module outputs and their gradients: one raw statistics row each (on CPU the one-pass C kernel
        #: gives the 2-norm and max |x| together), with the columns of its norm and max |x| (-1: none)
        self._buf = StatsBuffer()
        self._rows: list[tuple[int, int, int]] = []
        self._run: dict[int, torch.Tensor] = {}  # run-wide values by column (the loss scale)
        self._host: list[tuple[int, float]] = []  # values already on the host (the native update kernel's)
        self._loss: tuple[int, torch.Tensor] | None = None  # (priority, loss)
        self._seen: set[int] = set()  # modules measured this step
        #: modules measured this step only by calls without gradients (an eval pass): their row's index
        self._tentative: dict[int, int] = {}
        self._gen = 0  # step generation: gradient hooks of an earlier step's outputs do nothing
        self._opts: dict[int, _OptimizerSlots] = {}
        self._opt_ran = False
        self._grad_cols: list[int] = []  # grad_norm columns queued this step
        self.closed = False
        self._handles = Handles()
        self._loss_col = self.col((RUN, "loss"))
        self._total_col = self.col((RUN, "grad_norm_total"))
        for path, mod in model.named_modules():
            if modules and path:
                hook = self._module_hook(f"Module.{path}.{type(mod).__name__}")
                self._handles.add(mod.register_forward_hook(wrap(hook)))
        self._handles.add(model.register_forward_hook(wrap(self._root_hook)))

    def close(self) -> None:
        self.closed = True
        self._handles.remove_all()
        self._opts.clear()

    # -- forward and backward -----------------------------------------------------------------------
    def _active(self) -> bool:
        a = self.adapter
        if self.closed or not a.capturing or a.busy:
            return False
        a.session.recorder.active = True
        return True

    def _module_hook(self, name: str) -> Callable:
        c_norm, c_max, c_grad = (self.col((name, f)) for f in ("output_norm", "output_max_abs", "grad_input_norm"))
        rows, seen, tentative, adapter = self._rows, self._seen, self._tentative, self.adapter
        guard = adapter.level.ops and not adapter.level.modules  # ops alone (L1): must not record the probe's ops

        def grad_hook(grad: torch.Tensor, gen: int) -> None:
            if gen == self._gen and not self.closed and grad is not None:
                with _NO_TORCH_FUNCTION():
                    rows.append((self._buf.add(grad.detach())[0], c_grad, -1))

        def hook(mod: torch.nn.Module, args: tuple, output: Any) -> None:
            key = id(mod)
            if key in seen or self.closed or not adapter.capturing or adapter.busy:
                return
            grad = torch.is_grad_enabled()  # else an eval pass (no_grad / inference_mode): stands in until
            if not grad and key in tentative:  # the step's first call with gradients replaces it
                return
            adapter.session.recorder.active = True
            if grad:
                seen.add(key)
            t = output if type(output) is torch.Tensor else first_tensor(output)
            # the probe's own tensor calls (metadata, detach, the hook) would each pass through an op mode
            with _NO_TORCH_FUNCTION():
                if t is None or not t.is_floating_point() or t.layout is not torch.strided or not t.numel():
                    return
                if guard:
                    adapter.busy = True
                try:
                    row = (self._buf.add(t.detach())[0], c_norm, c_max)
                    at = tentative.pop(key, None)
                    if at is not None and grad:
                        rows[at] = row
                    else:
                        if not grad:
                            tentative[key] = len(rows)
                        rows.append(row)
                    if t.requires_grad and t.grad_fn is not None:  # never a hook on a leaf (a parameter)
                        t.register_hook(functools.partial(grad_hook, gen=self._gen))  # one frame in backward
                finally:
                    if guard:
                        adapter.busy = False

        return hook

    def _root_hook(self, mod: torch.nn.Module, args: tuple, output: Any) -> None:
        if not self._active():
            return
        loss = model_loss(output)
        if loss is not None:
            self.note_loss(loss, priority=0)

    def note_loss(self, loss: Any, priority: int = 2) -> None:
        """The step's loss (the last one of the highest priority: 2 given by the user, 1 a GradScaler's
        ``scale()`` argument, 0 the model's own output)."""
        if not isinstance(loss, torch.Tensor):
            loss = torch.as_tensor(float(loss))
        if loss.numel() != 1:
            raise ValueError(f"the loss must be a single value, got a tensor of shape {tuple(loss.shape)}")
        if self._loss is None or priority >= self._loss[0]:
            with _NO_TORCH_FUNCTION():
                self._loss = (priority, loss.detach().reshape(()))

    def note_value(self, field: str, value: torch.Tensor) -> None:
        """A run-wide value of the step (``loss_scale``): a single-value tensor (the last one counts)."""
        col = self.col((RUN, field))
        self._run[col] = value

    # -- optimizer ----------------------------------------------------------------------------------
    def _slots(self, opt: Any, params: list[tuple[str, torch.Tensor]]) -> _OptimizerSlots:
        slots = self._opts.get(id(opt))
        if slots is None or slots.ids != [id(p) for _, p in params]:
            slots = self._opts[id(opt)] = _OptimizerSlots(self, params)
        return slots

    def optimizer_pre(self, opt: Any, params: list[tuple[str, torch.Tensor]]) -> None:
        """Before ``opt.step()``: weight and gradient norms, the weights copied for the update."""
        if self.closed or not self.adapter.capturing:
            return
        self.adapter.session.recorder.active = True
        slots = self._slots(opt, params)
        with torch.no_grad(), _NO_TORCH_FUNCTION():
            if slots.bufs is None:
                slots.allocate()
            for i, k in enumerate(slots.kept()):  # copy the weights a buffer does not hold yet
                if not k and slots.native[i] is not None:  # |w|² as the post-step pass sums it: same bits
                    p = slots.local[i]
                    slots.after[i] = (p._version, p.data_ptr(),
                                      _fastats.update_norms(slots.bufs[i].data_ptr(), p.data_ptr(), p.numel(),
                                                            slots.native[i])[1])
            other = [i for i, code in enumerate(slots.native) if code is None]
            rest = [i for i in other if slots.bufs[i] is not slots.local[i]]  # a sparse weight is its own buffer
            if self.weights:  # |w| of a native weight: its kernel's, summed as the weight left the last step
                self._queue([slots.params[i] for i in other], [slots.weight[i] for i in other])
                self._host.extend((slots.weight[i], math.sqrt(a[2])) for i, a in slots.after.items())
            else:  # the statistics give |w| of the weights the step used (a Parameter node); not of the others
                seen = getattr(self.adapter, "_param_seen", None)
                unused = [] if seen is None else [i for i, p in enumerate(slots.params) if id(p) not in seen]
                self._queue([slots.params[i] for i in unused], [slots.weight[i] for i in unused])
            self._measure(slots.params, slots.weight, slots.grad, weights=False)
            if rest:
                torch._foreach_copy_([slots.bufs[i] for i in rest], [slots.local[i] for i in rest])
            slots.copied = True
        self._opt_ran = True

    def _measure(self, params: list[torch.Tensor], wcols: list[int], gcols: list[int], weights: bool = True) -> None:
        if weights and self.weights:
            self._queue(params, wcols)
        grads, cols = [], []
        for p, c in zip(params, gcols, strict=True):
            g = p.grad
            if g is not None and g.layout is torch.strided:
                grads.append(g)
                cols.append(c)
        self._queue(grads, cols)
        self._grad_cols.extend(cols)

    def _queue(self, tensors: list[torch.Tensor], cols: list[int]) -> None:
        if not tensors:
            return
        tensors = [local_shard(t) for t in tensors]  # a DTensor's (FSDP2): the rank's shard, no collective
        self._vals.extend(_norms(tensors))
        self._idx.extend(cols)

    def optimizer_post(self, opt: Any, params: list[tuple[str, torch.Tensor]]) -> None:
        """After ``opt.step()``: update norms (from the copies) and the optimizer's moment norms."""
        slots = self._opts.get(id(opt))
        if slots is None or not slots.copied or self.closed:
            return
        slots.copied = False
        with torch.no_grad(), _NO_TORCH_FUNCTION():
            self._updates(slots)
            state, cols = opt.state, slots.moments
            for key, field in _MOMENTS:
                found, fcols = [], []
                for i, p in enumerate(slots.params):
                    st = state.get(p)
                    t = st.get(key) if st else None
                    if isinstance(t, torch.Tensor) and t.layout is torch.strided:
                        c = cols.get((key, i))
                        if c is None:
                            c = cols[(key, i)] = self.col((slots.names[i], field))
                        found.append(t)
                        fcols.append(c)
                self._queue(found, fcols)

    def _updates(self, slots: _OptimizerSlots) -> None:
        """``update_norm`` per parameter: one native pass per dense CPU weight (|Δw| and |w| read, the buffer
        left holding w for the next step), ``_foreach`` passes for the others (the buffer then holds -Δw)."""
        rest = []
        for i, (b, p, code) in enumerate(zip(slots.bufs, slots.local, slots.native, strict=True)):
            if b is p:
                continue
            if code is None:
                rest.append(i)
                continue
            dd, ww = _fastats.update_norms(b.data_ptr(), p.data_ptr(), p.numel(), code)
            self._host.append((slots.update[i], math.sqrt(dd)))
            slots.after[i] = (p._version, p.data_ptr(), ww)
        if rest:
            bufs = [slots.bufs[i] for i in rest]
            torch._foreach_sub_(bufs, [slots.local[i] for i in rest])
            self._queue(bufs, [slots.update[i] for i in rest])

    # -- step end -----------------------------------------------------------------------------------
    def collect(self) -> tuple[list[Key], np.ndarray]:
        """The step's values (NaN where absent) under :attr:`keys`; one host transfer per device."""
        if not self._opt_ran and self.adapter.session.recorder is not None:
            self._unstepped()
        if self._loss is not None:
            self._vals.append(self._loss[1])
            self._idx.append(self._loss_col)
        for c, v in self._run.items():
            self._vals.append(v)
            self._idx.append(c)
        out = np.full(len(self.keys), np.nan)
        has = np.zeros(len(self.keys), bool)  # what was measured this step (a NaN there is the model's)
        if self._rows:
            self._module_values(out, has)
        if self._vals:
            idx = np.asarray(self._idx, dtype=np.intp)
            with _NO_TORCH_FUNCTION():
                out[idx] = _to_host(self._vals)
            has[idx] = True
        if self._host:
            hidx = np.asarray([c for c, _ in self._host], dtype=np.intp)
            out[hidx] = [v for _, v in self._host]
            has[hidx] = True
        if self._grad_cols:
            out[self._total_col] = total_norm(out[np.asarray(self._grad_cols, dtype=np.intp)])
            has[self._total_col] = True
        #: the columns of :attr:`keys` measured by the last :meth:`collect`
        self.present = has
        self._vals.clear()
        self._idx.clear()
        self._run.clear()
        self._host.clear()
        self._seen.clear()
        self._tentative.clear()
        self._grad_cols.clear()
        self._rows.clear()
        self._buf = StatsBuffer()
        self._loss = None
        self._opt_ran = False
        self._gen += 1
        return self.keys, out

    def _module_values(self, out: np.ndarray, has: np.ndarray) -> None:
        with _NO_TORCH_FUNCTION():
            raw = self._buf.raw()
        r = np.asarray(self._rows, dtype=np.intp)
        with np.errstate(invalid="ignore"):
            out[r[:, 1]] = np.sqrt(raw[r[:, 0], 4])
        has[r[:, 1]] = True
        m = r[r[:, 2] >= 0]
        out[m[:, 2]] = np.maximum(np.abs(raw[m[:, 0], 0]), np.abs(raw[m[:, 0], 1]))
        has[m[:, 2]] = True

    def _unstepped(self) -> None:
        """A step that ran no optimizer step of the model: weight and gradient norms as they are now."""
        if not self._opts or self.closed:
            params = [(info[1], p) for info in self.adapter._param_info.values()
                      if (p := info[0]()) is not None and p.requires_grad]
            if not params or not any(p.grad is not None for _, p in params):
                return
            slots = self._slots(None, params)
        else:
            slots = next(iter(self._opts.values()))
        with torch.no_grad(), _NO_TORCH_FUNCTION():
            self._measure(slots.params, slots.weight, slots.grad)


def _norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The 2-norms of ``tensors`` as 0-d tensors, not read to the host. Squares summed in float32 underflow
    below ~1e-19 (an Adam ``exp_avg_sq`` of 1e-23 read 0, one of 5e-23 12 % off): off the CPU every norm is
    taken in float64 (no host sync per step; the pass is memory-bound), on the CPU in float32 and the few
    below :data:`_TINY` again in float64."""
    if any(t.device.type != "cpu" for t in tensors):
        return list(torch._foreach_norm(tensors, dtype=torch.float64))
    if any(t.dtype in _HALF for t in tensors):
        norms = [_norm(t, dtype=torch.float32) for t in tensors]
    else:
        norms = list(torch._foreach_norm(tensors))
    for i in torch.nonzero(torch.stack(norms) < _TINY).flatten().tolist():
        norms[i] = _norm(tensors[i], dtype=torch.float64)
    return norms


def _to_host(vals: list[torch.Tensor]) -> np.ndarray:
    """0-d tensors as one float64 host array (one transfer per device)."""
    try:
        return torch.stack(vals).to("cpu", torch.float64).numpy()
    except RuntimeError:  # several devices
        out = np.empty(len(vals))
        by_device: dict[torch.device, list[int]] = {}
        for i, v in enumerate(vals):
            by_device.setdefault(v.device, []).append(i)
        for items in by_device.values():
            out[items] = torch.stack([vals[i].to(torch.float64) for i in items]).to("cpu").numpy()
        return out
