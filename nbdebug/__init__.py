"""nbdebug: a Jupyter-first debugger for neural-network training (PyTorch, MindSpore).

>>> import nbdebug
>>> sorted(nbdebug.__all__)[:3]
['DebugUnderflowOverflow', 'Debugger', 'MsprobeStep']
"""

from __future__ import annotations

import importlib
from typing import Any

from . import dump, job, lab, replay, ui  # noqa: F401 - each registers its optional features (nbdebug.features)
from .debugger import Debugger
from .session.store import NotRetainedError

__version__ = "0.1.0"

# Public names living in modules that import a framework or a UI toolkit: loaded on first use.
_LAZY: dict[str, str] = {
    "DebugUnderflowOverflow": "nbdebug.frameworks.torch.overflow:DebugUnderflowOverflow",
    "PrecisionDebugger": "nbdebug.dump.precision:PrecisionDebugger",
    "MsprobeStep": "nbdebug.dump.precision:MsprobeStep",
    "seed_all": "nbdebug.frameworks.seed:seed_all",
    "load": "nbdebug.dump.load:load",
    "compare": "nbdebug.compare.run:compare",
    "compare_npy_dir": "nbdebug.compare.npy:compare_npy_dir",
    "compare_weights": "nbdebug.compare.weights:compare_weights",
    "attach": "nbdebug.remote.attach:attach",
    "listen": "nbdebug.remote.hub:listen",
    "load_repro": "nbdebug.replay.repro:load_repro",  # a dbg.save_repro folder, read (nothing executed)
    # MindSpore's Model.train callback (also dbg.callback()); its old home, frameworks.mindspore.adapter, stays
    "StepCallback": "nbdebug.frameworks.mindspore.adapter:StepCallback",
}

__all__ = ["Debugger", "NotRetainedError", *_LAZY]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'nbdebug' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext nbdebug``: registers the ``%nbdebug`` magic."""
    from .lab import load_ipython_extension as _lab_extension
    from .ui.magics import register

    register(ipython)
    _lab_extension(ipython)
