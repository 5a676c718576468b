"""The tensor operations a framework gives the capture core (one small object per framework).

The core never touches a framework tensor itself; it asks the framework's :class:`TensorOps`:

* ``tensor_type`` — what counts as a tensor when a call's arguments are flattened;
* ``has_versions`` — whether tensors carry an in-place version counter;
* ``version(t)`` — the in-place version counter of ``t``. A framework without one (MindSpore) returns a
  constant for tensors nothing updates in place unseen, and a fresh number (never equal to another) for
  those something may (MindSpore's non-trainable Parameters: BatchNorm's moving statistics): a fresh
  number means "measure again at every use";
* ``measure(buf, t, version)`` — queue ``t``'s statistics in the step's buffer and return its
  :class:`~nbdebug.frameworks.core.records.Seen` (``dtype`` None when the framework settles metadata
  later: see :meth:`~nbdebug.frameworks.core.recording.Recording.resolve`);
* ``reference(t, seen, copy)`` — a retention handle (``nbytes``, ``numpy()``, ``snapshot()``, ``copied``): a
  reference when the framework can tell an in-place change afterwards (``numpy()`` then refuses with
  :class:`~nbdebug.session.store.NotRetainedError`), otherwise a copy;
* ``new_buffer()`` — the step's statistics buffer (``raw()`` returns the rows);
* ``quiet()`` — a context in which the capture's own framework calls are not recorded.

>>> class Plain:  # the smallest TensorOps: numpy arrays, never changed in place
...     tensor_type = list
"""

from __future__ import annotations

from typing import Any, Protocol

from .records import Seen


class TensorOps(Protocol):
    tensor_type: Any
    has_versions: bool

    def version(self, t: Any) -> int: ...

    def measure(self, buf: Any, t: Any, version: int) -> Seen: ...

    def reference(self, t: Any, seen: Seen, copy: bool) -> Any: ...

    def new_buffer(self) -> Any: ...

    def quiet(self) -> Any: ...
