"""Replay a step with every tensor, and hand it over as a reproduction (README: "Replay a step").

* :mod:`.keeper` — what a step is (``@dbg.step_fn``, ``dbg.step_fn(trainer)``) and the window of kept
  pre-step states;
* :mod:`.replayer` — ``dbg.replay(step, level="mix")``: the step computed again, the live run unchanged;
* :mod:`.result` — the replayed step's session (reader surface, panel) and its bitwise comparison;
* :mod:`.repro` — ``dbg.save_repro(path, step, node=None)`` and ``nbdebug.load_repro(path)``.

The framework side (state capture and swap, tensor files, the generated script) is the backend's
(``frameworks/<fw>/replay_state.py``, ``repro.py``); the Debugger reaches this package through
``nbdebug.features``.

>>> from nbdebug.replay import ReplayMismatch
>>> issubclass(ReplayMismatch, Warning)
True
"""

from __future__ import annotations

from ..features import register
from .keeper import Keeper
from .result import Mismatch, ReplayedStep, ReplayMismatch, ReplayMismatchError, ReplayRefused

register("replay", f"{__name__}.keeper", "Keeper")  # dbg.step_fn: pre-step states of the last steps
register("replay_refused", f"{__name__}.result", "ReplayRefused")  # dbg.replay without a step function
register("replay_run", f"{__name__}.replayer", "replay")  # dbg.replay(step, level)
register("save_repro", f"{__name__}.repro", "save_repro")  # dbg.save_repro(path, step, node)

__all__ = ["Keeper", "Mismatch", "ReplayMismatch", "ReplayMismatchError", "ReplayRefused", "ReplayedStep"]
