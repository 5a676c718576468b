"""``compare_weights``: a PyTorch checkpoint (``.pth``) against a MindSpore one (``.ckpt``).

The MindSpore FAQ's check for a first loss that matches while later ones do not: compare the parameters
after training. Names pair as they are, except the known renames — BatchNorm/LayerNorm
``weight/bias/running_mean/running_var`` ↔ ``gamma/beta/moving_mean/moving_variance``, Embedding
``weight`` ↔ ``embedding_table``; ``num_batches_tracked`` has no MindSpore counterpart (listed, not an
error). ``name_map`` adds or overrides pairs (``{pth name: ckpt name}``).

The result has the parameter counts of both sides (tensors and elements, all and trainable), a shape
table of both sides and, per pair, shape equality, allclose, max/mean ``|diff|`` and cosine.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..dump.json_read import require_regular
from ..frameworks.registry import backend_named
from .metrics import close_report
from .table import TupleTable

#: PyTorch buffers that MindSpore does not have
PT_ONLY = ("num_batches_tracked",)
_PT_BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


@dataclass
class WeightPair:
    pth: str | None
    ckpt: str | None
    pth_shape: tuple[int, ...] | None
    ckpt_shape: tuple[int, ...] | None
    allclose: bool = False
    max_abs_diff: float = math.nan
    mean_abs_diff: float = math.nan
    cosine: float = math.nan
    message: str = ""

    @property
    def shape_match(self) -> bool:
        return self.pth_shape is not None and self.pth_shape == self.ckpt_shape

    @property
    def status(self) -> str:
        if self.pth is None or self.ckpt is None:
            return "unmatched"
        return "pass" if self.allclose else "error"


@dataclass(frozen=True)
class ParamCounts:
    tensors: int
    trainable_tensors: int
    elements: int
    trainable_elements: int


class WeightCompareResult(TupleTable):
    """Pairs of parameters, counts and the shape table of a ``.pth`` / ``.ckpt`` comparison."""

    def __init__(self, rows: list[WeightPair], pth_counts: ParamCounts, ckpt_counts: ParamCounts,
                 pth_shapes: dict[str, tuple[int, ...]], ckpt_shapes: dict[str, tuple[int, ...]],
                 skipped: list[str]) -> None:
        self.rows = rows
        self.pth_counts, self.ckpt_counts = pth_counts, ckpt_counts
        self.pth_shapes, self.ckpt_shapes = pth_shapes, ckpt_shapes
        #: checkpoint entries that are optimizer state, not parameters
        self.skipped = skipped

    @property
    def all_close(self) -> bool:
        return all(r.allclose for r in self.rows if r.pth is not None and r.ckpt is not None)

    @property
    def mismatches(self) -> list[WeightPair]:
        return [r for r in self.rows if r.status == "error"]

    @property
    def unmatched_pth(self) -> list[str]:
        return [r.pth for r in self.rows if r.ckpt is None and r.pth is not None]

    @property
    def unmatched_ckpt(self) -> list[str]:
        return [r.ckpt for r in self.rows if r.pth is None and r.ckpt is not None]

    def counts(self) -> dict[str, ParamCounts]:
        return {"pth": self.pth_counts, "ckpt": self.ckpt_counts}

    def shape_table(self) -> list[tuple[str | None, tuple | None, str | None, tuple | None]]:
        """``(pth name, pth shape, ckpt name, ckpt shape)`` for every parameter of both sides."""
        return [(r.pth, r.pth_shape, r.ckpt, r.ckpt_shape) for r in self.rows]

    COLUMNS = ("pth name", "ckpt name", "pth shape", "ckpt shape", "shape match", "allclose", "max |diff|",
               "mean |diff|", "cosine", "message")

    def records(self) -> list[tuple]:
        return [(r.pth, r.ckpt, r.pth_shape, r.ckpt_shape, r.shape_match, r.allclose, r.max_abs_diff,
                 r.mean_abs_diff, r.cosine, r.message) for r in self.rows]

    def summary(self) -> str:
        p, c = self.pth_counts, self.ckpt_counts
        return (f"pth: {p.tensors} parameters ({p.trainable_tensors} trainable), {p.elements} elements "
                f"({p.trainable_elements} trainable); ckpt: {c.tensors} parameters ({c.trainable_tensors} "
                f"trainable), {c.elements} elements ({c.trainable_elements} trainable); {len(self.mismatches)} "
                f"differ, {len(self.unmatched_pth)} only in pth, {len(self.unmatched_ckpt)} only in ckpt")

    def __repr__(self) -> str:
        return f"<WeightCompareResult {self.summary()}>"

    def _repr_html_(self) -> str:
        colours = {"error": "#f8d0d0", "pass": "#ffffff", "unmatched": "#e4e4e4"}
        head = "".join(f"<th>{c}</th>" for c in self.COLUMNS)
        body = "".join(
            f"<tr style='background:{colours[r.status]}'>"
            + "".join(f"<td>{html.escape('' if v is None else (f'{v:.6g}' if isinstance(v, float) else str(v)))}</td>"
                      for v in rec) + "</tr>"
            for r, rec in zip(self.rows, self.records(), strict=True))
        return f"<div><b>{html.escape(self.summary())}</b><table><tr>{head}</tr>{body}</table></div>"


def _counts(values: Mapping[str, np.ndarray], trainable: set[str]) -> ParamCounts:
    return ParamCounts(len(values), sum(1 for k in values if k in trainable),
                       int(sum(v.size for v in values.values())),
                       int(sum(v.size for k, v in values.items() if k in trainable)))


def _ms_candidates(pt_name: str) -> list[str]:
    path, _, leaf = pt_name.rpartition(".")
    out = [pt_name]
    for alt in backend_named("mindspore").params_from_torch(leaf):
        out.append(f"{path}.{alt}" if path else alt)
    return out


def compare_weights(pth_path: Any, ckpt_path: Any, name_map: Mapping[str, str] | None = None, *,
                    rtol: float = 1e-4, atol: float = 1e-4, trust_pickle: bool = False) -> WeightCompareResult:
    """Compare a PyTorch checkpoint with a MindSpore checkpoint parameter by parameter.

    ``pth_path``: a ``.pth`` file (state dict or pickled module) or an ``nn.Module``; ``ckpt_path``: a
    ``.ckpt`` file or a ``mindspore.nn.Cell``. Trainable counts are exact for modules/cells; for files
    they are inferred (PyTorch buffers ``running_mean/running_var/num_batches_tracked`` and MindSpore
    ``moving_mean/moving_variance`` are not trainable).

    Nothing in the ``.pth`` is executed: it is read with ``torch.load(weights_only=True)``. A file that
    needs the full unpickler (``torch.save(model)``) is refused with a ``ValueError`` saying so, unless
    ``trust_pickle=True`` (only for files you trust: unpickling runs code from the file).
    """
    from ..frameworks.registry import backend_named

    for path in (pth_path, ckpt_path):
        if isinstance(path, (str, os.PathLike)):
            try:
                require_regular(path)
            except ValueError as e:
                raise ValueError(f"{os.fspath(path)}: {e}") from None
    pt, pt_trainable, pt_buffers = backend_named("pytorch").load_weights(pth_path, trust_pickle=trust_pickle)
    if pt_trainable is None:
        pt_trainable = {k for k in pt if k not in pt_buffers and not k.endswith(_PT_BUFFER_SUFFIXES)}
    ms, ms_trainable, skipped = backend_named("mindspore").load_weights(ckpt_path)
    user = dict(name_map or {})
    rows: list[WeightPair] = []
    used: set[str] = set()
    for name, a in pt.items():
        cands = [user[name]] if name in user else _ms_candidates(name)
        hit = next((c for c in cands if c in ms and c not in used), None)
        if hit is None:
            why = "PyTorch-only buffer, no MindSpore counterpart" if name.endswith(PT_ONLY) else \
                "no parameter of that name in the checkpoint"
            rows.append(WeightPair(name, None, tuple(a.shape), None, message=why))
            continue
        used.add(hit)
        b = ms[hit]
        row = WeightPair(name, hit, tuple(a.shape), tuple(b.shape))
        if row.shape_match:
            rep = close_report(a, b, rtol, atol)
            row.allclose, row.max_abs_diff = rep["allclose"], rep["max_abs_diff"]
            row.mean_abs_diff, row.cosine = rep["mean_abs_diff"], rep["cosine"]
        else:
            row.message = f"shapes differ: {list(a.shape)} vs {list(b.shape)}"
        rows.append(row)
    for name, b in ms.items():
        if name not in used:
            rows.append(WeightPair(None, name, None, tuple(b.shape), message="no parameter of that name in the pth"))
    return WeightCompareResult(rows, _counts(pt, pt_trainable), _counts(ms, ms_trainable),
                               {k: tuple(v.shape) for k, v in pt.items()}, {k: tuple(v.shape) for k, v in ms.items()},
                               sorted(skipped))
