"""Optional features the debugger core reaches without importing them: one table, filled from above.

The core (``debugger.py``, ``session/``, ``watch/``, ``control/``, ``frameworks/``) imports nothing from
``ui/``, ``lab/``, ``dump/``, ``compare/`` or ``remote/``, at module level or inside functions
(``tests/test_layering.py`` checks it), and names none of them. Each layer above registers what it offers
(:func:`register`, in its package ``__init__``: ``register("panel", "nbdebug.ui.panel", "Panel")``), and the
package root imports those packages, so the table is complete once ``nbdebug`` is imported. Where a core
object offers an optional feature — ``dbg.panel()``, ``Debugger(dump_dir=...)``, the JupyterLab status
item — it calls ``feature(name)``, which imports the registered module the first time. :data:`FEATURES` is
the whole upward surface.

>>> feature("attach_dump").__name__
'attach_dump'
>>> feature("nope")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
KeyError: "no optional feature 'nope'; known: announce, attach_dump, compare_panel, export_html, job, panel, ..."
"""

from __future__ import annotations

import importlib
from typing import Any

#: feature name -> (module, attribute), as registered by the layer that offers it; the module is imported on
#: the first :func:`feature` call
FEATURES: dict[str, tuple[str, str]] = {}


def register(name: str, module: str, attr: str) -> None:
    """Offer ``module.attr`` (imported when first asked for) as optional feature ``name``; a layer registers
    its own features when its package is imported. A name is registered once.

    >>> register("attach_dump", "nbdebug.dump", "attach_dump")  # what nbdebug/dump/__init__.py does: no change
    >>> register("attach_dump", "nbdebug.ui", "Panel")
    Traceback (most recent call last):
    ...
    ValueError: optional feature 'attach_dump' is nbdebug.dump.attach_dump already
    """
    known = FEATURES.get(name)
    if known is not None and known != (module, attr):
        raise ValueError(f"optional feature {name!r} is {known[0]}.{known[1]} already")
    FEATURES[name] = (module, attr)


def feature(name: str) -> Any:
    """The object implementing optional feature ``name`` (its module imported now if it was not)."""
    try:
        module, attr = FEATURES[name]
    except KeyError:
        raise KeyError(f"no optional feature {name!r}; known: {', '.join(sorted(FEATURES))}") from None
    return getattr(importlib.import_module(module), attr)


class PanelOwner:
    """``panel()``, ``export_html(path)`` and the notebook's display (the panel) of an object the panel
    reads (a Debugger, an offline session): the ``panel`` and ``export_html`` features, written once.

    >>> hasattr(PanelOwner, "_ipython_display_")
    True
    """

    def panel(self) -> Any:
        """The notebook panel (graph, nodes, watchpoints, hits, tensor view; training control when live)."""
        return feature("panel")(self)

    def export_html(self, path: Any) -> Any:
        """Write one self-contained HTML file (graph, hits, node statistics) that opens with no server."""
        return feature("export_html")(self, path)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.panel())
