"""The hit list: watchpoint hits grouped by node, in execution order (step, then order in the step), and
apart from them the notices (tensors a watchpoint could not check, and why).

Only a record in which a watchpoint fired is a hit (``record.hits`` non-empty); a record without fired
parameters is a *notice* ("could not check …: value not retained", …). The title counts hits only
(``Hits (N)``, the same number as the header and the status item, see
:func:`nbdebug.watch.watchpoints.count_hits`); notices sit in their own area below (``nbdebug-hit-notices``,
titled ``Could not check (M)``) and are never counted as hits.

Hits are grouped by node (``nbdebug-hit-group``: one header per node and step, the node's records below).
Each record row (``nbdebug-hit-row``) shows the condition and slot (the group's title names the node and
step), and for every parameter that fired the threshold that was set against the actual value. Clicking
the row's main button (``nbdebug-hit-select``) selects the node; ``View`` (``nbdebug-hit-view``) opens
the tensor view on the hit's tensor. Rows are rebuilt only when the records change.

>>> from nbdebug.watch.watchpoints import HitRecord
>>> from nbdebug.watch.conditions import Hit
>>> hit = HitRecord(1, "TO", "log", "output.0", 3, 0, (Hit("nan_count", 0.0, 1.0),), None, (), "")
>>> notice = HitRecord(2, "WCL", "fc.weight", "output.0", 3, 1, (), "value_not_retained", ("WCL",), "")
>>> class Src:
...     hits = [hit, notice]
>>> hl = HitList(Src())
>>> hl.title.value, len(hl.rows()), len(hl.notice_rows()), hl.notice_title.value
('<b>Hits</b> (1)', 1, 1, '<b>Could not check</b> (1)')
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..watch.conditions import Firing
from ..watch.watchpoints import count_hits

MAX_ROWS = 200


def hit_text(h: Any) -> str:
    """Threshold vs actual of a hit record, e.g. ``max_gt = 1 set, actual max = 3.2``."""
    text = Firing(h.condition, -1, h.hits, h.error, h.unchecked).describe()
    return text.split(": ", 1)[1] if ": " in text else text


def group_by_node(records: list[Any]) -> list[tuple[tuple[int, str], list[Any]]]:
    """Consecutive records (already in execution order) of the same step and node, as groups."""
    groups: list[tuple[tuple[int, str], list[Any]]] = []
    index: dict[tuple[int, str], int] = {}
    for h in records:
        key = (h.step, h.node)
        i = index.get(key)
        if i is None:
            index[key] = len(groups)
            groups.append((key, [h]))
        else:
            groups[i][1].append(h)
    return groups


class HitList:
    """``on_select(name)`` when a row is clicked, ``on_view(hit)`` for its View button."""

    def __init__(self, source: Any, on_select: Callable[[str], Any] = lambda name: None,
                 on_view: Callable[[Any], Any] = lambda hit: None) -> None:
        self.source = source
        self.on_select = on_select
        self.on_view = on_view
        self._sig: Any = None
        self.hits: list[Any] = []
        self.notices: list[Any] = []
        self.title = w.HTML("<b>Hits</b>")
        self.title.add_class("nbdebug-hit-title")
        self.list = w.VBox([], layout=w.Layout(max_height="260px", overflow="auto"))
        self.list.add_class("nbdebug-hit-list")
        self.note = w.HTML("")
        self.notice_title = w.HTML("")
        self.notice_title.add_class("nbdebug-hit-notice-title")
        self.notice_list = w.VBox([], layout=w.Layout(max_height="140px", overflow="auto"))
        self.notice_box = w.VBox([self.notice_title, self.notice_list], layout=w.Layout(display="none"))
        self.notice_box.add_class("nbdebug-hit-notices")
        self.widget = w.VBox([self.title, self.list, self.note, self.notice_box])
        self.widget.add_class("nbdebug-hits")
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        records = list(self.source.hits)
        sig = tuple((h.watchpoint, h.node, h.slot, h.step, h.hits, h.error) for h in records)
        if sig == self._sig and not force:
            return
        self._sig = sig
        self.hits = [h for h in records if h.hits]
        self.notices = [h for h in records if not h.hits]
        shown = self.hits[:MAX_ROWS]
        groups = [self._group(key, rs) for key, rs in group_by_node(shown)]
        self.list.children = groups or [w.HTML("<i>no hits</i>")]
        self.title.value = f"<b>Hits</b> ({count_hits(records)})"
        self.note.value = (f"<small>first {MAX_ROWS} of {len(self.hits)} shown</small>"
                           if len(self.hits) > MAX_ROWS else "")
        self.notice_list.children = [self._notice(h) for h in self.notices[:MAX_ROWS]]
        self.notice_title.value = f"<b>Could not check</b> ({len(self.notices)})"
        self.notice_box.layout.display = "flex" if self.notices else "none"

    def _group(self, key: tuple[int, str], records: list[Any]) -> w.VBox:
        step, node = key
        n = len(records)
        head = w.HTML(f"<b>{html.escape(node)}</b> <small>· step {step} · {n} hit{'s' if n != 1 else ''}</small>")
        head.add_class("nbdebug-hit-group-title")
        box = w.VBox([head] + [self._row(h) for h in records],
                     layout=w.Layout(flex="0 0 auto", border_left="3px solid #cf222e", padding="0 0 0 4px",
                                     margin="0 0 4px 0"))
        box.add_class("nbdebug-hit-group")
        return box

    def _row(self, h: Any) -> w.HBox:
        sel = w.Button(description=f"{h.condition} · {h.slot}",  # node and step: the group's title
                       tooltip=f"watchpoint #{h.watchpoint}: {h.node} {h.slot}, step {h.step} — select the node",
                       layout=w.Layout(width="auto", max_width="min(420px, calc(100% - 64px))"))  # View fits beside it
        sel.add_class("nbdebug-hit-select")
        sel.on_click(lambda _b: self.on_select(h.node))
        detail = w.HTML(f"<small style='color:#cf222e'>{html.escape(hit_text(h))}</small>")
        detail.add_class("nbdebug-hit-detail")
        view = w.Button(description="View", layout=w.Layout(width="52px"), tooltip="open the tensor view")
        view.add_class("nbdebug-hit-view")
        view.on_click(lambda _b: self.on_view(h))
        # flex "0 0 auto": rows keep their height and the list scrolls (they would shrink and overlap)
        row = w.HBox([sel, view, detail], layout=w.Layout(align_items="center", flex_flow="row wrap", flex="0 0 auto"))
        row.add_class("nbdebug-hit-row")
        row.add_class("nbdebug-hit-hit")
        return row

    def _notice(self, h: Any) -> w.HTML:
        text = f"{h.condition} · {h.node} {h.slot} · step {h.step}: {hit_text(h)}"
        row = w.HTML(f"<small style='color:#8c6d1f'>{html.escape(text)}</small>",
                     layout=w.Layout(flex="0 0 auto"))
        row.add_class("nbdebug-hit-notice")
        row.add_class("nbdebug-hit-unchecked")
        return row

    def rows(self) -> list[w.HBox]:
        """The hit rows (notices excluded), in order."""
        return [r for g in self.list.children if isinstance(g, w.VBox) for r in g.children
                if isinstance(r, w.HBox)]

    def groups(self) -> list[w.VBox]:
        return [g for g in self.list.children if isinstance(g, w.VBox)]

    def notice_rows(self) -> list[w.HTML]:
        return list(self.notice_list.children)
