"""Activation checkpointing: the forward ops that backward recomputes are ops the model ran.

``torch.utils.checkpoint`` runs a checkpointed function's forward again inside backward (non-reentrant:
from an unpack hook of the saved tensors, under ``_recomputation_hook``; reentrant: in
``CheckpointFunction.backward``). msProbe records those calls as forward entries, counters continuing
(``Functional.layer_norm.5.forward`` after the first pass's ``.4``); so do we. Every other torch call during
backward (a custom ``Function``'s backward, a hook, ``torch.autograd.backward``'s own ``ones_like``) is
autograd's, not the model's forward, and is not recorded.

``Tensor.backward`` reaches a torch function mode with the mode taken off the stack, so the whole backward
would run without it: :func:`run_backward` puts the mode back for the backward's duration (``mode``'s
adapter has ``in_backward`` set meanwhile).

>>> import torch.utils.checkpoint as cp
>>> seen = []
>>> class Mode(torch.overrides.TorchFunctionMode):
...     in_backward = False
...     def __torch_function__(self, func, types, args=(), kwargs=None):
...         if func is torch.Tensor.backward:
...             return run_backward(self, self, args, kwargs or {})
...         if func.__name__ in ("sin", "exp"):
...             seen.append(("again " if self.in_backward and recomputing() else "") + func.__name__)
...         return func(*args, **(kwargs or {}))
>>> x = torch.ones(2, requires_grad=True)
>>> with Mode():
...     cp.checkpoint(lambda t: t.sin().exp(), x, use_reentrant=False).sum().backward()
>>> seen
['sin', 'exp', 'again sin', 'again exp']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.utils.checkpoint

__all__ = ["STOPPED", "recomputing", "run_backward"]

#: what a non-reentrant checkpoint raises inside the op that would save a tensor no backward needs (its early
#: stop): the op's inputs were passed, it made no output (msProbe writes such an entry: inputs only)
STOPPED: type[BaseException] | tuple = getattr(torch.utils.checkpoint, "_StopRecomputationError", ())

_autograd_node = torch._C._current_autograd_node
_top_hooks = torch._C._autograd._top_saved_tensors_default_hooks


def recomputing() -> bool:
    """Whether this torch call is part of a checkpointed forward that backward runs again."""
    node = _autograd_node()
    if node is not None and type(node).__name__ == "CheckpointFunctionBackward":  # reentrant checkpoint
        return True
    top = _top_hooks(True)
    return bool(top) and "_recomputation_hook" in getattr(top[0], "__qualname__", "")


def _engine_call(t: torch.Tensor, gradient: Any = None, retain_graph: Any = None, create_graph: bool = False,
                 inputs: Any = None) -> Callable[[], None] | None:
    """``torch.autograd.backward(t, ...)`` past its torch-function check (which a mode on the stack would
    send back to the mode), as a function; None where this torch has not the parts or ``t`` is a subclass."""
    ag = torch.autograd
    run = getattr(getattr(ag, "graph", None), "_engine_run_backward", None)
    if run is None or not hasattr(ag, "_make_grads") or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    if inputs is None:
        inputs = ()
    elif isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    else:
        inputs = tuple(inputs)
    if any(type(i) is not torch.Tensor and type(i) is not torch.nn.Parameter for i in inputs):
        return None
    grads = ag._make_grads((t,), ag._tensor_or_tensors_to_tuple(gradient, 1), is_grads_batched=False)
    keep = create_graph if retain_graph is None else retain_graph
    return lambda: run((t,), grads, keep, create_graph, inputs, allow_unreachable=True, accumulate_grad=True)


def run_backward(mode: torch.overrides.TorchFunctionMode, flags: Any, args: tuple, kwargs: dict) -> None:
    """``Tensor.backward(*args, **kwargs)`` with ``mode`` on the torch function mode stack, so that the
    ops a checkpoint recomputes reach it; ``flags.in_backward`` is true meanwhile."""
    call = _engine_call(*args, **kwargs)
    if call is None:
        return args[0].backward(*args[1:], **kwargs)  # the mode stays off: no recomputed op is recorded
    before, flags.in_backward = flags.in_backward, True
    try:
        with mode:
            call()
    finally:
        flags.in_backward = before
