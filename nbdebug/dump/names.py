"""msProbe (and nbdebug) node names: what a name says (:func:`parse_name`), the node it mirrors
(:func:`pair_name`), and dtype spellings (:func:`normalize_dtype`).

>>> parse_name("Module.fc1.Linear.backward.0").direction
'backward'
>>> pair_name("Functional.relu.0.forward", parse_name("Functional.relu.0.forward"))
'Functional.relu.0.backward'
>>> normalize_dtype("torch.bfloat16")
'bfloat16'
"""

from __future__ import annotations

from typing import Any, NamedTuple

_DIRECTIONS = ("forward", "backward", "parameters_grad")

class NameInfo(NamedTuple):
    """What an msProbe (or nbdebug) node name says.

    >>> info = parse_name("Module.block.lin.Linear.forward.1")
    >>> info.kind, info.path, info.cls, info.direction, info.count
    ('module', 'block.lin', 'Linear', 'forward', 1)
    >>> parse_name("Primitive.matmul.MatMul.0.backward").op_type
    'MatMul'
    """

    kind: str  # module | op | parameter | input | constant
    op_type: str
    direction: str  # forward | backward | parameters_grad
    path: str  # dotted module path (modules, parameter gradients, parameters)
    cls: str  # module class, or primitive class
    api: str  # "Functional.linear" for ops
    count: int | None
    prefix: str


_NAME_CACHE: dict[str, NameInfo] = {}
_new_info = tuple.__new__


def parse_name(name: str) -> NameInfo:
    """Split a node name into its parts (cached)."""
    info = _NAME_CACHE.get(name)
    if info is not None:
        return info
    head, _, last = name.rpartition(".")
    api, _, count = head.rpartition(".")
    if (last == "forward" or last == "backward") and count.isdigit() and "." in api:  # the common case: an API
        prefix, _, rest = api.partition(".")
        op_type = rest.rpartition(".")[2]
        cls = op_type if prefix == "Primitive" and "." in rest else ""
        info = _new_info(NameInfo, ("op", op_type, last, "", cls, api, int(count), prefix))
    else:
        info = _parse_other(name)
    if len(_NAME_CACHE) < 1_000_000:
        _NAME_CACHE[name] = info
    return info


def _parse_other(name: str) -> NameInfo:
    parts = name.split(".")
    prefix = parts[0]
    n = len(parts)
    if prefix == "Parameter" and n >= 2:
        return NameInfo("parameter", "Parameter", "forward", ".".join(parts[1:-1]), "", "", None, prefix)
    if prefix in ("Input", "Constant") and n >= 2:
        return NameInfo(prefix.lower(), prefix.lower() if prefix == "Input" else "buffer", "forward", "", "", "",
                        None, prefix)
    if n >= 4 and parts[-1].isdigit() and parts[-2] in _DIRECTIONS:
        direction = parts[-2]
        path = ".".join(parts[1:-3])
        cls = parts[-3]
        if direction == "parameters_grad":
            return NameInfo("parameter", "parameters_grad", direction, path, cls, "", int(parts[-1]), prefix)
        return NameInfo("module", cls, direction, path, cls, "", int(parts[-1]), prefix)
    if n >= 3 and parts[-1] in ("forward", "backward") and parts[-2].isdigit():
        api_parts = parts[1:-2]
        op_type = api_parts[-1] if api_parts else prefix
        cls = api_parts[-1] if prefix == "Primitive" and len(api_parts) > 1 else ""
        return NameInfo("op", op_type, parts[-1], "", cls, ".".join(parts[:-2]), int(parts[-2]), prefix)
    if prefix == "Optimizer" and n >= 3:
        return NameInfo("op", parts[2] if n > 2 else "step", "forward", "", parts[1], ".".join(parts[:-1]),
                        int(parts[-1]) if parts[-1].isdigit() else None, prefix)
    return NameInfo("op", parts[-1] if n > 1 else name, "forward", "", "", name, None, prefix)


def pair_name(name: str, info: NameInfo) -> str | None:
    """The forward node a backward node mirrors, and vice versa."""
    if info.kind == "module":
        if ".forward." in name:
            return name[::-1].replace(".forward."[::-1], ".backward."[::-1], 1)[::-1]
        return name[::-1].replace(".backward."[::-1], ".forward."[::-1], 1)[::-1]
    if info.kind == "op" and info.direction in ("forward", "backward") and name.endswith(("forward", "backward")):
        other = "backward" if info.direction == "forward" else "forward"
        return name[: -len(info.direction)] + other
    return None


def normalize_dtype(dtype: Any) -> str:
    """``torch.float32`` / ``Float32`` / ``float32`` → ``float32``."""
    s = str(dtype)
    for p in ("torch.", "mindspore.", "numpy.", "np."):
        if s.startswith(p):
            s = s[len(p):]
    return s.lower()
