"""The ``%nbdebug`` line magic (registered by ``%load_ext nbdebug``).

Forms::

    %nbdebug              the panel of the most recent live Debugger
    %nbdebug load PATH    load a dump offline (nbdebug.load) and show its panel
    %nbdebug listen [PORT] [--host HOST] [--token TOKEN]
                          listen for training scripts (nbdebug.listen): prints how to start them,
                          returns the listener, whose display is the job's panel
    %nbdebug help         these forms

The magic returns the panel, so it is displayed as the cell's output (and can be assigned with
``p = %nbdebug``). Mistakes raise IPython's ``UsageError``: one clear line, no traceback.
"""

from __future__ import annotations

import shlex
from typing import Any

from IPython.core.error import UsageError

HELP = """%nbdebug — the nbdebug panel in this cell
  %nbdebug              show the panel of the most recent live Debugger
                        (create one with dbg = nbdebug.Debugger(model))
  %nbdebug load PATH    load a dump directory offline (nbdebug.load(PATH)) and show its panel
  %nbdebug listen [PORT] [--host HOST] [--token TOKEN]
                        listen for training scripts / torchrun ranks (nbdebug.listen) and show
                        the job's panel; the same listener again while it is open
  %nbdebug help         show this help"""


def nbdebug_magic(line: str = "") -> Any:
    """Implementation of ``%nbdebug``; see the module docstring."""
    try:
        args = shlex.split(line)
    except ValueError as e:
        raise UsageError(f"%nbdebug: cannot parse {line!r}: {e}") from None
    if not args:
        from ..debugger import last_debugger
        from .panel import Panel

        dbg = last_debugger()
        if dbg is None:
            raise UsageError("%nbdebug: no live Debugger yet; create one with dbg = nbdebug.Debugger(model) "
                             "(or open a dump with %nbdebug load PATH)")
        return Panel(dbg)
    cmd, rest = args[0], args[1:]
    if cmd in ("help", "-h", "--help", "?"):
        print(HELP)
        return None
    if cmd == "load":
        if len(rest) != 1:
            raise UsageError("%nbdebug load takes one PATH (quote it if it has spaces)\n" + HELP)
        return load_panel(rest[0])
    if cmd == "listen":
        return listen_magic(rest)
    raise UsageError(f"%nbdebug: unknown form {cmd!r}\n{HELP}")


def load_panel(path: str) -> Any:
    """``nbdebug.load(path)`` and a panel over the result; a failure becomes one clear ``UsageError``."""
    import nbdebug

    from .panel import Panel

    try:
        load = nbdebug.load
    except (AttributeError, ImportError) as e:
        raise UsageError(f"%nbdebug load: offline loading is not available in this nbdebug ({e})") from None
    try:
        offline = load(path)
    except Exception as e:  # noqa: BLE001 - shown to the user as one line
        raise UsageError(f"%nbdebug load {path}: {type(e).__name__}: {e}") from None
    make = getattr(offline, "panel", None)
    return make() if callable(make) else Panel(offline)


_LISTENER: list[Any] = []


def listen_magic(args: list[str]) -> Any:
    """``%nbdebug listen [PORT] [--host HOST] [--token TOKEN]``: the open listener, or a new one."""
    opts: dict[str, Any] = {}
    rest = list(args)
    while rest:
        a = rest.pop(0)
        if a in ("--host", "--token") and rest:
            opts[a[2:]] = rest.pop(0)
        elif a.isdigit() and "port" not in opts:
            opts["port"] = int(a)
        else:
            raise UsageError(f"%nbdebug listen: cannot read {a!r}\n" + HELP)
    if _LISTENER and not _LISTENER[0].closed and not opts:
        return _LISTENER[0]
    import nbdebug  # the facade names remote's listen (ui does not import remote, which shows ui panels)

    try:
        listener = nbdebug.listen(**opts)
    except (OSError, ValueError) as e:
        raise UsageError(f"%nbdebug listen: {e}") from None
    _LISTENER[:] = [listener]
    return listener


def register(ipython: Any) -> None:
    """Register ``%nbdebug`` on an IPython shell (called by ``%load_ext nbdebug``)."""
    ipython.register_magic_function(nbdebug_magic, magic_kind="line", magic_name="nbdebug")
