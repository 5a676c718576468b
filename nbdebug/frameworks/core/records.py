"""What the capture core knows of one tensor in a step, and how call arguments are named.

A :class:`Seen` is one measurement of one tensor object (at one version where the framework has a
version counter): its statistics row, metadata (``dtype`` None while the framework defers it), the
retention handle offered for it and the node slot that produced it. The flatteners name a call's
tensors as msProbe does (``input.0``, ``input.1.0``, ``output.0`` ...).

>>> flatten, outputs, arguments = flatteners(str)
>>> list(flatten(("a", ["b", "c"]), "input"))
[('input.0', 'a'), ('input.1.0', 'b'), ('input.1.1', 'c')]
>>> list(outputs("t"))
[('output.0', 't')]
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from ...session.store import NotRetainedError


class Seen:
    """One measured tensor of the step: row and metadata, retention handle, producer slot."""

    __slots__ = ("ref", "version", "row", "dtype", "why", "shape", "count", "nbytes", "handle", "producer",
                 "copy")

    def __init__(self, ref: Any, version: int, row: int, dtype: str | None, why: str | None,
                 shape: tuple[int, ...] = (), count: int = 0, nbytes: int | None = None, copy: Any = None) -> None:
        self.ref, self.version, self.row, self.dtype, self.why = ref, version, row, dtype, why
        self.shape, self.count, self.nbytes = shape, count, nbytes
        self.handle: Any = None
        self.producer: tuple[str, str] | None = None
        #: a private copy taken when the tensor was measured (the framework could not trust a reference)
        self.copy = copy

    def alias(self, ref: Any, version: int) -> Seen:
        """The same record for another tensor object holding the same value (an identity / view)."""
        out = Seen(ref, version, self.row, self.dtype, self.why, self.shape, self.count, self.nbytes, self.copy)
        out.handle, out.producer = self.handle, self.producer
        return out


class Size:
    """A handle that only states a size (for a tensor refused for the memory budget)."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def numpy(self):  # pragma: no cover - never stored
        raise NotRetainedError("not retained")


def flatteners(tensor_type: Any) -> tuple[Callable[..., Any], ...]:
    """``(flatten, outputs, arguments)`` for one framework's tensor type (closures: no per-call binding).

    ``flatten(obj, prefix)`` names nested tensors (``input.1.0``); ``outputs(obj, prefix="output")``: a lone
    tensor is ``output.0``; ``arguments(args, kwargs)``: positional ``input.{i}``, keyword ``input.{name}``.
    ``outputs`` and ``arguments`` return lists, built without generators for the common flat case (the
    per-op hot path)."""

    def flatten(obj: Any, prefix: str) -> Iterator[tuple[str, Any]]:
        if isinstance(obj, tensor_type):
            yield prefix, obj
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                yield from flatten(item, slot_name(prefix, i))
        elif isinstance(obj, dict):
            for k, item in obj.items():
                yield from flatten(item, f"{prefix}.{k}")

    def items(seq: Any, prefix: str, out: list[tuple[str, Any]]) -> None:
        """``out.extend(flatten(seq, prefix))`` for a list or tuple: a flat list of tensors (``torch.cat``'s,
        a ``_foreach``/fused optimizer op's) without a generator per item."""
        names = _item_names(prefix, len(seq))
        if names is None:
            out.extend(flatten(seq, prefix))
            return
        for j, item in enumerate(seq):
            if isinstance(item, tensor_type):
                out.append((names[j], item))
            elif isinstance(item, _NESTED):
                out.extend(flatten(item, names[j]))

    def outputs(obj: Any, prefix: str = "output") -> list[tuple[str, Any]]:
        if isinstance(obj, tensor_type):
            return [(_OUTPUT0 if prefix == "output" else f"{prefix}.0", obj)]
        if isinstance(obj, _SEQUENCES):
            out: list[tuple[str, Any]] = []
            items(obj, prefix, out)
            return out
        return list(flatten(obj, prefix))

    def arguments(args: tuple, kwargs: dict | None = None) -> list[tuple[str, Any]]:
        out = []
        for i, a in enumerate(args):
            if isinstance(a, tensor_type):
                out.append((_INPUTS[i] if i < _N_NAMED else f"input.{i}", a))
            elif isinstance(a, _SEQUENCES):
                items(a, _INPUTS[i] if i < _N_NAMED else f"input.{i}", out)
            elif isinstance(a, _NESTED):
                out.extend(flatten(a, f"input.{i}"))
        if kwargs:
            for k, v in kwargs.items():
                if isinstance(v, tensor_type):
                    out.append((f"input.{k}", v))
                elif isinstance(v, _NESTED):
                    out.extend(flatten(v, f"input.{k}"))
        return out

    return flatten, outputs, arguments


_NESTED = (list, tuple, dict)
_SEQUENCES = (list, tuple)
# the common slot names as the same string objects every step: a step's keys then compare (and hash) as
# the last step's did, by identity
_N_NAMED = 64
_INPUTS = tuple(sys.intern(f"input.{i}") for i in range(_N_NAMED))
_OUTPUT0 = sys.intern("output.0")
_NAMES: dict[tuple[str, int], str] = {}


def slot_name(prefix: str, i: int) -> str:
    """``f"{prefix}.{i}"``, the same string object every time (for names seen before)."""
    key = (prefix, i)
    name = _NAMES.get(key)
    if name is None:
        name = f"{prefix}.{i}"
        if len(_NAMES) < 100_000:
            _NAMES[key] = name
    return name


#: prefix -> the names of its items (``slot_name(prefix, j)``, the same string objects) for lists up to
#: ``_MAX_ITEMS`` long; longer ones are named one by one
_ITEM_NAMES: dict[str, list[str]] = {}
_MAX_ITEMS = 4096


def _item_names(prefix: str, n: int) -> list[str] | None:
    """``[slot_name(prefix, j) for j in range(n)]`` or longer, made once per prefix; None past the bound."""
    names = _ITEM_NAMES.get(prefix)
    if names is not None and len(names) >= n:
        return names
    if n > _MAX_ITEMS or (names is None and len(_ITEM_NAMES) >= 1024):
        return None
    names = _ITEM_NAMES[prefix] = [slot_name(prefix, j) for j in range(max(n, 8))]
    return names


def user_stack(framework_dir: str, limit: int = 8) -> list[str]:
    """The caller's Python frames, innermost first, without the framework's and nbdebug's own frames."""
    out: list[str] = []
    f = sys._getframe(2)
    while f is not None and len(out) < limit:
        fn = f.f_code.co_filename
        if framework_dir not in fn and "/nbdebug/frameworks/" not in fn and "/nbdebug/control/" not in fn:
            out.append(f"File {fn}, line {f.f_lineno}, in {f.f_code.co_name}")
        f = f.f_back
    return out
