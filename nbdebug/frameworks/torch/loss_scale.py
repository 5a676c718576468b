"""Reading ``torch.amp.GradScaler``'s scale and overflow once per step.

:class:`GradScalerProbe` wraps the scaler's ``update()`` and ``scale()`` (instance attributes; :meth:`close`
removes them; ``scale()`` only hands the unscaled loss to :attr:`GradScalerProbe.on_scale`).
Just before the real update it reads the scale the step ran with and the ``found_inf`` flags that
``scaler.step()`` recorded per optimizer and device, and hands both to a
:class:`~nbdebug.watch.loss_scale.LossScaleTracker` — one device→host transfer per step, nothing per
tensor. When no ``found_inf`` was recorded (``update(new_scale)`` without ``step``), overflow is read as
"the scale went down".

>>> import torch
>>> model = torch.nn.Linear(2, 1); opt = torch.optim.SGD(model.parameters(), lr=0.1)
>>> scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
>>> probe = GradScalerProbe(scaler)
>>> scaler.scale(model(torch.ones(1, 2)).sum()).backward(); scaler.step(opt); scaler.update()
>>> probe.tracker.history()
[LossScaleRecord(step=0, scale=8.0, overflow=False)]
>>> probe.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...watch.loss_scale import LossScaleTracker

_OWN_OPS = torch._C.DisableTorchFunction  # nbdebug's own reads of the scale: never recorded as the model's ops


class GradScalerProbe:
    """Records ``(scale, overflow)`` of every ``scaler.update()`` into ``tracker``.

    ``step()`` (optional) returns the step index to record under (e.g. a Debugger's ``step_index``);
    ``on_update(record)`` (optional) runs after each recorded update — e.g. to end a Debugger step, since
    an overflowing step skips ``optimizer.step()``.
    """

    def __init__(self, scaler: Any, tracker: LossScaleTracker | None = None,
                 step: Callable[[], int] | None = None, on_update: Callable[[Any], Any] | None = None) -> None:
        if not hasattr(scaler, "update") or not hasattr(scaler, "_per_optimizer_states"):
            raise TypeError(f"expected a torch.amp.GradScaler, got {type(scaler).__name__}")
        if "update" in scaler.__dict__:
            raise RuntimeError("this GradScaler's update() is already wrapped (another probe?); close that first")
        self.scaler = scaler
        self.tracker = tracker if tracker is not None else LossScaleTracker()
        self._step = step
        self._on_update = on_update
        self._update = scaler.update  # the bound class method
        scaler.update = self._wrapped  # instance attribute shadows the method; close() deletes it
        #: called as ``on_scale(loss, scale)`` at each ``scaler.scale(loss)`` of a single-value loss: the loss
        #: as computed (unscaled) and a copy of the scale it is multiplied by, both on the device (the
        #: monitor's ``Run.loss`` and ``Run.loss_scale``; no host read here)
        self.on_scale: Callable[[Any, Any], Any] | None = None
        self._scale = scaler.scale
        scaler.scale = self._scaled

    def _scaled(self, outputs: Any) -> Any:
        out = self._scale(outputs)
        sc = self.scaler
        if self.on_scale is not None and isinstance(outputs, torch.Tensor) and outputs.numel() == 1 and \
                sc.is_enabled() and getattr(sc, "_scale", None) is not None:
            with torch.no_grad(), _OWN_OPS():  # our copy is no op of the model's (L1's op mode records none)
                self.on_scale(outputs, sc._scale.detach().reshape(()).clone())  # update() changes it in place
        return out

    def _wrapped(self, new_scale: Any = None) -> None:
        sc = self.scaler
        if not sc.is_enabled() or getattr(sc, "_scale", None) is None:
            return self._update(new_scale)
        with _OWN_OPS():
            before = sc._scale.detach().reshape(()).to(torch.float32).clone()
            found = [f for st in sc._per_optimizer_states.values()
                     for f in st.get("found_inf_per_device", {}).values()]
            found_total = torch.stack([f.to(before.device, torch.float32).reshape(()) for f in found]).sum() \
                if found else None
        self._update(new_scale)  # the scaler's own ops: recorded as the training's
        with _OWN_OPS():
            after = sc._scale.detach().reshape(()).to(torch.float32)
            parts = [before, after] + ([found_total] if found_total is not None else [])
            vals = torch.stack(parts).tolist()  # the one host sync of the step
        overflow = vals[2] > 0 if found_total is not None else vals[1] < vals[0]
        rec = self.tracker.record(vals[0], overflow, step=self._step() if self._step is not None else None)
        if self._on_update is not None:
            self._on_update(rec)
        return None

    def close(self) -> None:
        """Restore the scaler's own ``update`` and ``scale``."""
        if self.scaler.__dict__.get("update") == self._wrapped:
            del self.scaler.__dict__["update"]
        if self.scaler.__dict__.get("scale") == self._scaled:
            del self.scaler.__dict__["scale"]

    def __enter__(self) -> GradScalerProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
