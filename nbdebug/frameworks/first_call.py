"""Run a callback on the first top-level call of a model: a ``torch.nn.Module`` / ``mindspore.nn.Cell``
with parameters called while no other module is running (``python -m nbdebug.run`` attaches there).

The class's ``__call__`` is wrapped until that call and restored right after the callback, so the
wrapper costs nothing afterwards; the callback runs before the call itself, so hooks it installs see
that very call.

>>> import torch
>>> seen = []
>>> on_first_model_call("torch", seen.append)
>>> _ = torch.nn.ReLU()(torch.ones(1))          # no parameters: not a model
>>> net = torch.nn.Linear(2, 1); _ = net(torch.ones(1, 2)); _ = net(torch.ones(1, 2))
>>> seen == [net]
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .registry import backend_named


def _model_class(framework: str) -> tuple[type, Callable[[Any], bool]]:
    """The model base class of ``framework`` (a name :func:`~nbdebug.frameworks.registry.backend_named`
    knows) and the test that an instance holds parameters."""
    backend = backend_named(framework)
    return backend.model_class(), backend.has_parameters


def on_first_model_call(framework: str, callback: Callable[[Any], Any]) -> None:
    """Call ``callback(model)`` once, at the first top-level call of a model with parameters."""
    cls, has_params = _model_class(framework)
    original = cls.__call__
    depth = threading.local()
    done: list[bool] = []

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not done and not getattr(depth, "n", 0) and has_params(self):
            done.append(True)
            cls.__call__ = original
            callback(self)
        depth.n = getattr(depth, "n", 0) + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            depth.n -= 1

    cls.__call__ = call
