"""``Debugger``: attach to a model, capture every step, read statistics and tensors.

>>> import torch, nbdebug
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
>>> dbg = nbdebug.Debugger(model, level="L0")
>>> model(torch.ones(2, 4)).sum().backward()
>>> dbg.step()
>>> dbg.stats("Module.0.Linear.forward.0", "output.0", step=0)["shape"]
(2, 3)
>>> dbg.close()
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from .session.graph import Graph
from .session.session import Session

_ATTACHED: dict[int, weakref.ref] = {}


def _framework_of(model: Any) -> str:
    mod = type(model).__module__ or ""
    for klass in type(model).__mro__:
        qual = f"{klass.__module__}.{klass.__qualname__}"
        if qual == "torch.nn.modules.module.Module":
            return "pytorch"
        if qual.startswith("mindspore.nn.cell.Cell"):
            return "mindspore"
    raise TypeError(
        f"nbdebug.Debugger attaches to a torch.nn.Module or a mindspore.nn.Cell, got {type(model).__name__}"
        f" (from module {mod or '?'})")


class Debugger:
    """A live debugging session on one model.

    Parameters
    ----------
    model: the ``torch.nn.Module`` to watch.
    level: ``"L0"`` (module calls), ``"L1"`` (every op) or ``"mix"`` (both).
    capture: start capturing at once (``dbg.capture = False`` pauses capture; hooks stay attached).
    memory_budget: bytes of tensor values kept for the current and previous step (default 512 MiB).
    retain: keep tensor values at all (statistics are always kept).
    """

    def __init__(self, model: Any, level: str = "L0", *, capture: bool = True,
                 memory_budget: int = 512 * 2**20, retain: bool = True, retain_copy: bool = False) -> None:
        framework = _framework_of(model)
        prev = _ATTACHED.get(id(model))
        if prev is not None and prev() is not None and not prev().closed:
            raise RuntimeError(
                f"a Debugger is already attached to this {type(model).__name__}; call close() on it first")
        self.level = level
        self.closed = False
        if framework == "pytorch":
            import torch

            from .frameworks.torch_adapter import LEVELS, TorchAdapter

            if level not in LEVELS:
                raise ValueError(f"unknown level {level!r}; choose one of {', '.join(LEVELS)}")
            device = "cpu"
            for p in model.parameters():
                device = str(p.device)
                break
            self.session = Session(framework="pytorch", framework_version=torch.__version__, device=device,
                                   memory_budget=memory_budget)
            self._adapter = TorchAdapter(model, level, self.session, retain=retain, retain_copy=retain_copy)
        else:  # pragma: no cover - MindSpore support lands with its own issue
            raise NotImplementedError("MindSpore models are not supported yet")
        self._adapter.capturing = capture
        _ATTACHED[id(model)] = weakref.ref(self)
        self._model_id = id(model)

    # -- capture ----------------------------------------------------------------------------------
    @property
    def capture(self) -> bool:
        """Whether hooks record anything (they stay attached either way)."""
        return self._adapter.capturing

    @capture.setter
    def capture(self, on: bool) -> None:
        self._adapter.capturing = bool(on) and not self.closed

    @property
    def graph(self) -> Graph:
        return self.session.graph

    @property
    def step_index(self) -> int:
        """The step in progress (0-based); finished steps are ``0 .. step_index - 1``."""
        return self.session.step_index

    def step(self) -> None:
        """Mark a step boundary (turns off the automatic boundary at ``optimizer.step()``)."""
        a = self._adapter
        if a.auto_step:
            a.auto_step = False
            if not len(self.session.recorder) and self.session.step_index > 0:
                return  # the optimizer already closed this step
        a.end_step()

    # -- reading ----------------------------------------------------------------------------------
    def stats(self, node: str, slot: str, step: int | str = "current") -> Mapping[str, Any]:
        """Statistics of one tensor: ``dtype, shape, count, max, min, mean, abs_mean, norm, zero_count,
        nan_count, pos_inf_count, neg_inf_count``."""
        return self.session.stats(node, slot, step)

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        """The retained value as numpy; ``NotRetainedError`` (a ``LookupError``) says why when absent."""
        return self.session.tensor(node, slot, step)

    # -- lifetime ---------------------------------------------------------------------------------
    def close(self) -> None:
        """Detach: remove every hook and mode; the model is as if never attached."""
        if self.closed:
            return
        self.closed = True
        self._adapter.close()
        if _ATTACHED.get(self._model_id) is not None and _ATTACHED[self._model_id]() is self:
            del _ATTACHED[self._model_id]

    def __enter__(self) -> Debugger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "attached"
        return (f"<nbdebug.Debugger {self.session.framework} level={self.level} {state} "
                f"step={self.step_index} nodes={len(self.graph)}>")
