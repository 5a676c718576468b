"""Kernel side of the nbdebug JupyterLab extension.

The extension (``labextension/``, shipped prebuilt in the wheel) shows the active debugger's state,
step and hit count in the status bar and adds the commands ``nbdebug:continue``, ``nbdebug:step``,
``nbdebug:next-node``, ``nbdebug:pause`` and ``nbdebug:terminate`` (palette, notebook toolbar,
shortcuts). This package is what runs in the kernel:

- :func:`announce` (called when a Debugger is created in a kernel) opens the ``nbdebug.status`` comm
  and keeps it fed with :func:`status` (see :mod:`nbdebug.lab.channel`);
- :func:`command` is what the extension executes, on a kernel subshell when the kernel has them, so
  commands arrive while the main shell is busy.

Only ``comm``/``ipykernel`` are used here; no widget toolkit.

>>> from nbdebug.lab import command
>>> command("continue")
Traceback (most recent call last):
...
RuntimeError: no live nbdebug Debugger in this kernel
"""

from ..features import register
from .channel import TARGET, announce, load_ipython_extension, unload_ipython_extension
from .commands import COMMANDS, command, status

register("announce", __name__, "announce")  # JupyterLab status item and commands for a new Debugger

__all__ = ["COMMANDS", "TARGET", "announce", "command", "load_ipython_extension", "status",
           "unload_ipython_extension"]
