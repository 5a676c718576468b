"""Remote debugging: a training script (or each rank of a torchrun job) attached to a notebook.

In the notebook ``listener = nbdebug.listen()`` prints how to start the job; in the script
``nbdebug.attach(model)`` (or ``python -m nbdebug.run train.py``) connects to it. Modules:
``protocol`` (the message schema, ``PROTOCOL.md``), ``transport`` (one socket, one I/O thread),
``agent`` + ``attach`` (training side), ``runner`` (``python -m nbdebug.run``), ``hub`` (the listener),
``source`` + ``mirror`` (one connected process as a panel source). Names load on first use (ZeroMQ
only then).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {"attach": "attach", "listen": "hub", "Listener": "hub", "RemoteSource": "source"}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'nbdebug.remote' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
