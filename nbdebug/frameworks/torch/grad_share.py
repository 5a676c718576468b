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

A module backward's ``input.k`` is the gradient of its ``k``-th output *from outside the call* (a full
backward hook's ``grad_output``). Usually that is the output tensor's gradient. It is not when the call
itself consumed the tensor as well: T5's first attention makes ``position_bias``, adds it to its scores and
returns it (the tensor's gradient holds that use too), and the next block takes ``position_bias`` in,
uses it and returns it again (nothing outside that block uses its output: msProbe writes ``None``). Such
an output (:func:`plan_call`: consumed inside the call, or made before it) is read, once the outermost
module call has returned, from the consumers created after the call (:func:`later_consumers`); an input
returned unchanged gets, as its ``output.j``, its share inside the call plus that gradient from outside.

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
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import get_gradient_edge

__all__ = ["Pending", "consumers", "edge_of", "later_consumers", "next_sequence_nr", "plan_call", "share_hooks"]

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
    """(autograd node, output number) through which gradients reach ``t`` (``get_gradient_edge``'s; a tensor
    an op made is its ``grad_fn`` and output number, read directly: no ``GradientEdge`` per edge, and no
    ownership token — a ``view_as`` node for a custom Function's output — that nothing here keeps)."""
    gf = t.grad_fn
    if gf is not None:
        return gf, t.output_nr
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


@dataclass
class Pending:
    """An output of a module call whose gradient from outside the call is read from the consumers made after
    the call (``end``: the first sequence number after it): ``keys`` are the backward slots it feeds —
    ``("input", k)`` for each output place ``k``, ``("output", j)`` when it is the call's input ``j``
    returned unchanged; ``inner``: that input's consumers inside the call (its share there)."""

    end: int
    edge: tuple[Any, int]
    tensor: torch.Tensor
    keys: list[tuple[str, int]]
    inner: dict[Any, list[tuple[int, Any]]] = field(default_factory=dict)


def plan_call(outs: list[torch.Tensor], inputs: list[tuple[torch.Tensor, tuple[Any, int]]], mark: int
              ) -> tuple[list[tuple[int, torch.Tensor]], dict[Any, list[tuple[int, Any]]], list[Pending]]:
    """Right after a module call (its autograd nodes from ``mark`` on): the outputs whose tensor gradient is
    the one from outside (``(k, tensor)``), the consumers of inputs inside the call (:func:`consumers`: the
    input's share, ``output.j``) and the outputs read later (:class:`Pending`).

    >>> x = torch.ones(2, requires_grad=True) * 1.0
    >>> mark = next_sequence_nr()
    >>> y = x.exp()
    >>> z = y * y  # the call consumes its output y itself, and returns x unchanged
    >>> direct, inner, pending = plan_call([z, y, x], [(x, edge_of(x))], mark)
    >>> [k for k, _t in direct], [p.keys for p in pending]
    ([0], [[('input', 1)], [('input', 2), ('output', 0)]])
    """
    edges: dict[tuple[Any, int], Any] = {}
    for j, (_t, edge) in enumerate(inputs):
        edges.setdefault(edge, j)  # the same tensor twice (``attn(x, x, x)``): its share under the first
    places: dict[tuple[Any, int], list[int]] = {}
    for k, t in enumerate(outs):
        places.setdefault(edge_of(t), []).append(k)
    probe = dict(edges)
    for e in places:
        probe.setdefault(e, ("out", e))
    found = consumers([t.grad_fn for t in outs], mark, probe)
    used_inside = {key[1] for pairs in found.values() for _i, key in pairs if type(key) is tuple}
    end = next_sequence_nr()
    direct: list[tuple[int, torch.Tensor]] = []
    pending: list[Pending] = []
    for e, ks in places.items():
        t = outs[ks[0]]
        j = edges.get(e)
        if j is None and e not in used_inside and e[0]._sequence_nr() >= mark:
            direct.extend((k, t) for k in ks)  # made in the call, consumed only after it
            continue
        keys = [("input", k) for k in ks]
        inner: dict[Any, list[tuple[int, Any]]] = {}
        if j is not None:  # an input returned unchanged: its share inside, then the gradient from outside
            keys.append(("output", j))
            for node, pairs in found.items():
                mine = [(i, ("output", j)) for i, jj in pairs if jj == j]
                if mine:
                    inner[node] = mine
        pending.append(Pending(end, e, t, keys, inner))
    passed = {p.edge for p in pending}
    inside = {node: kept for node, pairs in found.items()
              if (kept := [(i, j) for i, j in pairs if type(j) is int and inputs[j][1] not in passed])}
    return direct, inside, pending


def later_consumers(roots: Iterable[Any], pending: list[Pending]) -> list[dict[Any, list[tuple[int, Any]]]]:
    """For each :class:`Pending` output: the nodes reachable from ``roots`` (the outermost call's outputs),
    made after its call, with an edge into its gradient edge — ``node -> [(gradient output i, key)]`` for
    each of its keys, plus its ``inner`` consumers. One walk for them all.

    >>> x = torch.ones(2, requires_grad=True) * 1.0
    >>> mark = next_sequence_nr()
    >>> y = x.exp(); z = y * 2.0  # the call uses y and returns (z, y)
    >>> _direct, _inner, pending = plan_call([z, y], [], mark)
    >>> w = y + 1.0  # the caller uses it
    >>> [sorted(type(n).__name__ for n in f) for f in later_consumers([w.grad_fn, z.grad_fn], pending)]
    [['AddBackward0']]
    """
    if not pending:
        return []
    wanted: dict[tuple[Any, int], list[int]] = {}
    for n, p in enumerate(pending):
        wanted.setdefault(p.edge, []).append(n)
    low = min(p.end for p in pending)
    out: list[dict[Any, list[tuple[int, Any]]]] = [{node: list(pairs) for node, pairs in p.inner.items()}
                                                    for p in pending]
    stack = [r for r in roots if r is not None and low <= r._sequence_nr() < _LEAF_SEQ]
    seen = set(stack)
    while stack:
        node = stack.pop()
        seq = node._sequence_nr()
        for i, (nxt, nr) in enumerate(node.next_functions):
            if nxt is None:
                continue
            for n in wanted.get((nxt, nr), ()):
                if seq >= pending[n].end:
                    out[n].setdefault(node, []).extend((i, key) for key in pending[n].keys)
            if nxt not in seen and low <= nxt._sequence_nr() < _LEAF_SEQ:
                seen.add(nxt)
                stack.append(nxt)
    return out
