"""Small helpers naming the graph's items, shared by the views: a node's colour class, its short label, and
scope keys (``"section:a/b"``). The graph's layout itself runs in the browser (``frontend/src/graph.ts``).

>>> scope_key("forward", "enc/l1")
'forward:enc/l1'

The node classes are those of ``frontend/PROTOCOL.md``'s node rows: op, module, parameter, gradient,
optimizer, input.
"""

from __future__ import annotations

from typing import Any

from ..frameworks.registry import is_module_name


def node_class(node: Any) -> str:
    """Colour class of a graph node: optimizer and backward sections first, then its kind.

    >>> from nbdebug.session.graph import Node
    >>> node_class(Node("Module.fc.Linear.backward.0", "module", "Linear", section="backward"))
    'gradient'
    """
    section = getattr(node, "section", "forward")
    if section == "optimizer":
        return "optimizer"
    if section == "backward":
        return "gradient"
    kind = getattr(node, "kind", "op")
    if kind in ("parameter", "module", "op"):
        return kind
    return "input"  # input and constant


def scope_key(section: str, scope: str) -> str:
    """Key of a scope box: ``"section:a/b"``."""
    return f"{section}:{scope}"


def short_label(node: Any) -> str:
    """A short label for a node in the picture (its full name is in the hover text).

    >>> from nbdebug.session.graph import Node
    >>> short_label(Node("Parameter.fc1.weight", "parameter", "Parameter")), short_label(
    ...     Node("Module.fc1.Linear.forward.0", "module", "Linear"))
    ('weight', 'fc1.Linear')
    >>> short_label(Node("Cell.fc1.Dense.parameters_grad.0", "parameter", "Dense"))
    'fc1.Dense grad'
    """
    name = node.name
    if node.kind == "parameter" and name.startswith("Parameter."):
        return name.rsplit(".", 1)[-1]
    if is_module_name(name):
        parts = name.split(".")
        # Module.<path...>.<Class>.<forward|backward|parameters_grad>.<n> (Cell.… alike)
        body = parts[1:-2] if len(parts) >= 4 else parts[1:]
        label = ".".join(body[-2:]) if body else node.op_type
        return label + (" grad" if "parameters_grad" in parts else "")
    return node.op_type or name
