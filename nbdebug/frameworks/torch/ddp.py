"""DistributedDataParallel's gradient allreduce: the reduced gradient the optimizer uses, as a node of its own.

A parameter's ``parameters_grad`` is recorded when autograd accumulates it — before DDP's reducer averages
it across the ranks (what msProbe records too). The reducer then writes the average into ``p.grad`` in place
at the end of the backward pass, so the optimizer of every rank steps with a value no node showed, and a NaN
that reaches a clean rank through the allreduce hit no watchpoint there. After the reducer (an autograd
callback queued behind DDP's own), each parameter whose gradient changed is recorded again as
``Module.{path}.{Class}.parameters_grad_reduced.{n}`` (a gradient node: GE/GL watch it; the optimizer's
edge comes from it), and the pre-allreduce value's reference names the allreduce when read after it.

Nothing happens outside a process group of two ranks or more, nor for a gradient the backward left alone
(``no_sync``, gradient accumulation).

>>> in_process_group()
False
"""

from __future__ import annotations

from typing import Any

import torch

#: the suffix of a reduced gradient's node after the owner's ``parameters_grad``
REDUCED = "_reduced"
BY = "DDP's gradient allreduce"


def in_process_group() -> bool:
    """Whether this process is one of several ranks of an initialised process group."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class ReducedGrads:
    """Per backward pass: the parameter gradients recorded before the reducer, checked after it."""

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter
        #: id(p) -> (p, qual, [(base, scope, local)], id of the grad, its version, the pre-allreduce node)
        self._pending: dict[int, tuple[Any, str, list[tuple[str, str, str]], int, int, str]] = {}

    def note(self, p: Any, qual: str, owners: list[tuple[str, str, str]], node: str) -> None:
        """``p``'s gradient was recorded as ``node`` (autograd's hook, inside the backward)."""
        if not in_process_group():
            return
        if not self._pending:  # the first of this backward: look again once DDP's finalize has run
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(lambda: engine.queue_callback(self._after_reducer))
        g = p.grad
        self._pending[id(p)] = (p, qual, owners, id(g), g._version, node)

    def _after_reducer(self) -> None:
        pending, self._pending = self._pending, {}
        adapter = self.adapter
        if not adapter.capturing:
            return
        for p, qual, owners, gid, version, pre in pending.values():
            g = p.grad
            if g is None or (id(g) == gid and g._version == version):
                continue  # not reduced in this backward (no_sync): the recorded gradient is the one used
            seen = adapter._seen.get(gid)
            handle = seen.handle if seen is not None else None
            for base, scope, local in owners:
                with torch._C.DisableTorchFunction():
                    node = adapter.parameter_gradient(qual, base + REDUCED, scope, local, g)
                adapter.session.graph.add_edge(pre, node.name, local, local)
                if handle is not None and not handle.copied and handle.overwritten_by is None:
                    handle.overwritten_by = f"{BY} (the reduced value is {node.name} {local})"
                adapter.emit_node(node)
