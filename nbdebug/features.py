"""Optional features the debugger core reaches without importing them: one table, resolved on first use.

The core (``debugger.py``, ``session/``, ``watch/``, ``control/``, ``frameworks/``) imports nothing from
``ui/``, ``lab/``, ``dump/``, ``compare/`` or ``remote/``, at module level or inside functions
(``tests/test_layering.py`` checks it). Where a core object offers an optional feature — ``dbg.panel()``,
``Debugger(dump_dir=...)``, the JupyterLab status item — it calls ``feature(name)``, which imports the
module that implements it the first time. The layers above import the core freely; the core depends on
them only through the names listed in :data:`FEATURES`, so the table is the whole upward surface.

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

#: feature name -> (module, attribute); the module is imported on the first :func:`feature` call
FEATURES: dict[str, tuple[str, str]] = {
    "announce": ("nbdebug.lab", "announce"),  # JupyterLab status item and commands for a new Debugger
    "attach_dump": ("nbdebug.dump", "attach_dump"),  # Debugger(dump_dir=..., config=...)
    "compare_panel": ("nbdebug.ui.compare_panel", "ComparePanel"),  # CompareResult shown in a notebook
    "export_html": ("nbdebug.ui.export", "export_html"),  # dbg.export_html(path)
    "job": ("nbdebug.job", "Job"),  # nbdebug.load(multi-rank dump).job
    "panel": ("nbdebug.ui.panel", "Panel"),  # dbg.panel(), a Debugger shown in a cell
    "replay": ("nbdebug.replay.keeper", "Keeper"),  # dbg.step_fn: pre-step states of the last steps
    "replay_refused": ("nbdebug.replay.result", "ReplayRefused"),  # dbg.replay without a step function
    "replay_run": ("nbdebug.replay.replayer", "replay"),  # dbg.replay(step, level)
    "save_repro": ("nbdebug.replay.repro", "save_repro"),  # dbg.save_repro(path, step, node)
}


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
