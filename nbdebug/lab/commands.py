"""Training-control commands by name, and the status the JupyterLab extension shows.

The extension's buttons, palette entries and shortcuts all end in :func:`command`, which acts on the
most recent live :class:`~nbdebug.Debugger` of this process. A command that does not apply to the
current state (``continue`` while running, ``pause`` while paused) raises ``RuntimeError`` naming
the state, so a click that races a state change does nothing surprising.

>>> import torch, nbdebug
>>> from nbdebug.lab import command, status
>>> model = torch.nn.Linear(2, 1)
>>> dbg = nbdebug.Debugger(model)
>>> dbg.run(lambda: model(torch.ones(1, 2)).sum().backward(), paused=True)
>>> status()["state"]
'paused'
>>> command("continue")
'running'
>>> dbg.wait(10)
<State.FINISHED: 'finished'>
>>> dbg.close()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..control import State
from ..session.steps import current_step
from ..watch.watchpoints import count_hits

# name -> (states it applies in, action). "step" runs exactly one more training step.
COMMANDS: dict[str, tuple[tuple[State, ...], Callable[[Any], None]]] = {
    "continue": ((State.PAUSED,), lambda dbg: dbg.cont()),
    "step": ((State.PAUSED,), lambda dbg: dbg.cont(1)),
    "next-node": ((State.PAUSED,), lambda dbg: dbg.next_node()),
    "pause": ((State.RUNNING,), lambda dbg: dbg.pause()),
    "terminate": ((State.RUNNING, State.PAUSED), lambda dbg: dbg.terminate()),
}


_ANNOUNCED: list[Any] = []  # weakref to the source announced last (a Debugger or a remote process)


def remember(source: Any) -> None:
    """Make ``source`` (a Debugger, or a remote process's ``RemoteSource``) the one the extension controls."""
    import weakref

    _ANNOUNCED[:] = [weakref.ref(source)]


def active_debugger() -> Any:
    """The debugger the extension controls: the most recently announced one (created, or a remote process
    that connected) that is not closed, else the most recently created live Debugger."""
    from ..debugger import last_debugger

    last = _ANNOUNCED[0]() if _ANNOUNCED else None
    if last is not None and not getattr(last, "closed", False):
        return last
    return last_debugger()


def command(name: str) -> str:
    """Run the training-control command ``name`` on the active debugger; returns the state after it.

    ``name`` is one of ``continue``, ``step``, ``next-node``, ``pause``, ``terminate``.
    """
    if name not in COMMANDS:
        raise ValueError(f"unknown nbdebug command {name!r}; commands are {', '.join(COMMANDS)}")
    dbg = active_debugger()
    if dbg is None:
        raise RuntimeError("no live nbdebug Debugger in this kernel")
    states, action = COMMANDS[name]
    state = dbg.state
    if state not in states:
        allowed = " or ".join(str(s) for s in states)
        raise RuntimeError(f"nbdebug: cannot {name} while training is {state} (only when {allowed})")
    action(dbg)
    from .channel import CHANNEL

    CHANNEL.wake()
    return str(dbg.state)


def status(dbg: Any = None) -> dict[str, Any]:
    """What the status item shows: ``state, step, hits, current_node, reason, framework``; for a process of a
    job with several processes connected, also ``processes``: ``[{key, state, step, hits}, ...]``.

    ``state`` is ``"none"`` when there is no live debugger. ``step`` is the step in progress (0-based);
    ``shown_step`` the step whose data the panel shows and the hits and pause reason name (the step in
    progress once it recorded something, else the last finished one; None before any) — the panel
    header's "Step" (see :mod:`nbdebug.ui.header`);
    ``hits`` counts the hit records so far in which a watchpoint fired (records of tensors that could
    not be checked are not hits).
    """
    if dbg is None:
        dbg = active_debugger()
    if dbg is None or dbg.closed:
        return {"state": "none", "step": None, "shown_step": None, "hits": 0, "current_node": None, "reason": "",
                "framework": None}
    out = _one_status(dbg)
    peers = getattr(dbg, "peers", None)  # the processes of a job connected to one listener
    if peers is not None and len(peers) > 1:
        out["processes"] = [{"key": str(p.key), **{k: v for k, v in _one_status(p).items()
                                                  if k in ("state", "step", "shown_step", "hits")}} for p in peers]
    return out


def _one_status(dbg: Any) -> dict[str, Any]:
    idx = int(dbg.session.step_index)
    shown = current_step(dbg.session)  # the panel header's Step
    return {
        "state": str(dbg.state),
        "step": idx,
        "shown_step": shown if shown >= 0 else None,
        "hits": count_hits(list(dbg.watchpoints.hits)),
        "current_node": dbg.current_node,
        "reason": dbg.pause_reason,
        "framework": dbg.session.framework,
    }
