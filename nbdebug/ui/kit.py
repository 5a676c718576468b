"""Shared Layout and style models for a view's widgets.

Every ipywidget made without ``layout=`` / ``style=`` gets a Layout model and a style model of its own: three
models per label, each one a message over the websocket and an entry in a saved notebook's widget state. A
:class:`Kit` hands out one Layout per set of layout properties and one style per style class, for widgets
whose layout and style are never changed afterwards (a widget that is shown and hidden keeps its own Layout).

>>> kit = Kit()
>>> a, b = kit.html("<b>Step</b>"), kit.html("3")
>>> a.layout is b.layout and a.style is b.style
True
>>> kit.button("go").layout is kit.button("stop").layout, kit.layout(width="auto") is kit.layout(width="auto")
(True, True)
>>> kit.html("x", width="40%").layout is a.layout
False
>>> kit.html("x", classes=("nbdebug-step",))._dom_classes
('nbdebug-step',)
"""

from __future__ import annotations

from typing import Any

import ipywidgets as w
from ipywidgets.widgets.widget_button import ButtonStyle
from ipywidgets.widgets.widget_string import HTMLStyle


class Kit:
    """One Layout per property set and one style per style class; ``models`` lists them (for closing)."""

    def __init__(self) -> None:
        self._models: dict[Any, Any] = {}

    @property
    def models(self) -> list[Any]:
        return list(self._models.values())

    def layout(self, **props: str) -> w.Layout:
        """The shared Layout with exactly these properties."""
        key = ("layout", *sorted(props.items()))
        if key not in self._models:
            self._models[key] = w.Layout(**props)
        return self._models[key]

    def style(self, cls: type) -> Any:
        """The shared style model of class ``cls`` (``HTMLStyle``, ``ButtonStyle`` …)."""
        if cls not in self._models:
            self._models[cls] = cls()
        return self._models[cls]

    def html(self, value: str = "", classes: tuple[str, ...] = (), **layout: str) -> w.HTML:
        """An HTML widget on the shared layout for ``layout`` and the shared HTML style; ``classes``: its CSS
        classes, sent in its ``comm_open`` (an ``add_class`` afterwards is one more message each)."""
        return w.HTML(value, layout=self.layout(**layout), style=self.style(HTMLStyle), _dom_classes=classes)

    def button(self, description: str, tooltip: str = "", classes: tuple[str, ...] = (), button_style: str = "",
               **layout: str) -> w.Button:
        """A button on the shared layout for ``layout`` and the shared button style; ``classes`` as for
        :meth:`html`, ``button_style`` ("primary", "danger" …) likewise given at creation."""
        return w.Button(description=description, tooltip=tooltip, layout=self.layout(**layout),
                        style=self.style(ButtonStyle), button_style=button_style, _dom_classes=classes)
