"""Which step: the one resolver every reader, view and command asks.

Two names, one meaning each, on every session and every reader (Debugger, OfflineSession, the panel's
sources, RemoteSource):

- ``step_index``: the step in progress — the one recording, or the next one to record (a dump's: one past
  its last step; nothing is in progress there). Finished steps are below it.
- ``current_step``: the step ``"current"`` means — the one chosen with ``goto`` (a session's
  ``chosen_step``), else the step in progress once it recorded something (for one tensor: once it
  recorded that tensor), else the last finished step that was captured (sampled capture skips some);
  -1 before any.

:func:`resolve_step` turns a step spec — an int, ``"current"``, ``"previous"`` (the latest step before
``"current"`` that ran), ``"initial"`` (the first step with a record) or ``"last"`` (the last finished
step, whatever ``goto`` chose) — into a step number, or a ``ValueError`` naming what it takes.

>>> from nbdebug.session.session import Session
>>> s = Session(framework="numpy", live=False)
>>> current_step(s), resolve_step(s, 3), resolve_step(s, "previous")
(-1, 3, -1)
>>> s.step_index = 2  # two finished steps
>>> resolve_step(s, "current"), resolve_step(s, "previous"), resolve_step(s, "last")
(1, 0, 1)
>>> resolve_step(s, "later")
Traceback (most recent call last):
ValueError: step must be an int or one of 'current', 'previous', 'initial', 'last'; got 'later'
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: the step names :func:`resolve_step` takes besides an int
STEP_NAMES = ("current", "previous", "initial", "last")


def last_step(session: Any) -> int:
    """The last finished step that was captured (-1 before any): the step in progress is not finished."""
    steps = getattr(session, "steps", None)
    if steps:
        return int(max(steps))
    cur = int(session.step_index) - 1
    skipped = getattr(session, "skipped", {})
    while cur in skipped:  # sampled capture: a step that ran without a capture is not "current"
        cur -= 1
    return cur


def current_step(session: Any, key: tuple[str, str] | None = None) -> int:
    """The step ``"current"`` means (see the module docstring); with ``key``, for that tensor: the step in
    progress only once it recorded ``key``."""
    chosen = getattr(session, "chosen_step", None)
    if chosen is not None:
        return int(chosen)
    rec = getattr(session, "recorder", None)
    if rec is not None and (key in rec.index if key is not None else len(rec)):
        return int(session.step_index)
    return last_step(session)


def _known_steps(session: Any) -> set[int]:
    """Every step the session has a record of: statistics, compact history, or a skipped step's reason."""
    known = set(getattr(session, "steps", ()))
    history = getattr(session, "history", None)
    if history is not None:
        known.update(getattr(history, "steps", ()))
    known.update(getattr(session, "skipped", ()))
    return known


def resolve_step(session: Any, step: Any, key: tuple[str, str] | None = None) -> int:
    """The step number ``step`` (an int or one of :data:`STEP_NAMES`) stands for in ``session``; -1 when the
    named step does not exist yet (the caller says so for its tensor); ``ValueError`` for anything else."""
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool):
        return int(step)
    if step == "current":
        return current_step(session, key)
    if step == "previous":
        cur = current_step(session, key)
        earlier = [s for s in _known_steps(session) if s < cur]
        if earlier:
            return max(earlier)
        # a run numbers its steps from 0 without gaps; a dump holds only the steps it holds
        return max(cur - 1, -1) if getattr(session, "contiguous_steps", True) else -1
    if step == "initial":
        known = _known_steps(session) - set(getattr(session, "skipped", ()))
        return min(known) if known else -1
    if step == "last":
        return last_step(session)
    raise ValueError(f"step must be an int or one of {', '.join(map(repr, STEP_NAMES))}; got {step!r}")
