"""Cell scopes for kernels compiled without them (``ms.jit`` functions, ``value_and_grad`` steps).

MindSpore names a kernel after the Cell it ran in only when the graph was built from a Cell
(``Default/network-WithLossCell/_backbone-LeNet/fc1-Dense/MatMul-op0``). A jitted training function
gives ``Default/MatMul-op0``: the graph view would have no layers. The kernel's IR still carries its call
chain with exact columns (``net.py:9, 33~41/        return self.fc2(self.act(self.fc1(x)))/``), so
walking that chain from the debugged root Cell down recovers the path: a frame entering a ``construct``
defined by the Cell's class moves into that Cell, and a call expression ``self.<name>`` inside it names
the child Cell entered next. Kernels keep their names; only their scope gains the Cell segments
(``Default/fc1-Dense``, ``Gradients/Default/fc1-Dense/Grad_MatMul``), written as MindSpore writes them.

Children reached other than through ``self.<name>(…)`` (a ``SequentialCell`` looping over its cells,
``self.layers[i]``) end the walk there: the kernel gets the deepest scope that is certain.

>>> cell_segments([], root=None)
[]
"""

from __future__ import annotations

from typing import Any

from mindspore import nn

Frame = tuple[str, int, int, int, str]


def _defines_construct(cell: Any, file: str, line: int) -> bool:
    """Whether ``cell``'s class (or the base class that defines it) has its ``construct`` at file:line."""
    fn = getattr(type(cell), "construct", None)
    code = getattr(fn, "__code__", None)
    return code is not None and code.co_filename == file and code.co_firstlineno <= line <= code.co_firstlineno + 2


def cell_segments(frames: list[Frame], root: Any) -> list[str]:
    """``["fc1-Dense", …]``: the Cells below ``root`` that the call chain ``frames`` (outermost first)
    runs through."""
    if root is None:
        return []
    cur: Any = None
    pending: tuple[str, Any] | None = None
    path: list[str] = []
    for file, line, c0, c1, text in frames:
        if text.strip().startswith("def construct"):
            if pending is not None and _defines_construct(pending[1], file, line):
                cur = pending[1]
                path.append(f"{pending[0]}-{type(cur).__name__}")
            elif cur is None and _defines_construct(root, file, line):
                cur = root
            pending = None
            continue
        if cur is None or c0 < 0:
            continue
        expr = text[c0:c1]
        if expr.startswith("self.") and expr[5:].isidentifier():
            child = cur._cells.get(expr[5:]) if hasattr(cur, "_cells") else None
            if isinstance(child, nn.Cell):
                pending = (expr[5:], child)
    return path


def recover_cell_scopes(kernels: list[Any], root: Any) -> int:
    """Give kernels whose scope has no Cell segment the Cells their call chain runs through; returns how
    many kernels changed."""
    changed = 0
    for k in kernels:
        parts = k.scope.split("/") if k.scope else []
        if "Default" not in parts or any("-" in p for p in parts):
            continue
        segs = cell_segments(getattr(k, "frames", []), root)
        if not segs:
            continue
        i = parts.index("Default") + 1
        k.scope = "/".join(parts[:i] + segs + parts[i:])
        changed += 1
    return changed
