"""The hit list: watchpoint hits grouped by node, in execution order (step, then order in the step), and
apart from them the notices (tensors a watchpoint could not check, and why).

Only a record in which a watchpoint fired is a hit (``record.hits`` non-empty); a record without fired
parameters is a *notice* ("could not check …: value not retained", …). The title counts hits only
(``Hits (N)``, the same number as the header and the status item, see
:func:`nbdebug.watch.watchpoints.count_hits`); notices sit in their own area below (``nbdebug-hit-notices``,
titled ``Could not check (M)``) and are never counted as hits.

Hits are grouped by node and condition (``nbdebug-hit-group``: one header per node and condition naming
the steps and the count, at most :data:`ROWS_PER_GROUP` of its records below) and paged
(:data:`PAGE_GROUPS` groups a page, ``nbdebug-hit-pager``), with a summary per condition above
(``nbdebug-hit-summary``): thousands of hits stay a few dozen widgets, so a panel stays small over the
websocket and in a saved notebook. Each record row (``nbdebug-hit-row``) shows the condition and slot, and
for every parameter that fired the threshold that was set against the actual value. Clicking the row's
main button (``nbdebug-hit-select``) selects the node; ``View`` (``nbdebug-hit-view``) opens the tensor
view on the hit's tensor. Rows are rebuilt only when the records or the page change.

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
from ipywidgets.widgets.widget_string import HTMLStyle

from ..watch.conditions import Firing
from ..watch.temporal import ADVICE
from ..watch.watchpoints import count_hits

#: groups (node and condition) on one page of the hit list
PAGE_GROUPS = 10
#: records listed under a group's header (the header counts them all)
ROWS_PER_GROUP = 2
#: notices listed (their title counts them all)
MAX_NOTICES = 20
MAX_ROWS = PAGE_GROUPS * ROWS_PER_GROUP


def hit_text(h: Any) -> str:
    """Threshold vs actual of a hit record, e.g. ``max_gt = 1 set, actual max = 3.2``; for a watchpoint over
    time also its baseline (:func:`band_text`)."""
    text = Firing(h.condition, -1, h.hits, h.error, h.unchecked).describe()
    text = text.split(": ", 1)[1] if ": " in text else text
    band = band_text(h)
    return f"{text} — {band}" if band else text


def band_text(h: Any) -> str:
    """A temporal hit's baseline against its value and the step it left its band (SPIKE/DRIFT/STALL), or the
    ranks' median (ODD_RANK) — the part of its ``advice`` before the guide; ``""`` for the 17 conditions.

    >>> from types import SimpleNamespace as R
    >>> band_text(R(condition="SPIKE", advice="value 50 against median 5, mean 5.1, std 0.5 over the previous "
    ...             "20 steps; left its band at step 25. " + ADVICE["SPIKE"]))
    'value 50 against median 5, mean 5.1, std 0.5 over the previous 20 steps; left its band at step 25'
    """
    guide = ADVICE.get(getattr(h, "condition", ""))
    advice = getattr(h, "advice", "") or ""
    if guide is None or guide not in advice:
        return ""
    return advice.split(guide, 1)[0].strip().rstrip(".")


def group_hits(records: list[Any]) -> list[tuple[tuple[str, str], list[Any]]]:
    """Records (in execution order) grouped by node and condition, groups in the order of their first record.

    >>> from types import SimpleNamespace as R
    >>> rs = [R(node="a", condition="TO", step=1), R(node="b", condition="TO", step=1),
    ...       R(node="a", condition="TO", step=2)]
    >>> [(k, len(v)) for k, v in group_hits(rs)]
    [(('a', 'TO'), 2), (('b', 'TO'), 1)]
    """
    groups: list[tuple[tuple[str, str], list[Any]]] = []
    index: dict[tuple[str, str], int] = {}
    for h in records:
        key = (h.node, h.condition)
        i = index.get(key)
        if i is None:
            index[key] = len(groups)
            groups.append((key, [h]))
        else:
            groups[i][1].append(h)
    return groups


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


def steps_text(steps: list[int]) -> str:
    """``step 3``, ``steps 1, 4`` or ``steps 1–9`` (a run with no gap)."""
    u = sorted(set(steps))
    if len(u) == 1:
        return f"step {u[0]}"
    if u[-1] - u[0] + 1 == len(u):
        return f"steps {u[0]}–{u[-1]}"
    return "steps " + ", ".join(map(str, u[:6])) + (" …" if len(u) > 6 else "")


def summary_text(hits: list[Any]) -> str:
    """Per condition: how many hits on how many nodes, e.g. ``TO 5128 on 812 nodes``."""
    per: dict[str, tuple[int, set[str]]] = {}
    for h in hits:
        n, nodes = per.get(h.condition, (0, set()))
        nodes.add(h.node)
        per[h.condition] = (n + 1, nodes)
    return " · ".join(f"{c} {n} on {len(nodes)} node{'s' if len(nodes) != 1 else ''}"
                      for c, (n, nodes) in per.items())


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
        self.page = 0
        self._groups: list[tuple[tuple[str, str], list[Any]]] = []
        self._boxes: dict[tuple[str, str], tuple[w.VBox, w.HTML, Any]] = {}  # the shown groups' widgets
        # one Layout and one style model per kind of element, shared by every row (a model each would be
        # most of a panel's bytes over the websocket and in a saved notebook)
        self._layouts = {
            "select": w.Layout(width="auto", max_width="min(420px, calc(100% - 64px))"),  # View fits beside it
            "view": w.Layout(width="52px"),
            "plain": w.Layout(),
            # flex "0 0 auto": rows keep their height and the list scrolls (they would shrink and overlap)
            "row": w.Layout(align_items="center", flex_flow="row wrap", flex="0 0 auto"),
            "group": w.Layout(flex="0 0 auto", border_left="3px solid #cf222e", padding="0 0 0 4px",
                              margin="0 0 4px 0"),
            "notice": w.Layout(flex="0 0 auto"),
        }
        self._styles = {"button": w.ButtonStyle(), "html": HTMLStyle()}
        self._shared = {id(x) for x in [*self._layouts.values(), *self._styles.values()]}
        self._empty = w.HTML("<i>no hits</i>")
        self.summary = w.HTML("")
        self.summary.add_class("nbdebug-hit-summary")
        self.prev = w.Button(description="‹", tooltip="previous page", layout=w.Layout(width="32px"))
        self.next = w.Button(description="›", tooltip="next page", layout=w.Layout(width="32px"))
        self.prev.on_click(lambda _b: self.page_to(self.page - 1))
        self.next.on_click(lambda _b: self.page_to(self.page + 1))
        self.pager_label = w.HTML("")
        self.pager = w.HBox([self.prev, self.pager_label, self.next],
                            layout=w.Layout(display="none", align_items="center"))
        self.pager.add_class("nbdebug-hit-pager")
        self.notice_title = w.HTML("")
        self.notice_title.add_class("nbdebug-hit-notice-title")
        self.notice_list = w.VBox([], layout=w.Layout(max_height="140px", overflow="auto"))
        self.notice_box = w.VBox([self.notice_title, self.notice_list], layout=w.Layout(display="none"))
        self.notice_box.add_class("nbdebug-hit-notices")
        self.widget = w.VBox([self.title, self.summary, self.list, self.pager, self.note, self.notice_box])
        self.widget.add_class("nbdebug-hits")
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        records = list(self.source.hits)
        sig = (len(records),) + tuple((h.watchpoint, h.node, h.slot, h.step, h.hits, h.error) for h in records)
        if sig == self._sig and not force:
            return
        self._sig = sig
        self.hits = [h for h in records if h.hits]
        self.notices = [h for h in records if not h.hits]
        self._groups = group_hits(self.hits)
        self._show_page()
        self.title.value = f"<b>Hits</b> ({count_hits(records)})"
        many = len(self._groups) > 1 and len(self.hits) > len(self._groups)
        self.summary.value = f"<small>{html.escape(summary_text(self.hits))}</small>" if many else ""
        self.notice_list.children = [self._notice(h) for h in self.notices[:MAX_NOTICES]]
        more = len(self.notices) - MAX_NOTICES
        self.notice_title.value = (f"<b>Could not check</b> ({len(self.notices)})"
                                   + (f" <small>first {MAX_NOTICES} listed</small>" if more > 0 else ""))
        self.notice_box.layout.display = "flex" if self.notices else "none"

    @property
    def pages(self) -> int:
        return max(1, -(-len(self._groups) // PAGE_GROUPS))

    def page_to(self, page: int) -> None:
        """Show page ``page`` (0-based, clamped) of the groups."""
        self.page = min(max(0, page), self.pages - 1)
        self._show_page()

    def _show_page(self) -> None:
        self.page = min(self.page, self.pages - 1)
        first = self.page * PAGE_GROUPS
        shown = self._groups[first:first + PAGE_GROUPS]
        boxes, kept = [], {}
        for key, rs in shown:
            box = self._group(key, rs)
            kept[key] = self._boxes[key]
            boxes.append(box)
        for key, (box, _head, _sig) in self._boxes.items():  # groups no longer shown: their widgets go
            if key not in kept:
                _close(box, self._shared)
        self._boxes = kept
        children = boxes or [self._empty]
        if list(self.list.children) != children:
            self.list.children = children
        n = len(self._groups)
        self.pager_label.value = (f"<small>groups {first + 1}–{first + len(shown)} of {n} "
                                  f"(node · condition)</small>")
        self.prev.disabled = self.page == 0
        self.next.disabled = self.page >= self.pages - 1
        self.pager.layout.display = "flex" if n > PAGE_GROUPS else "none"
        self.note.value = ""

    def _group(self, key: tuple[str, str], records: list[Any]) -> w.VBox:
        """The group's box: built once, then only its title changes while its listed records stay the same
        (thousands of hits arriving do not rebuild rows, nor leave closed-over widgets in the browser)."""
        node, condition = key
        n = len(records)
        more = f" · {ROWS_PER_GROUP} listed" if n > ROWS_PER_GROUP else ""
        born = ("<span class='nbdebug-hit-origin' title='a NaN/Inf starts here (first_nonfinite)'>origin</span> "
                if any(getattr(h, "origin", False) for h in records) else "")
        title = (f"{born}<b>{html.escape(node)}</b> <small>· {html.escape(condition)} · "
                 f"{steps_text([h.step for h in records])} · {n} hit{'s' if n != 1 else ''}{more}</small>")
        listed = records[:ROWS_PER_GROUP]
        sig = tuple((h.watchpoint, h.slot, h.step, h.hits) for h in listed)
        old = self._boxes.get(key)
        if old is not None and old[2] == sig:
            if old[1].value != title:
                old[1].value = title
            return old[0]
        if old is not None:
            _close(old[0], self._shared)
        head = w.HTML(title, layout=self._layouts["plain"], style=self._styles["html"],
                      _dom_classes=("nbdebug-hit-group-title",))
        box = w.VBox([head] + [self._row(h) for h in listed], layout=self._layouts["group"],
                     _dom_classes=("nbdebug-hit-group",))
        self._boxes[key] = (box, head, sig)
        return box

    def _row(self, h: Any) -> w.HBox:
        lay, sty = self._layouts, self._styles
        sel = w.Button(description=f"{h.condition} · {h.slot}",  # node: the group's title
                       tooltip=f"watchpoint #{h.watchpoint}: {h.node} {h.slot}, step {h.step} — select the node",
                       layout=lay["select"], style=sty["button"], _dom_classes=("nbdebug-hit-select",))
        sel.on_click(lambda _b: self.on_select(h.node))
        detail = w.HTML(f"<small style='color:#cf222e'>{html.escape(hit_text(h))}</small>", layout=lay["plain"],
                        style=sty["html"], _dom_classes=("nbdebug-hit-detail",))
        view = w.Button(description="View", layout=lay["view"], style=sty["button"], tooltip="open the tensor view",
                        _dom_classes=("nbdebug-hit-view",))
        view.on_click(lambda _b: self.on_view(h))
        # classes given at creation: add_class would cost a message per widget over the websocket
        row = w.HBox([sel, view, detail], layout=lay["row"], _dom_classes=("nbdebug-hit-row", "nbdebug-hit-hit"))
        return row

    def _notice(self, h: Any) -> w.HTML:
        text = f"{h.condition} · {h.node} {h.slot} · step {h.step}: {hit_text(h)}"
        row = w.HTML(f"<small style='color:#8c6d1f'>{html.escape(text)}</small>",
                     layout=self._layouts["notice"], style=self._styles["html"],
                     _dom_classes=("nbdebug-hit-notice", "nbdebug-hit-unchecked"))
        return row

    def rows(self) -> list[w.HBox]:
        """The hit rows (notices excluded), in order."""
        return [r for g in self.list.children if isinstance(g, w.VBox) for r in g.children
                if isinstance(r, w.HBox)]

    def groups(self) -> list[w.VBox]:
        return [g for g in self.list.children if isinstance(g, w.VBox)]

    def notice_rows(self) -> list[w.HTML]:
        return list(self.notice_list.children)


def _close(box: w.Widget, shared: set[int] = frozenset()) -> None:
    """Close a widget and everything in it (the browser drops their models), but not the ``shared`` models."""
    stack = [box]
    while stack:
        wd = stack.pop()
        stack.extend(getattr(wd, "children", ()))
        for part in (getattr(wd, "layout", None), getattr(wd, "style", None)):  # models of their own
            if isinstance(part, w.Widget) and id(part) not in shared:
                part.close()
        wd.close()
