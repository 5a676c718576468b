"""An op and the bias add after it, compared as PyTorch's one call with a bias.

PyTorch's ``conv2d(x, w, b)`` and ``linear(x, w, b)`` add the bias inside the call; MindSpore's ``Conv2d``
and ``Dense`` cells run ``Conv2D`` / ``MatMul`` and then ``BiasAdd``. Compared op by op, the bias-less
output of ``Conv2D`` would be set against the biased output of ``conv2d``: a divergence on a faithful port.
:func:`bias_fusions` finds such pairs on one side (what splits which op is the framework backend's
``bias_split`` / ``bias_add_apis``); :func:`fuse` makes the op stand for both: its inputs, the bias add's
bias as one more input, and the bias add's outputs.

>>> from nbdebug.session.session import Session
>>> s = Session(framework="mindspore", live=False)
>>> for i, (n, t) in enumerate((("Primitive.conv2d.Conv2D.0.forward", "Conv2D"),
...                             ("Primitive.bias_add.BiasAdd.0.forward", "BiasAdd"))):
...     s.graph.add_node(n, kind="op", op_type=t, scope="conv").order = i
>>> order = ["Primitive.conv2d.Conv2D.0.forward", "Primitive.bias_add.BiasAdd.0.forward"]
>>> by = {"Primitive.conv2d.Conv2D.0.forward": [("input.0", 0), ("output.0", 1)],
...       "Primitive.bias_add.BiasAdd.0.forward": [("input.0", 2), ("input.1", 3), ("output.0", 4)]}
>>> shapes = [(1, 2, 3, 3), (1, 4, 2, 2), (1, 4, 2, 2), (4,), (1, 4, 2, 2)]
>>> f = bias_fusions(s, "mindspore", order, by, shapes)
>>> f
{'Primitive.conv2d.Conv2D.0.forward': ('Primitive.bias_add.BiasAdd.0.forward', 'conv2d')}
>>> src = fuse(f, order, by)
>>> order, by["Primitive.conv2d.Conv2D.0.forward"]
(['Primitive.conv2d.Conv2D.0.forward'], [('input.0', 0), ('input.1', 3), ('output.0', 4)])
>>> src[("Primitive.conv2d.Conv2D.0.forward", "output.0")]
('Primitive.bias_add.BiasAdd.0.forward', 'output.0')
"""

from __future__ import annotations

from typing import Any

from ..dump.names import parse_name
from ..frameworks.registry import find_backend

_IN = ("input", "parameters")


def op_api(name: str) -> str | None:
    """The API of an op node in lower case (``Primitive.conv2d.Conv2D.0.forward`` → ``conv2d``)."""
    info = parse_name(name)
    if info.kind != "op" or info.count is None:
        return None
    parts = info.api.split(".")
    return (parts[1] if len(parts) > 1 else parts[0]).lower()


def bias_fusions(sess: Any, framework: str, order: list[str], by: dict[str, list[tuple[str, int]]],
                 shapes: list[tuple[int, ...]]) -> dict[str, tuple[str, str]]:
    """``{op: (its bias add, PyTorch API of the fused call)}`` for the forward ops of one side whose output
    the next op of the same module adds a bias to (a data-flow edge between them, when the graph has edges)."""
    backend = find_backend(framework)
    if backend is None or not backend.bias_split:
        return {}
    nodes, graph = sess.graph.nodes, sess.graph
    out: dict[str, tuple[str, str]] = {}
    for pos, name in enumerate(order):
        api = op_api(name)
        node = nodes.get(name)
        if api not in backend.bias_split or node is None or node.section != "forward":
            continue
        nxt = next((n for n in order[pos + 1:] if nodes.get(n) is not None and nodes[n].kind == "op"), None)
        if nxt is None or op_api(nxt) not in backend.bias_add_apis or nodes[nxt].scope != node.scope:
            continue
        if graph.edges and (name, nxt) not in graph.edges:
            continue
        mine = dict(by[name])
        theirs = dict(by[nxt])
        if "output.0" not in mine or "input.0" not in theirs or "input.1" not in theirs:
            continue
        if shapes[mine["output.0"]] != shapes[theirs["input.0"]]:
            continue
        out[name] = (nxt, backend.bias_split[api])
    return out


def fuse(fusions: dict[str, tuple[str, str]], order: list[str],
         by: dict[str, list[tuple[str, int]]]) -> dict[tuple[str, str], tuple[str, str]]:
    """Make each fused op stand for itself and its bias add (in place: the bias add leaves ``order``; the op's
    rows become its inputs, the bias as its next input, the bias add's outputs); returns
    ``{(op, slot): (node, slot) the value comes from}`` for the slots taken from the bias add."""
    src: dict[tuple[str, str], tuple[str, str]] = {}
    for name, (bias_node, _api) in fusions.items():
        ins = [(s, i) for s, i in by[name] if s.startswith(_IN)]
        n_inputs = sum(1 for s, _ in ins if s.startswith("input"))
        theirs = dict(by[bias_node])
        bias_slot = f"input.{n_inputs}"
        rows = ins + [(bias_slot, theirs["input.1"])]
        src[(name, bias_slot)] = (bias_node, "input.1")
        for s, i in by[bias_node]:
            if not s.startswith(_IN):
                rows.append((s, i))
                src[(name, s)] = (bias_node, s)
        by[name] = rows
        order.remove(bias_node)
    return src
