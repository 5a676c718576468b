"""``torch.compile`` under an op-level capture (L1/mix): compiled code runs eagerly while attached.

Ops inside a compiled region run as fused kernels that call no torch function from Python, so the op mode
cannot see them; left alone, dynamo also traces the capture's own Python (the mode's ``__torch_function__``),
recompiles on its guards and runs single ops through the compiler's kernels. While an L1/mix capture is
attached the compiler's stance is ``force_eager`` (``torch.compiler.set_stance``): every ``torch.compile``d
module or function runs as the Python it was compiled from, every op is recorded, and the values shown are
eager PyTorch's (a compiled kernel's can differ from them in the last bits). The stance the user had comes
back when the last such capture closes. L0 and monitor leave compiled code compiled (their module hooks run
eagerly between the compiled regions). Dynamo does not guard on module hooks
(``torch._dynamo.config.skip_nnmodule_hook_guards``): code it compiled before the hooks were attached (the
model ran compiled already, or another instance of its class did) runs on without calling them, and the
capture would see the root module only. Attaching at L0/monitor to a model holding compiled modules clears
dynamo's caches (``torch.compiler.reset()``, said in a warning), so that the next call compiles again with
the hooks.

>>> import torch
>>> m = torch.nn.Sequential(torch.nn.Linear(2, 2))
>>> m[0] = torch.compile(m[0])
>>> compiled_modules(m)
['0']
>>> before = stance()  # "default" unless another live L1/mix capture holds "force_eager"
>>> h = run_eagerly(m); stance() == "force_eager"
True
>>> h.remove(); stance() == before
True
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from typing import Any

import torch

_held: list[Any] = []  # the stance before the first capture that forced eager, one entry per live capture


def stance() -> str:
    """The compiler's current stance ("default", "force_eager", …)."""
    import torch._dynamo.eval_frame as ef

    return ef._stance.stance


def compiled_modules(model: torch.nn.Module) -> list[str]:
    """Paths of the modules of ``model`` that ``torch.compile`` wraps (``OptimizedModule``) or compiled in
    place (``module.compile()``); ``""`` is the model itself."""
    from torch._dynamo.eval_frame import OptimizedModule

    return [path for path, mod in model.named_modules()
            if isinstance(mod, OptimizedModule) or getattr(mod, "_compiled_call_impl", None) is not None]


class _EagerHandle:
    def __init__(self, paths: list[str]) -> None:
        self.removed = False
        self.paths = paths  # the model's compiled modules, run eagerly

    def remove(self) -> None:
        if self.removed:
            return
        self.removed = True
        prev = _held.pop()
        if not _held:
            torch.compiler.set_stance(prev.stance, skip_guard_eval_unsafe=prev.skip_guard_eval_unsafe,
                                      force_backend=prev.backend)


def retrace(model: torch.nn.Module, hooked: bool = False) -> None:
    """Clear dynamo's caches when ``model`` holds compiled modules (see the module docstring), saying so;
    ``hooked``: a live capture's hooks were on the model already (a replay's capture): its compiled code calls
    hooks, nothing to clear."""
    paths = [] if hooked else compiled_modules(model)
    if paths:
        warnings.warn(
            f"torch.compile: {_names(paths)} compiled. Code dynamo compiled before this Debugger attached would not "
            "call its module hooks, so dynamo's caches are cleared (torch.compiler.reset()): the next steps "
            "compile again, with a graph break at each module boundary the capture hooks.", stacklevel=_user_level())
        torch.compiler.reset()


def _user_level() -> int:
    """The ``stacklevel`` of the first frame outside nbdebug (the user's ``Debugger(...)`` line)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(root + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _names(paths: list[str]) -> str:
    return ", ".join(repr(p) if p else "the model" for p in paths[:4]) + (" …" if len(paths) > 4 else "")


def run_eagerly(model: torch.nn.Module, quiet: bool = False, owner: Any = None) -> _EagerHandle:
    """Set the ``force_eager`` stance until the handle's ``remove()`` — or until ``owner`` (the capture) is
    collected without being closed, so that a Debugger dropped unclosed does not leave every later compiled
    call of the process eager; warn when ``model`` holds compiled modules (saying what runs eagerly and why),
    unless ``quiet`` (a replay's capture: its result says it, :func:`replay_note`)."""
    import torch._dynamo.eval_frame as ef

    paths = compiled_modules(model)
    if paths and not quiet:
        warnings.warn(
            f"torch.compile: {_names(paths)} compiled. An op-level capture (L1/mix) cannot see the ops inside compiled "
            "kernels, so while this Debugger is attached every torch.compile'd module and function runs eagerly "
            "(torch.compiler.set_stance('force_eager'), undone at close): every op is recorded and the values "
            "shown are the eager ones, which can differ from the compiled kernels' in the last bits. Attach at "
            "level='L0' or 'monitor' to keep the model compiled (module boundaries are captured).",
            stacklevel=_user_level())
    prev = ef._stance
    if not _held:
        torch.compiler.set_stance("force_eager")
    _held.append(prev)
    handle = _EagerHandle(paths)
    if owner is not None:
        weakref.finalize(owner, handle.remove)
    return handle


def replay_note(paths: list[str]) -> str:
    """Why a replay at L1/mix of a step that ran compiled code may differ from it."""
    return (f"torch.compile: {_names(paths)} ran compiled in the live step; a replay at L1/mix runs it eagerly "
            "(every op recorded), so its values can differ from the compiled kernels' in the last bits "
            "(replay at level='L0' to compare bit for bit)")
