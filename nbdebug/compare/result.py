"""The result of :func:`nbdebug.compare`: one row per compared tensor, flags, unmatched nodes, and the
first divergent node.

Status of a row (colours of the compare panel): ``error`` (red), ``warning`` (orange), ``pass`` (white),
``unmatched`` (grey). The rules (msProbe's checks) are listed in :mod:`nbdebug.compare.run`.
"""

from __future__ import annotations

import csv
import html
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .metrics import METRIC_NAMES, METRIC_TITLES

STATUSES = ("error", "warning", "pass", "unmatched")


@dataclass
class CompareRow:
    """One tensor of the target run next to its counterpart in the golden run."""

    target: str | None
    golden: str | None
    slot: str
    golden_slot: str | None
    status: str = "pass"
    mode: str = ""
    order: int = 0
    matched_by: str = ""
    target_dtype: str | None = None
    golden_dtype: str | None = None
    target_shape: tuple[int, ...] | None = None
    golden_shape: tuple[int, ...] | None = None
    #: (max, min, mean, norm) of each side
    target_stats: tuple[float, float, float, float] | None = None
    golden_stats: tuple[float, float, float, float] | None = None
    #: target − golden of (max, min, mean, norm), and |diff / golden| in percent
    stat_diff: tuple[float, float, float, float] | None = None
    stat_rel_pct: tuple[float, float, float, float] | None = None
    cosine: float = math.nan
    euc_dist: float = math.nan
    max_abs_err: float = math.nan
    max_rel_err: float = math.nan
    one_thousandth: float = math.nan
    five_thousandths: float = math.nan
    diverged: bool = False
    messages: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """msProbe-style tensor name (``{node}.{slot}``) on the target side (golden when unmatched)."""
        node = self.target if self.target is not None else self.golden
        return f"{node}.{self.slot}"

    @property
    def golden_name(self) -> str | None:
        if self.golden is None:
            return None
        return f"{self.golden}.{self.golden_slot or self.slot}"

    @property
    def is_input(self) -> bool:
        return self.slot.startswith(("input", "parameters"))

    def metrics(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in METRIC_NAMES}


@dataclass(frozen=True)
class Divergence:
    """The first node (in the target's execution order) that is flagged while its inputs are not."""

    node: str
    golden: str | None
    step: int
    order: int
    slots: tuple[str, ...]
    reasons: tuple[str, ...]
    layer: str

    def __str__(self) -> str:
        return self.node

    def describe(self) -> str:
        why = "; ".join(self.reasons[:3])
        return (f"first divergence at {self.node} (golden {self.golden}), layer {self.layer or '-'}, "
                f"{', '.join(self.slots)}: {why}")


CSV_COLUMNS = (
    "Target Name", "Golden Name", "Target Dtype", "Golden Dtype", "Target Tensor Shape", "Golden Tensor Shape",
    *METRIC_TITLES,
    "Target max", "Target min", "Target mean", "Target l2norm", "Golden max", "Golden min", "Golden mean",
    "Golden l2norm", "Max diff", "Min diff", "Mean diff", "L2norm diff", "Max rel diff %", "Min rel diff %",
    "Mean rel diff %", "L2norm rel diff %", "Mode", "Matched by", "Result", "Err_message",
)


def _fmt(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        if math.isnan(x):
            return "N/A"
        return repr(x)
    if isinstance(x, tuple):
        return "[" + ", ".join(str(v) for v in x) + "]"
    return str(x)


class CompareResult:
    """Rows of a comparison, with summaries, the first divergence and CSV export.

    ``rows`` are in the target's execution order, then the golden tensors that matched nothing.
    """

    def __init__(self, rows: list[CompareRow], *, target: Any, golden: Any, target_step: int, golden_step: int,
                 match: str, mode: str, unmatched_target: list[str], unmatched_golden: list[str],
                 pairs: list[tuple[str, str, str]], first_divergence: Divergence | None,
                 target_framework: str, golden_framework: str) -> None:
        self.rows = rows
        self.target = target
        self.golden = golden
        self.target_step = target_step
        self.golden_step = golden_step
        self.match = match
        self.mode = mode
        self.unmatched_target = unmatched_target
        self.unmatched_golden = unmatched_golden
        self.pairs = pairs
        self.first_divergence = first_divergence
        self.target_framework = target_framework
        self.golden_framework = golden_framework
        self._index: dict[tuple[str, str], CompareRow] | None = None

    # -- access -----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[CompareRow]:
        return iter(self.rows)

    def row(self, node: str, slot: str) -> CompareRow:
        """The row of target tensor ``node``/``slot`` (or of golden ``node``/``slot`` when unmatched)."""
        if self._index is None:
            self._index = {}
            for r in self.rows:
                self._index.setdefault((r.target if r.target is not None else r.golden, r.slot), r)
        row = self._index.get((node, slot))
        for side in (self.target, self.golden):  # a live session's name of a dumped slot (``input.weight``)
            if row is not None:
                break
            sess = getattr(side, "session", side)
            slot_of = getattr(sess, "slot_of", None)
            if slot_of is not None and node in getattr(sess, "graph", {}):
                row = self._index.get((node, slot_of(node, slot)))
        if row is None:
            raise KeyError(f"no compared tensor {node} {slot}")
        return row

    def by_status(self, status: str) -> list[CompareRow]:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        return [r for r in self.rows if r.status == status]

    @property
    def errors(self) -> list[CompareRow]:
        return self.by_status("error")

    @property
    def warnings(self) -> list[CompareRow]:
        return self.by_status("warning")

    @property
    def matched(self) -> list[CompareRow]:
        return [r for r in self.rows if r.status != "unmatched"]

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for r in self.rows:
            out[r.status] += 1
        return out

    def summary(self) -> str:
        c = self.counts()
        fd = self.first_divergence
        text = (f"compare step {self.target_step} ({self.target_framework}) vs golden step {self.golden_step} "
                f"({self.golden_framework}), match={self.match}: {c['error']} error, {c['warning']} warning, "
                f"{c['pass']} pass, {c['unmatched']} unmatched rows; unmatched nodes: "
                f"{len(self.unmatched_target)} target, {len(self.unmatched_golden)} golden")
        text += f"; first divergence: {fd.node}" if fd else "; no divergence"
        return text

    def __repr__(self) -> str:
        return f"<nbdebug.CompareResult {self.summary()}>"

    # -- export -----------------------------------------------------------------------------------
    def records(self) -> list[dict[str, Any]]:
        """One dict per row with the CSV columns."""
        out = []
        for r in self.rows:
            ts = r.target_stats or (None,) * 4
            gs = r.golden_stats or (None,) * 4
            d = r.stat_diff or (None,) * 4
            p = r.stat_rel_pct or (None,) * 4
            values = (r.name if r.target is not None else None, r.golden_name, r.target_dtype, r.golden_dtype,
                      r.target_shape, r.golden_shape, *(getattr(r, k) for k in METRIC_NAMES), *ts, *gs, *d, *p,
                      r.mode, r.matched_by, r.status, "; ".join(r.messages))
            out.append(dict(zip(CSV_COLUMNS, values, strict=True)))
        return out

    def to_csv(self, path: str | os.PathLike) -> str:
        """Write the rows as CSV (msProbe-like columns); returns the path."""
        path = os.fspath(path)
        with open(path, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(CSV_COLUMNS)
            for rec in self.records():
                w.writerow([_fmt(rec[c]) for c in CSV_COLUMNS])
        return path

    def to_dataframe(self) -> Any:
        """The rows as a ``pandas.DataFrame`` (pandas needed)."""
        import pandas as pd

        return pd.DataFrame(self.records(), columns=list(CSV_COLUMNS))

    # -- display ----------------------------------------------------------------------------------
    def panel(self) -> Any:
        """The interactive compare panel (sortable, filterable, colour-coded; click a row for details)."""
        from ..features import feature

        return feature("compare_panel")(self)

    def _repr_html_(self) -> str:
        colours = {"error": "#f8d0d0", "warning": "#fde2b8", "pass": "#ffffff", "unmatched": "#e4e4e4"}
        shown = [r for r in self.rows if r.status in ("error", "warning")][:30] or self.rows[:30]
        head = "".join(f"<th>{h}</th>" for h in ("tensor", "golden", "status", "Cosine", "MaxAbsErr",
                                                   "Norm rel diff %", "message"))
        body = []
        for r in shown:
            rel = r.stat_rel_pct[3] if r.stat_rel_pct else math.nan
            cells = (r.name, r.golden_name or "", r.status, _short(r.cosine), _short(r.max_abs_err), _short(rel),
                     "; ".join(r.messages)[:160])
            body.append(f"<tr style='background:{colours[r.status]}'>"
                        + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
        return (f"<div><b>{html.escape(self.summary())}</b><table><tr>{head}</tr>{''.join(body)}</table>"
                f"<i>{len(self.rows)} rows; .panel() for the interactive view</i></div>")


def _short(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "N/A"
    return f"{x:.6g}"
