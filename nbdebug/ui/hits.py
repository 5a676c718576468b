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
(``nbdebug-hit-summary``). Each record row (``nbdebug-hit-row``) shows the condition and slot, and
for every parameter that fired the threshold that was set against the actual value. Clicking the row's
main button (``nbdebug-hit-select``) selects the node; ``View`` (``nbdebug-hit-view``) opens the tensor
view on the hit's tensor.

The shown page and its pager are drawn in the browser by one widget (``frontend/src/hits.ts``) from one
``hits`` message, sent again only when what it shows changed: a page of hits is one widget model, not
~140 (a model per button, label, box, layout and style: most of a hit panel's time to open, in messages
through the kernel, the server and the browser). Kernel side :meth:`HitList.groups` and
:meth:`HitList.rows` are what it shows; a row's ``click()`` is the browser's click.

>>> from nbdebug.watch.watchpoints import HitRecord
>>> from nbdebug.watch.conditions import Hit
>>> hit = HitRecord(1, "TO", "log", "output.0", 3, 0, (Hit("nan_count", 0.0, 1.0),), None, (), "")
>>> notice = HitRecord(2, "WCL", "fc.weight", "output.0", 3, 1, (), "value_not_retained", ("WCL",), "")
>>> class Src:
...     hits = [hit, notice]
>>> hl = HitList(Src())
>>> hl.title.value, len(hl.rows()), len(hl.notice_rows()), hl.notice_title.value
('<b>Hits</b> (1)', 1, 1, '<b>Could not check</b> (1)')
>>> [m["groups"][0]["rows"][0][0] for m in hl.list.recorded()]   # the message the browser draws
['TO · output.0']
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
from .frontend import FrontendWidget
from .kit import Kit

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


def groups_summary(groups: list[tuple[tuple[str, str], list[Any]]]) -> str:
    """:func:`summary_text` of the hits in ``groups`` (:func:`group_hits`), from the groups alone: a group
    is one node and one condition, so a condition's nodes are its groups.

    >>> from types import SimpleNamespace as R
    >>> rs = [R(node=n, condition=c, step=1) for n, c in [("a", "TO"), ("b", "GE"), ("a", "TO"), ("c", "TO")]]
    >>> groups_summary(group_hits(rs)) == summary_text(rs) == "TO 3 on 2 nodes · GE 1 on 1 node"
    True
    """
    per: dict[str, list[int]] = {}
    for (_node, condition), records in groups:
        n = per.setdefault(condition, [0, 0])
        n[0] += len(records)
        n[1] += 1
    return " · ".join(f"{c} {n} on {k} node{'s' if k != 1 else ''}" for c, (n, k) in per.items())


class Shown:
    """A text the browser shows (a group's title, a row's detail): its HTML as ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: str) -> None:
        self.value = value


class Action:
    """A button of a hit row as the browser draws it; :meth:`click` does what the browser's click does."""

    __slots__ = ("description", "tooltip", "_act")

    def __init__(self, description: str, tooltip: str, act: Callable[[], Any]) -> None:
        self.description, self.tooltip, self._act = description, tooltip, act

    def click(self) -> None:
        self._act()


class HitRow:
    """One listed hit record: ``children`` = (select :class:`Action`, View :class:`Action`, detail
    :class:`Shown`), in the browser's order."""

    __slots__ = ("hit", "children")

    def __init__(self, hit: Any, children: tuple[Action, Action, Shown]) -> None:
        self.hit, self.children = hit, children


class HitGroup:
    """One group (node and condition) of the shown page: ``children`` = [title :class:`Shown`, *rows]."""

    __slots__ = ("key", "children")

    def __init__(self, key: tuple[str, str], children: list[Any]) -> None:
        self.key, self.children = key, children


class HitList:
    """``on_select(name)`` when a row is clicked, ``on_view(hit)`` for its View button.

    The shown page of groups and the pager are one :class:`~nbdebug.ui.frontend.FrontendWidget`
    (``view="hits"``, ``frontend/src/hits.ts``) fed one ``hits`` message; :meth:`groups` and :meth:`rows`
    are what it shows, kernel side."""

    def __init__(self, source: Any, on_select: Callable[[str], Any] = lambda name: None,
                 on_view: Callable[[Any], Any] = lambda hit: None) -> None:
        self.source = source
        self.on_select = on_select
        self.on_view = on_view
        self._sig: Any = None
        self._notice_sig: Any = None
        self.hits: list[Any] = []
        self.notices: list[Any] = []
        # one Layout and one style model shared by the labels (a model each is a message and saved state each)
        kit = self.kit = Kit()
        self.title = self._label("<b>Hits</b>", "nbdebug-hit-title")
        self.list = FrontendWidget(view="hits", height=260, layout=kit.layout())
        self.page = 0
        self._groups: list[tuple[tuple[str, str], list[Any]]] = []
        self._shown: list[HitGroup] = []  # the groups of the shown page
        self._rev = 0  # the page last sent; a click names the page it was made on
        self._cache: dict[tuple[str, str], tuple[Any, HitGroup]] = {}  # a shown group's rows, while unchanged
        self.list.handle("hit-click", self._clicked)
        self.summary = self._label("", "nbdebug-hit-summary")
        self.notice_title = self._label("", "nbdebug-hit-notice-title")
        self.notice_list = w.VBox([], layout=w.Layout(max_height="140px", overflow="auto"))
        self.notice_box = w.VBox([self.notice_title, self.notice_list], layout=w.Layout(display="none"),
                                 _dom_classes=("nbdebug-hit-notices",))
        self.widget = w.VBox([self.title, self.summary, self.list, self.notice_box], layout=kit.layout(),
                             _dom_classes=("nbdebug-hits",))
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
        self.summary.value = f"<small>{html.escape(groups_summary(self._groups))}</small>" if many else ""
        notice_sig = tuple(id(h) for h in self.notices[:MAX_NOTICES]) + (len(self.notices),)
        if force or notice_sig != self._notice_sig:
            self._notice_sig = notice_sig
            self._show_notices()

    def _show_notices(self) -> None:
        old = list(self.notice_list.children)
        self.notice_list.children = [self._notice(h) for h in self.notices[:MAX_NOTICES]]
        for row in old:
            row.close()
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
        self._shown = [self._group(key, rs) for key, rs in shown]
        keys = {g.key for g in self._shown}
        self._cache = {k: v for k, v in self._cache.items() if k in keys}
        n = len(self._groups)
        pager = None
        if n > PAGE_GROUPS:
            pager = {"label": f"<small>groups {first + 1}–{first + len(shown)} of {n} (node · condition)</small>",
                     "prev": self.page > 0, "next": self.page < self.pages - 1}
        content = {"groups": [{"title": g.children[0].value,
                               "rows": [[r.children[0].description, r.children[0].tooltip, r.children[2].value]
                                        for r in g.children[1:]]} for g in self._shown],
                   "empty": "<i>no hits</i>", "pager": pager}
        last = next((m for m in self.list.recorded() if m["type"] == "hits"), None)
        if last is None or {k: v for k, v in last.items() if k not in ("type", "rev")} != content:
            self._rev += 1
            self.list.post({"type": "hits", "rev": self._rev, **content})

    def _group(self, key: tuple[str, str], records: list[Any]) -> HitGroup:
        """The group as shown: its title counts every record, its rows are the first :data:`ROWS_PER_GROUP`
        (made once while they stay the same: thousands of hits arriving only change the title)."""
        node, condition = key
        n = len(records)
        more = f" · {ROWS_PER_GROUP} listed" if n > ROWS_PER_GROUP else ""
        born = ("<span class='nbdebug-hit-origin' title='a NaN/Inf starts here (first_nonfinite)'>origin</span> "
                if any(getattr(h, "origin", False) for h in records) else "")
        title = (f"{born}<b>{html.escape(node)}</b> <small>· {html.escape(condition)} · "
                 f"{steps_text([h.step for h in records])} · {n} hit{'s' if n != 1 else ''}{more}</small>")
        listed = records[:ROWS_PER_GROUP]
        sig = tuple((h.watchpoint, h.slot, h.step, h.hits) for h in listed)
        old = self._cache.get(key)
        if old is not None and old[0] == sig:
            old[1].children[0].value = title
            return old[1]
        group = HitGroup(key, [Shown(title)] + [self._row(h) for h in listed])
        self._cache[key] = (sig, group)
        return group

    def _row(self, h: Any) -> HitRow:
        sel = Action(f"{h.condition} · {h.slot}",  # node: the group's title
                     f"watchpoint #{h.watchpoint}: {h.node} {h.slot}, step {h.step} — select the node",
                     lambda: self.on_select(h.node))
        view = Action("View", "open the tensor view", lambda: self.on_view(h))
        detail = Shown(f"<small style='color:#cf222e'>{html.escape(hit_text(h))}</small>")
        return HitRow(h, (sel, view, detail))

    def _clicked(self, content: dict[str, Any], _buffers: list[Any]) -> None:
        """A click in the browser: a row's button on page ``rev`` (dropped if another page was sent since),
        or the pager."""
        action = content.get("action")
        if action in ("prev", "next"):
            self.page_to(self.page + (1 if action == "next" else -1))
            return
        if content.get("rev") != self._rev or action not in ("select", "view"):
            return
        g, r = content.get("group"), content.get("row")
        if not (isinstance(g, int) and isinstance(r, int) and 0 <= g < len(self._shown)):
            return
        rows = self._shown[g].children[1:]
        if 0 <= r < len(rows):
            rows[r].children[0 if action == "select" else 1].click()

    def _notice(self, h: Any) -> w.HTML:
        text = f"{h.condition} · {h.node} {h.slot} · step {h.step}: {hit_text(h)}"
        return self._label(f"<small style='color:#8c6d1f'>{html.escape(text)}</small>", "nbdebug-hit-notice",
                           "nbdebug-hit-unchecked", flex="0 0 auto")

    def _label(self, value: str, *classes: str, **layout: str) -> w.HTML:
        """An HTML label on the kit's shared models, its classes given at creation (``add_class`` afterwards
        would be one more message per widget)."""
        return w.HTML(value, layout=self.kit.layout(**layout), style=self.kit.style(HTMLStyle), _dom_classes=classes)

    def rows(self) -> list[HitRow]:
        """The hit rows of the shown page (notices excluded), in order."""
        return [r for g in self._shown for r in g.children[1:]]

    def groups(self) -> list[HitGroup]:
        """The groups of the shown page."""
        return list(self._shown)

    def notice_rows(self) -> list[w.HTML]:
        return list(self.notice_list.children)
