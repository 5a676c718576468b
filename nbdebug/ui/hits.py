"""The hit list: watchpoint hits in execution order (step, then order in the step).

Each row (``nbdebug-hit-row``) shows the condition, node, slot and step, and for every parameter that
fired the threshold that was set against the actual value (or why the check could not be made).
Clicking the row's main button (``nbdebug-hit-select``) selects the node; ``View`` (``nbdebug-hit-view``)
opens the tensor view on the hit's tensor. Rows are rebuilt only when the hits change.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import ipywidgets as w

from ..watch.conditions import Firing

MAX_ROWS = 200


def hit_text(h: Any) -> str:
    """Threshold vs actual of a hit record, e.g. ``max_gt = 1 set, actual max = 3.2``."""
    text = Firing(h.condition, -1, h.hits, h.error, h.unchecked).describe()
    return text.split(": ", 1)[1] if ": " in text else text


class HitList:
    """``on_select(name)`` when a row is clicked, ``on_view(hit)`` for its View button."""

    def __init__(self, source: Any, on_select: Callable[[str], Any] = lambda name: None,
                 on_view: Callable[[Any], Any] = lambda hit: None) -> None:
        self.source = source
        self.on_select = on_select
        self.on_view = on_view
        self._sig: Any = None
        self.hits: list[Any] = []
        self.title = w.HTML("<b>Hits</b>")
        self.list = w.VBox([], layout=w.Layout(max_height="260px", overflow="auto"))
        self.list.add_class("nbdebug-hit-list")
        self.note = w.HTML("")
        self.widget = w.VBox([self.title, self.list, self.note])
        self.widget.add_class("nbdebug-hits")
        self.refresh()

    def refresh(self, force: bool = False) -> None:
        hits = self.source.hits
        sig = tuple((h.watchpoint, h.node, h.slot, h.step, h.hits, h.error) for h in hits)
        if sig == self._sig and not force:
            return
        self._sig = sig
        self.hits = hits
        shown = hits[:MAX_ROWS]
        self.list.children = [self._row(h) for h in shown] or [w.HTML("<i>no hits</i>")]
        n_hit = sum(1 for h in hits if h.hits)
        self.title.value = f"<b>Hits</b> ({n_hit})"
        self.note.value = f"<small>first {MAX_ROWS} of {len(hits)} shown</small>" if len(hits) > MAX_ROWS else ""

    def _row(self, h: Any) -> w.HBox:
        kind = "hit" if h.hits else "unchecked"
        sel = w.Button(description=f"{h.condition} · {h.node} {h.slot} · step {h.step}",
                       tooltip=f"watchpoint #{h.watchpoint}: select {h.node}",
                       layout=w.Layout(width="auto", max_width="min(420px, calc(100% - 64px))"))  # View fits beside it
        sel.add_class("nbdebug-hit-select")
        sel.on_click(lambda _b: self.on_select(h.node))
        colour = "#cf222e" if h.hits else "#8c6d1f"
        detail = w.HTML(f"<small style='color:{colour}'>{html.escape(hit_text(h))}</small>")
        detail.add_class("nbdebug-hit-detail")
        view = w.Button(description="View", layout=w.Layout(width="52px"), tooltip="open the tensor view")
        view.add_class("nbdebug-hit-view")
        view.on_click(lambda _b: self.on_view(h))
        # flex "0 0 auto": rows keep their height and the list scrolls (they would shrink and overlap)
        row = w.HBox([sel, view, detail], layout=w.Layout(align_items="center", flex_flow="row wrap", flex="0 0 auto"))
        row.add_class("nbdebug-hit-row")
        row.add_class(f"nbdebug-hit-{kind}")
        return row

    def rows(self) -> list[w.HBox]:
        return [r for r in self.list.children if isinstance(r, w.HBox)]
