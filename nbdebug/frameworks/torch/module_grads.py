"""A module call's backward entry (``Module.{path}.{Class}.backward.{n}``): the gradients of its outputs coming
in (``input.k``) and its share of its inputs' gradients (``output.j``), numbered as a full backward hook
numbers them (msProbe), read without changing the graph autograd runs (:mod:`.grad_share`).

A mixin of the torch adapter: it uses the capture core's ``gradient``, ``outputs``, ``emit_node``, ``hooks``
and ``capturing``, and the adapter's step state ``_call_inputs`` (a call's first autograd sequence number and
positional inputs), ``_outside`` (outputs read once the outermost call returns), ``_outs_of`` (tensor id ->
[tensor, (return order, reader)...]), ``_returns`` (module calls returned) and ``_held``.

>>> sorted(m for m in vars(ModuleGrads) if not m.startswith("__"))[:4]
['_grad_out', '_module_bwd_hooks', '_module_grad', '_note_inputs']
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..core.calls import module_base
from ..core.records import slot_name
from .grad_share import edge_of, later_consumers, next_sequence_nr, plan_call, share_hooks

__all__ = ["ModuleGrads"]


class ModuleGrads:
    """Module backward entries of the torch adapter (see the module docstring)."""

    def _note_inputs(self, name: str, args: tuple) -> None:
        """Remember the gradient edges of the call's positional inputs that need a gradient, and where the
        call's autograd nodes start: the module's share of their gradients is read from the nodes it
        creates (:mod:`.grad_share`), so that the graph autograd runs is the undebugged one."""
        inputs = [(t, edge_of(t)) for t in args if isinstance(t, torch.Tensor) and t.requires_grad]
        if inputs:
            self._call_inputs[name] = (next_sequence_nr(), inputs)

    def _module_bwd_hooks(self, path, cls, n, fwd, output, inplace) -> None:
        if inplace:  # msProbe's full backward hook never reports a module that overwrites its input
            return
        name = f"{module_base('Module', path, cls)}.backward.{n}"
        # numbered as a full backward hook numbers them (msProbe): the output's tensors that need a
        # gradient, flattened (a dict / ModelOutput included), and the positional inputs that do
        mark, inputs = self._call_inputs.pop(fwd.name, (0, ()))
        outs = [t for _slot, t in self.outputs(output, "input") if t.requires_grad and t.grad_fn is not None]
        if not outs:
            return
        direct, inside, pending = plan_call(outs, inputs, mark)
        self._returns += 1
        for k, t in direct:
            self._grad_out(t, self._returns, self._module_grad(name, fwd.scope, fwd.name, slot_name("input", k), True))
        if inside:
            self.hooks.extend_step(share_hooks(inside, self._share_emit(name, fwd.scope, fwd.name)))
        self._outside.extend((p, (name, fwd.scope, fwd.name, self._returns)) for p in pending)

    def _grad_out(self, t: torch.Tensor, order: int, read: Callable) -> None:
        """``read(gradient)`` once ``t``'s gradient is complete: one tensor hook per tensor calls its readers
        latest call return first (a full backward hook wraps the output at each return that hands it on; the
        last wrap's hook runs first)."""
        readers = self._outs_of.get(id(t))
        if readers is None:
            readers = self._outs_of[id(t)] = [t]

            def hook(grad):
                for _order, fn in sorted(readers[1:], key=lambda r: -r[0]):
                    fn(grad)
                return None

            self.hooks.add_step(t.register_hook(hook))
        readers.append((order, read))

    def _share_emit(self, name: str, scope: str, pair: str) -> Callable:
        """Holds a gradient read from consumer nodes (``j``: a plain input number, or ``(side, place)``): the
        consumer's parameter gradients accumulate first (see :meth:`emit_node`)."""
        def emit(key: Any, grad: torch.Tensor) -> None:
            if self.capturing:
                side, place = ("output", key) if type(key) is int else key
                self._held.append(self.gradient(name, scope, pair, "module", slot_name(side, place), grad,
                                                side == "input"))

        return emit

    def _resolve_outside(self, output: Any) -> None:
        """The outermost module call returned: the pending outputs' gradients from outside their calls are
        read from the consumers made since (:func:`.grad_share.later_consumers`); one that the outermost call
        returns has consumers beyond it, unknown here: its tensor's gradient."""
        items, self._outside = self._outside, []
        if not items or not self.capturing:
            return
        root = [t for _s, t in self.outputs(output, "output") if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        ends = {edge_of(t) for t in root}
        found = later_consumers([t.grad_fn for t in root], [p for p, _ in items])
        for (p, (name, scope, pair, order)), nodes in zip(items, found, strict=True):
            if p.edge in ends:
                for side, place in p.keys:
                    self._grad_out(p.tensor, order, self._module_grad(name, scope, pair, slot_name(side, place),
                                                                      side == "input"))
            elif nodes and p.inner:
                self.hooks.extend_step(share_hooks(nodes, self._share_emit(name, scope, pair)))
            elif nodes:  # an input returned as it came (Dropout(p=0)): complete when the tensor's gradient is,
                # in the order of the calls that return it too
                got: dict[Any, torch.Tensor] = {}
                self.hooks.extend_step(share_hooks(nodes, got.__setitem__))
                self._grad_out(p.tensor, order, self._passed_grads(name, scope, pair, got))

    def _passed_grads(self, name: str, scope: str, pair: str, got: dict) -> Callable:
        def hook(_grad):
            if self.capturing and got:
                with torch._C.DisableTorchFunction():
                    for (side, place), grad in got.items():
                        node = self.gradient(name, scope, pair, "module", slot_name(side, place), grad,
                                             side == "input")
                got.clear()
                self.emit_node(node)
            return None

        return hook

    def _module_grad(self, name, scope, pair, slot, is_input) -> Callable:
        def hook(grad):
            if not self.capturing or grad is None:
                return None
            with torch._C.DisableTorchFunction():
                node = self.gradient(name, scope, pair, "module", slot, grad, is_input)
            self.emit_node(node)
            return None

        return hook
