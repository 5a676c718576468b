"""A module's share of its inputs' gradients, read without touching the autograd graph.

A module backward's ``output.j`` is the gradient of the loss with respect to the module's ``j``-th
input *through this module only* (what a full backward hook reports), not the input's total gradient
(which also holds every other consumer's share: a residual ``ln(h) + h``).

Giving the module its own alias of each input (``x.view_as(x)``, or a full backward hook's
``BackwardHookFunction``) isolates that share, but changes the graph: autograd then sums the module's
contributions first and adds the others afterwards, and floating-point addition is not associative —
an RMSNorm that reads its input twice beside a residual gives bitwise different gradients, and
``nn.MultiheadAttention`` no longer sees ``query is key`` and takes another code path. So nothing is
inserted: after the call, the autograd nodes the call created (sequence numbers above a mark taken at
its start) are walked from the outputs; every edge from one of them into an input's gradient edge is a
consumer inside the module, and a hook on that node reads the gradient it sends along the edge. The
share is the sum of those gradients (one consumer: the very tensor autograd passes on).

An input the module returns unchanged (``nn.Identity``, ``Dropout(p=0)``) has no share of its own: its
consumers are the caller's, indistinguishable from the other consumers of the same tensor.

>>> import torch
>>> x = torch.ones(3, requires_grad=True) * 1.0
>>> mark = next_sequence_nr()
>>> y = x.exp() + x * 2.0
>>> edges = {edge_of(x): 0}
>>> sorted(type(n).__name__ for n in consumers([y.grad_fn], mark, edges))
['ExpBackward0', 'MulBackward0']
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge

__all__ = ["consumers", "edge_of", "next_sequence_nr", "share_hooks"]

_LEAF_SEQ = 2 ** 64 - 1  # AccumulateGrad's sequence number: never created inside a call


_PEEK = getattr(torch._C._autograd, "_get_sequence_nr", None)


def next_sequence_nr() -> int:
    """The sequence number of the next autograd node this thread creates (nodes with a larger one were
    created after this call): autograd's thread-local counter, read without creating a node."""
    if _PEEK is not None:
        return _PEEK()
    with torch.enable_grad():  # no reader of the counter: make a node and take the number after its own
        leaf = torch.empty(0, requires_grad=True)
        return leaf.view_as(leaf).grad_fn._sequence_nr() + 1


def edge_of(t: torch.Tensor) -> tuple[Any, int]:
    """(autograd node, output number) through which gradients reach ``t``."""
    e = get_gradient_edge(t)
    return e.node, e.output_nr


def consumers(roots: Iterable[Any], mark: int, edges: dict[tuple[Any, int], int]) -> dict[Any, list[tuple[int, int]]]:
    """Nodes created since ``mark``, reachable from ``roots``, with an edge into one of ``edges``:
    node -> [(its gradient output i, the input number edges[...])]."""
    found: dict[Any, list[tuple[int, int]]] = {}
    stack = [r for r in roots if mark <= r._sequence_nr() < _LEAF_SEQ]
    seen = set(stack)
    while stack:
        node = stack.pop()
        for i, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            j = edges.get((nxt, nr))
            if j is not None:
                found.setdefault(node, []).append((i, j))
            elif nxt not in seen and mark <= nxt._sequence_nr() < _LEAF_SEQ:
                seen.add(nxt)
                stack.append(nxt)
    return found


def share_hooks(found: dict[Any, list[tuple[int, int]]], emit: Callable[[int, torch.Tensor], None]) -> list[Any]:
    """Hook every consumer in ``found``; once all consumers of input ``j`` have run, ``emit(j, share)``.
    Returns the hook handles."""
    pending: dict[int, int] = {}
    for pairs in found.values():
        for _i, j in pairs:
            pending[j] = pending.get(j, 0) + 1
    parts: dict[int, list[torch.Tensor]] = {j: [] for j in pending}

    def make(pairs: list[tuple[int, int]]) -> Callable:
        def hook(grad_inputs, _grad_outputs):
            for i, j in pairs:
                g = grad_inputs[i]
                if g is not None:
                    parts[j].append(g)
                pending[j] -= 1
                if pending[j] == 0 and parts[j]:
                    gs, parts[j] = parts[j], []
                    with torch.no_grad(), torch._C.DisableTorchFunction():
                        emit(j, gs[0] if len(gs) == 1 else functools.reduce(torch.add, gs))
            return None
        return hook

    return [node.register_hook(make(pairs)) for node, pairs in found.items()]
