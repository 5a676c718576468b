"""Kernels paired with the dump files of one graph run (:func:`match_kernel_files`), and what cannot be paired
with certainty (:class:`Pairing`).

MindSpore names a dump file ``{Op}.{scope}_{Op}-op{N}.…`` but its ``-op{N}`` is its own numbering (under AMP
a scope's ``Cast-op2..op6`` are dumped as ``Cast-op0..op4``; where both count ``op0..op5`` they may name other
kernels), and the runtime may run independent kernels in another order than the execution-order csv. So
neither the name nor the order identifies a file among kernels of one scope and type with the same declared
dtypes and shapes. What does: the data flow. A kernel's input file holds what its producer's output file
holds, and its output file what its consumers' input files hold; so a candidate file is kept for a kernel
only where its statistics agree with those of every neighbour already paired, and pairs are fixed when one
candidate is left (repeated until nothing changes). What is still ambiguous is refused, not guessed.

>>> p = Pairing({"a": {"output.0": "/d/a.npy"}}, {"b": "cannot be told"})
>>> p.files["a"]["output.0"], p.uncertain["b"]
('/d/a.npy', 'cannot be told')
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from ..npy_read import read_npy_shape
from .kernel_graph import Kernel, KernelGraph

_OP_INDEX = re.compile(r"-op\d+$")


@functools.lru_cache(maxsize=1 << 16)
def _scope_type(key: str) -> str:
    """A file key (or kernel's) without its ``-op{N}``: its scope and type (the same keys come every step)."""
    return _OP_INDEX.sub("", key)

#: a file's fingerprint: its dtype, size and statistics (a file that cannot be read: None)
Fingerprint = Callable[[str], object]
#: a file's shape (a file that cannot be read: None)
ShapeOf = Callable[[str], "tuple[int, ...] | None"]


@dataclass
class Pairing:
    """``files``: ``{kernel name: its files}``; ``uncertain``: ``{kernel name: why its files are not shown}``."""

    files: dict[str, dict[str, str]]
    uncertain: dict[str, str] = field(default_factory=dict)


def match_kernel_files(kg: KernelGraph, files: dict[str, dict[str, str]],
                       fingerprint: Fingerprint | None = None, shape_of: ShapeOf | None = None) -> Pairing:
    """Pair the kernels of ``kg`` with the ``files`` of one run (:func:`~.kernel_files.index_files`).

    A scope and type with one kernel and one file pair at once. Otherwise each kernel's candidates are the
    files of its scope and type whose declared dtypes and shapes fit (:func:`_signature_fits`), narrowed by
    the data flow (``fingerprint``: a file's statistics, see the module; ``shape_of``: a file's shape, None
    when unreadable; default: its header, :func:`~nbdebug.frameworks.npy_read.read_npy_shape`). Certain pairs
    are learnt once per graph (``kg.pairing``); a kernel left with several candidates gets its own-named one
    (else the first in dump order) and is listed in ``uncertain`` with the reason (its slots are refused, not shown).
    """
    groups: dict[str, list[Kernel]] = {}
    for k in kg.kernels:
        groups.setdefault(_scope_type(k.file_key), []).append(k)
    spare: dict[str, list[tuple[int, str]]] = {}
    for key, f in files.items():
        if not key.startswith("Parameter."):
            spare.setdefault(_scope_type(key), []).append((int(f.get("__ts__", 0)), key))
    out: dict[str, dict[str, str]] = {}
    open_groups: list[tuple[str, list[Kernel], list[str]]] = []
    for group, kernels in groups.items():
        keys = [key for _ts, key in sorted(spare.get(group, ()))]
        if len(kernels) == 1 and len(keys) == 1:
            out[kernels[0].name] = files[keys[0]]
        elif keys:
            # the pairs learnt from an earlier run hold (the same graph names its files alike every run): only
            # the kernels and files left over are paired by data flow
            learnt = [key for key in keys if key in kg.pairing]
            out.update((kg.pairing[key], files[key]) for key in learnt)
            if learnt:
                done = {kg.pairing[key] for key in learnt}
                kernels = [k for k in kernels if k.name not in done]
                keys = [key for key in keys if key not in kg.pairing]
            if kernels and keys:
                open_groups.append((group, kernels, keys))
    pairing = Pairing(out)
    if open_groups:
        _Resolver(kg, files, fingerprint, pairing, shape_of or _header_shape).run(open_groups)
    return pairing


class _Resolver:
    """Pairs the kernels of the ambiguous groups by data flow (see :func:`match_kernel_files`)."""

    def __init__(self, kg: KernelGraph, files: dict[str, dict[str, str]], fingerprint: Fingerprint | None,
                 pairing: Pairing, shape_of: ShapeOf) -> None:
        self.kg, self.files, self.fp, self.pairing, self.shape_of = kg, files, fingerprint, pairing, shape_of
        self.out = pairing.files
        self.consumers: dict[str, list[tuple[str, str, str]]] = {}  # producer -> (consumer, its slot, out slot)
        for k in kg.kernels:
            for slot, src in k.sources.items():
                if src[0] == "kernel":
                    self.consumers.setdefault(src[1], []).append((k.name, slot, src[2]))

    def run(self, groups: list[tuple[str, list[Kernel], list[str]]]) -> None:
        cands: dict[str, list[str]] = {}
        sizes: dict[str, tuple[int, int]] = {}
        for _group, kernels, keys in groups:
            sigs = {key: _file_signature(self.files[key], self.shape_of) for key in keys}
            for k in kernels:
                # none fits: the declared shapes are not the dumped ones (a reshape the kernel absorbed); the
                # sizes still are
                cands[k.name] = [key for key in keys if _signature_fits(k, sigs[key])] or \
                    [key for key in keys if _signature_fits(k, sigs[key], by_size=True)] or list(keys)
                sizes[k.name] = (len(kernels), len(keys))
        kernels = [k for _g, ks, _keys in groups for k in ks]
        used: set[str] = set()
        changed = True
        while changed:
            changed = False
            for k in kernels:
                if k.name in self.out:
                    continue
                opts = [key for key in cands[k.name] if key not in used and self._agrees(k, key)]
                if not opts:
                    continue
                if len(opts) == 1 or (self.fp is not None and len({self._all_stats(key) for key in opts}) == 1):
                    key = k.file_key if k.file_key in opts else opts[0]  # alike in every slot: either is it
                    self._fix(k, key, used, certain=True)
                    changed = True
        for _group, ks, _keys in groups:
            for k in ks:
                if k.name in self.out:
                    continue
                opts = [key for key in cands[k.name] if key not in used]
                if not opts:
                    continue
                self._fix(k, k.file_key if k.file_key in opts else opts[0], used, certain=False)
                group = _scope_type(k.file_key)
                self.pairing.uncertain[k.name] = (
                    f"not the value used for certain: which of MindSpore's {len(cands[k.name])} dump files of {group} "
                    f"kernels is this kernel's cannot be told (their names and dump order do not identify "
                    f"kernels of one scope and type, and their contents do not tell them apart through the "
                    f"data flow), so a value shown here could be another kernel's")

    def _fix(self, k: Kernel, key: str, used: set[str], certain: bool) -> None:
        self.out[k.name] = self.files[key]
        used.add(key)
        if certain:
            self.kg.pairing[key] = k.name

    def _agrees(self, k: Kernel, key: str) -> bool:
        """Whether the file ``key`` holds, in every slot a paired neighbour also dumped, what that neighbour
        holds (its producers' outputs, its consumers' inputs)."""
        if self.fp is None:
            return True
        mine = self.files[key]
        for slot, src in k.sources.items():
            if src[0] == "kernel" and src[1] in self.out:
                theirs = self.out[src[1]].get(src[2])
                if theirs is not None and slot in mine and self.fp(theirs) != self.fp(mine[slot]):
                    return False
        for consumer, cslot, pslot in self.consumers.get(k.name, ()):
            if consumer in self.out and consumer not in self.pairing.uncertain:
                theirs = self.out[consumer].get(cslot)
                if theirs is not None and pslot in mine and self.fp(theirs) != self.fp(mine[pslot]):
                    return False
        return True

    def _all_stats(self, key: str) -> tuple:
        f = self.files[key]
        return tuple((slot, self.fp(f[slot])) for slot in sorted(f) if not slot.startswith("__"))  # type: ignore[misc]


def _header_shape(path: str) -> tuple[int, ...] | None:
    try:
        return read_npy_shape(path)
    except ValueError:
        return None


def _file_signature(kfiles: dict[str, str], shape_of: ShapeOf) -> dict[str, tuple[str, tuple[int, ...] | None]]:
    return {slot: (kfiles.get(f"__dtype__.{slot}", ""), shape_of(path))
            for slot, path in kfiles.items() if not slot.startswith("__")}


def _signature_fits(k: Kernel, sig: dict[str, tuple[str, tuple[int, ...] | None]], by_size: bool = False) -> bool:
    """Whether a kernel's declared dtypes and shapes fit a file's (``by_size``: the numbers of elements)."""
    if not k.declared:
        return True
    for slot, (dtype, shape) in sig.items():
        want_dtype, want_shape = k.declared.get(slot, ("", None))
        if want_dtype and want_dtype != dtype:
            return False
        if by_size:
            if want_shape is not None and shape is not None and min(want_shape, default=0) >= 0 and \
                    math.prod(want_shape) != math.prod(shape):
                return False
            continue
        if want_shape is not None and shape is not None and (len(want_shape) != len(shape) or any(
                w >= 0 and w != d for w, d in zip(want_shape, shape, strict=True))):  # -1: a dynamic dimension
            return False
    return True
