"""What a dump entry says about a node: msProbe's kind of entry, a slot's place in its lists, a numpy
argument's description, the caller's stack (msProbe's format, nbdebug's own frames left out).

>>> slot_path("output.1.0")
('output', (1, 0))
>>> lst = []; place(lst, (1, 0), "t"); lst
[None, ['t']]
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any

import numpy as np

NBDEBUG_ONLY = ("Parameter.", "Input.", "Constant.", "Optimizer.")
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def call_stack() -> list[str]:
    """The caller's frames, innermost first, msProbe-style (``File f, line n, in fn, \\n source``).

    nbdebug's own frames are left out, as msProbe leaves out its own."""
    out: list[str] = []
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG_DIR):
            src = linecache.getline(fn, f.f_lineno).strip()
            if src:
                out.append(f"File {fn}, line {f.f_lineno}, in {f.f_code.co_name}, \n {src}")
        f = f.f_back
    return out


class NdSnap:
    """A numpy array argument: described with numpy statistics, saved like msProbe does."""

    __slots__ = ("arr", "head", "data_name")

    def __init__(self, arr: np.ndarray, keep: bool) -> None:
        stats: dict[str, Any] = {"Max": None, "Min": None, "Mean": None, "Norm": None}
        if arr.size and arr.dtype.kind not in ("U", "S"):
            try:
                stats = {"Max": np.max(arr).item(), "Min": np.min(arr).item(), "Mean": np.mean(arr).item(),
                         "Norm": np.linalg.norm(arr).item()}
            except (TypeError, ValueError):
                pass
        self.head = {"type": "numpy.ndarray", "dtype": str(arr.dtype), "shape": list(arr.shape), **stats}
        self.arr = arr.copy() if keep else None
        self.data_name: str | None = None


DROPOUT = ("Functional.dropout.", "Functional.dropout1d.", "Functional.dropout2d.", "Functional.dropout3d.",
            "Functional.alpha_dropout.", "Functional.feature_alpha_dropout.")


def dropout_p(args: tuple, kwargs: dict) -> Any:
    p = kwargs.get("p", 0.5)
    if len(args) >= 2:
        p = args[1]
    return p


def entry_kind(node: Any) -> str | None:
    if node.kind == "module":
        return "mod_b" if node.section == "backward" else "mod_f"
    if node.kind == "parameter":
        return "pgrad" if ".parameters_grad." in node.name else None
    if node.kind == "op":
        return "api_b" if node.section == "backward" else "api_f"
    return None


def slot_path(slot: str) -> tuple[str, tuple[Any, ...]]:
    """``output.1.0`` -> ("output", (1, 0))."""
    head, _, rest = slot.partition(".")
    return head, tuple(int(p) if p.isdigit() else p for p in rest.split(".")) if rest else ()


def place(lst: list[Any], path: tuple[Any, ...], value: Any) -> None:
    for i, p in enumerate(path):
        if not isinstance(p, int):
            return
        while len(lst) <= p:
            lst.append(None)
        if i == len(path) - 1:
            lst[p] = value
        else:
            if not isinstance(lst[p], list):
                lst[p] = []
            lst = lst[p]


def call_from_slots(tensors: list[tuple[str, Any]]) -> tuple:
    """``(args, kwargs, outputs)`` of a call rebuilt from its slots (``input.0``, ``output.1.0`` …)."""
    args: list[Any] = []
    outs: list[Any] = []
    for slot, t in tensors:
        head, path = slot_path(slot)
        if head == "input" and path and isinstance(path[0], int):
            place(args, path, t)
        elif head == "output":
            place(outs, path, t)
    return tuple(args), {}, tuple(outs)
