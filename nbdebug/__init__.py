"""nbdebug: a Jupyter-first debugger for neural-network training (PyTorch, MindSpore)."""

from .debugger import Debugger
from .session.store import NotRetainedError

__all__ = ["Debugger", "NotRetainedError"]
__version__ = "0.1.0"
