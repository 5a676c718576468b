"""The torch-function mode of L1/mix capture: it sees every torch-level call on the training thread and hands
the ones msProbe records to the adapter (``run_op``) and the rest to ``pass_op``, naming a Tensor method by the
Python operator at its call site (``x + y`` reaches the mode as ``Tensor.add``; msProbe names it
``Tensor.__add__``, ``2 - x`` ``Tensor.__rsub__``).

Example::

    >>> from nbdebug.frameworks.torch.op_mode import OpMode
    >>> OpMode.__mro__[1].__name__
    'TorchFunctionMode'
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from . import api_names as _names
from .op_calls import _OPERATOR_SITES, _PASS, _operator_at, _reflected_at
from .recompute import recomputing, run_backward

__all__ = ["OpMode"]

_autograd_node = torch._C._current_autograd_node  # not None while backward runs a node
_TENSOR_BACKWARD = torch.Tensor.backward

#: API -> whether a Tensor method's name depends on the Python operator at its call site (``x + y`` reaches
#: the mode as ``Tensor.add``, msProbe names it ``Tensor.__add__``): decided once per API
_NAMED_BY_OPERATOR: dict[tuple[str, str], bool] = {}
#: (operator, reflected) -> the API msProbe names it by (``("Tensor", "__radd__")``), or _PASS
_OPERATOR_INFO: dict[tuple[str, bool], tuple[str, str]] = {}


class OpMode(TorchFunctionMode):
    """Sees every torch-level call while pushed on the training thread."""

    def __init__(self, adapter: Any) -> None:
        super().__init__()
        self.adapter = adapter
        self.armed = True

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        a = self.adapter
        if not a.capturing or a.busy or not self.armed:
            return func(*args, **kwargs)
        try:
            info = a._api_cache[func]
        except (KeyError, TypeError):
            info = a.api_info(func)
        if info is None:
            if func is _TENSOR_BACKWARD:  # with the mode on: a checkpoint's recomputed forward ops
                return run_backward(self, a, args, kwargs)
            return func(*args, **kwargs)
        if (a.in_backward or _autograd_node() is not None) and not recomputing():
            return func(*args, **kwargs)
        caller = sys._getframe(1)
        if a._scope and caller is not a._ok_frame:  # inside a module call, or left one by an interrupt?
            if not a._root_alive(caller):
                a.interrupted()
                return func(*args, **kwargs)
            a._ok_frame = caller
        site = a.site = (caller.f_code, caller.f_lasti)  # the call site: a node's identity (see Session.node)
        by_operator = _NAMED_BY_OPERATOR.get(info)
        if by_operator is None:
            by_operator = _NAMED_BY_OPERATOR[info] = info[0] in ("Tensor", "Tensor?") and not info[1].startswith("__")
        if by_operator:
            code = site[0]
            hit = _OPERATOR_SITES.get((id(code), site[1]))  # keyed by id: see op_calls._OPERATOR_SITES
            op = hit[1] if hit is not None and hit[0] is code else _operator_at(code, site[1])
            if op is not None:
                if op.startswith("i") and not info[1].endswith("_"):  # ``s += t``, s no tensor: Python ran
                    op = op[1:]  # t.__radd__(s) (or s.__add__(t)): no in-place op ran, msProbe's name too
                    reflected = len(args) > 1 and not isinstance(args[1], torch.Tensor)
                else:
                    reflected = not op.startswith("i") and len(args) > 1 and \
                        not isinstance(args[1], torch.Tensor) and _reflected_at(caller)
                info = _OPERATOR_INFO.get((op, reflected))
                if info is None:
                    name = f"__{'r' if reflected else ''}{op}__"
                    info = _OPERATOR_INFO[(op, reflected)] = ("Tensor", name) if name in _names.TENSOR else _PASS
            elif info[0] == "Tensor?":
                info = _PASS
        if info is _PASS:
            return a.pass_op(func, args, kwargs)
        return a.run_op(info, func, args, kwargs)
