"""``nbdebug.attach``: a Debugger in a training script, driven from a notebook's listener.

In the script::

    import nbdebug
    dbg = nbdebug.attach(model, level="L0", connect="127.0.0.1:5555", token="...")
    for x, y in data:            # the script's own loop, in its main thread
        ...

or, with no arguments, from the environment the notebook printed (``nbdebug.listen()``)::

    NBDEBUG_CONNECT=127.0.0.1:5555 NBDEBUG_TOKEN=... python train.py

``attach`` returns a normal :class:`~nbdebug.Debugger` (every keyword of it is accepted) whose
training — the calling thread's plain loop — is controlled from the notebook: pause, step, run to a
node, terminate (which ends the script like ``sys.exit(0)``). ``NBDEBUG_PAUSE_TIMEOUT`` (seconds,
default 300) bounds how long training stays paused while no notebook is connected.

>>> import os; os.environ.pop("NBDEBUG_CONNECT", None) and None
>>> attach(object())  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: nbdebug.attach: no listener to connect to: pass connect="host:port" or set NBDEBUG_CONNECT ...
"""

from __future__ import annotations

import atexit
import os
import weakref
from typing import Any

ENV_CONNECT = "NBDEBUG_CONNECT"
ENV_TOKEN = "NBDEBUG_TOKEN"
ENV_PAUSE_TIMEOUT = "NBDEBUG_PAUSE_TIMEOUT"
ENV_LEVEL = "NBDEBUG_LEVEL"

_AGENTS: list[weakref.ref] = []


def settings(connect: str | None = None, token: str | None = None) -> tuple[str, str, float]:
    """``(address, token, pause_timeout)`` from the arguments, else the environment; clear errors."""
    address = connect or os.environ.get(ENV_CONNECT, "").strip()
    if not address:
        raise ValueError(f"nbdebug.attach: no listener to connect to: pass connect=\"host:port\" or set "
                         f"{ENV_CONNECT} (nbdebug.listen() in the notebook prints it)")
    tok = token if token is not None else os.environ.get(ENV_TOKEN, "")
    if not tok:
        raise ValueError(f"nbdebug.attach: no token: pass token=... or set {ENV_TOKEN} (every connection needs "
                         "the listener's token; nbdebug.listen() prints it)")
    raw = os.environ.get(ENV_PAUSE_TIMEOUT, "300")
    try:
        timeout = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_PAUSE_TIMEOUT} must be a number of seconds, got {raw!r}") from None
    if not timeout >= 0:
        raise ValueError(f"{ENV_PAUSE_TIMEOUT} must be >= 0 seconds, got {raw!r}")
    return address, tok, timeout


def attach(model: Any, level: str | None = None, *, connect: str | None = None, token: str | None = None,
           **kwargs: Any) -> Any:
    """A :class:`~nbdebug.Debugger` on ``model`` whose training (the calling thread) a notebook controls.

    ``connect``/``token`` default to ``NBDEBUG_CONNECT``/``NBDEBUG_TOKEN``; ``level`` to ``NBDEBUG_LEVEL``
    or ``"L0"``; other keywords go to the Debugger. The connection is made in the background: training
    never waits for the notebook."""
    address, tok, timeout = settings(connect, token)
    from ..debugger import Debugger
    from .agent import Agent

    Agent.parse_address(address)  # a bad address fails before the model is hooked
    dbg = Debugger(model, level or os.environ.get(ENV_LEVEL, "L0"), **kwargs)
    try:
        agent = Agent(dbg, address, tok, pause_timeout=timeout)
        dbg.adopt()
    except BaseException:
        dbg.close()
        raise
    dbg.remote = agent
    _AGENTS.append(weakref.ref(agent))
    return dbg


def _close_all() -> None:
    """At exit: each agent says goodbye (final state) before the interpreter goes."""
    for ref in _AGENTS:
        agent = ref()
        if agent is not None:
            try:
                agent.close()
            except Exception:  # noqa: BLE001 - never fail an exiting script
                pass


atexit.register(_close_all)
