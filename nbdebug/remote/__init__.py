"""Remote debugging: a training script (or each rank of a torchrun job) attached to a notebook.

In the notebook ``listener = nbdebug.listen()`` prints how to start the job; in the script
``nbdebug.attach(model)`` (or ``python -m nbdebug.run train.py``) connects to it. Modules:
``protocol`` (the message schema, ``PROTOCOL.md``), ``transport`` (one socket, one I/O thread),
``agent`` + ``attach`` (training side), ``runner`` (``python -m nbdebug.run``), ``hub`` (the listener),
``source`` + ``mirror`` (one connected process as a panel source).

>>> from nbdebug.remote import listen
>>> listener = listen(quiet=True); listener.sources
{}
>>> listener.close()
"""

from .attach import attach
from .hub import Listener, listen
from .source import RemoteSource

__all__ = ["Listener", "RemoteSource", "attach", "listen"]
