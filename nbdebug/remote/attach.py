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
default 300) bounds how long training stays paused while no notebook is connected. An address that is
not ``host:port`` or does not resolve, or an unknown level, fails here, before anything is hooked; a notebook
that does not answer within :data:`CONNECT_WAIT_S` seconds is said once, and training goes on without it.

>>> import os; os.environ.pop("NBDEBUG_CONNECT", None) and None
>>> attach(object())  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: nbdebug.attach: no listener to connect to: pass connect="host:port" or set NBDEBUG_CONNECT ...
"""

from __future__ import annotations

import atexit
import os
import socket
import weakref
from typing import Any

ENV_CONNECT = "NBDEBUG_CONNECT"
ENV_TOKEN = "NBDEBUG_TOKEN"
ENV_PAUSE_TIMEOUT = "NBDEBUG_PAUSE_TIMEOUT"
ENV_LEVEL = "NBDEBUG_LEVEL"
#: seconds training waits at attach for the notebook's welcome (its watchpoints then apply from the first
#: step); a notebook that does not answer by then is said once, and training goes on without it
CONNECT_WAIT_S = 3.0

_AGENTS: list[weakref.ref] = []


def settings(connect: str | None = None, token: str | None = None,
             level: str | None = None) -> tuple[str, str, float]:
    """``(address, token, pause_timeout)`` from the arguments, else the environment; clear errors — before
    anything is hooked: an address that is not ``host:port`` or whose host does not resolve, a level
    (``level`` or ``NBDEBUG_LEVEL``) that is none of the capture levels."""
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
    check_level(level or os.environ.get(ENV_LEVEL, "L0"))
    check_address(address)
    return address, tok, timeout


def check_level(level: str) -> None:
    """A capture level every framework knows (the Debugger checks its framework's own at attach)."""
    from ..frameworks.core.capture import LEVELS

    if level not in LEVELS:
        raise ValueError(f"nbdebug.attach: unknown level {level!r} ({ENV_LEVEL} or level=); choose one of "
                         f"{', '.join(LEVELS)}")


def check_address(address: str) -> None:
    """``host:port`` whose host resolves (a typo fails here, at start, not silently in the background)."""
    from .agent import Agent

    host, port = Agent.parse_address(address)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise ValueError(f"nbdebug.attach: the host of {ENV_CONNECT}/connect={address!r} does not resolve "
                         f"({e})") from None


def attach(model: Any, level: str | None = None, *, connect: str | None = None, token: str | None = None,
           **kwargs: Any) -> Any:
    """A :class:`~nbdebug.Debugger` on ``model`` whose training (the calling thread) a notebook controls.

    ``connect``/``token`` default to ``NBDEBUG_CONNECT``/``NBDEBUG_TOKEN``; ``level`` to ``NBDEBUG_LEVEL``
    or ``"L0"``; other keywords go to the Debugger. The connection is made in the background: training
    waits for the notebook at most ``CONNECT_WAIT_S`` seconds, at the start (the job's watchpoints
    arrive with the welcome and apply from the first step); then, or when nothing answers, it goes on."""
    address, tok, timeout = settings(connect, token, level)  # bad input fails before the model is hooked
    from ..debugger import Debugger
    from .agent import Agent

    dbg = Debugger(model, level or os.environ.get(ENV_LEVEL, "L0"), **kwargs)
    try:
        agent = Agent(dbg, address, tok, pause_timeout=timeout)
        dbg.adopt()
    except BaseException:
        dbg.close()
        raise
    dbg.remote = agent
    _AGENTS.append(weakref.ref(agent))
    agent.first_contact(CONNECT_WAIT_S)
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
