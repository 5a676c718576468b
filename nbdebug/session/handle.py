"""Handles: what a subscription, a watch or a hook returns, removed once.

:class:`Handle` is what the public API returns for a subscription (``Session.subscribe``, ``EventHub.on``,
``dbg.on``, ``OfflineSession.on``, ``SourceView.on``, ``LossScaleTracker.watch``): ``h.remove()``
removes it, ``with h:`` removes it on leaving the block (as ``torch.utils.hooks.RemovableHandle`` does),
and calling it removes it too (these functions used to return a bare unsubscribe function). Removing
twice does nothing.

:class:`Handles` keeps the framework hook handles of a capture adapter (module, parameter and optimizer
hooks, and the per-step tensor hooks): ``add`` / ``add_step``, ``remove_step`` at a step end,
``remove_all`` at close.

>>> calls = []
>>> with Handle(lambda: calls.append("off")) as h:
...     h.removed
False
>>> calls, h.removed
(['off'], True)
>>> h(); h.remove(); calls
['off']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


class Handle:
    """A removable subscription (see the module docstring)."""

    __slots__ = ("_remove", "removed")

    def __init__(self, remove: Callable[[], Any] | None = None) -> None:
        self._remove = remove
        #: True once removed (a handle of nothing is removed from the start)
        self.removed = remove is None

    def remove(self) -> None:
        """Remove the subscription (once; later calls do nothing)."""
        if self.removed:
            return
        self.removed = True
        fn, self._remove = self._remove, None
        if fn is not None:
            fn()

    def __call__(self) -> None:
        self.remove()

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    def __repr__(self) -> str:
        return f"<Handle {'removed' if self.removed else 'active'}>"


class Handles:
    """The hook handles of one adapter: attached for its lifetime, or for the step in progress.

    >>> class H:
    ...     def __init__(self, log): self.log = log
    ...     def remove(self): self.log.append(self)
    >>> log = []; hs = Handles(); a, b = H(log), H(log)
    >>> hs.add(a) is a, hs.add_step(b) is b
    (True, True)
    >>> hs.remove_step(); log == [b], len(hs)
    (True, 1)
    >>> hs.remove_all(); log == [b, a], len(hs)
    (True, 0)
    """

    def __init__(self) -> None:
        self.attached: list[Any] = []
        self.step: list[Any] = []

    def add(self, handle: Any) -> Any:
        """Keep ``handle`` (anything with ``remove()``) until :meth:`remove_all`; returns it."""
        self.attached.append(handle)
        return handle

    def add_step(self, handle: Any) -> Any:
        """Keep ``handle`` until the step ends (:meth:`remove_step`); returns it."""
        self.step.append(handle)
        return handle

    def extend_step(self, handles: Iterable[Any]) -> None:
        self.step.extend(handles)

    def remove_step(self) -> None:
        """Remove the step's handles."""
        step, self.step = self.step, []
        _remove(step)

    def remove_all(self, *, quiet: bool = False) -> None:
        """Remove every handle; a failing one does not stop the rest (its error is raised after them, or
        dropped with ``quiet``: a tensor hook whose tensor is gone)."""
        handles, self.attached, self.step = self.attached + self.step, [], []
        _remove(handles, quiet)

    def __len__(self) -> int:
        return len(self.attached) + len(self.step)


def _remove(handles: list[Any], quiet: bool = False) -> None:
    errors = []
    for h in handles:
        try:
            h.remove()
        except Exception as e:  # noqa: BLE001 - the rest are removed first; the first error is raised after
            errors.append(e)
    if errors and not quiet:
        raise errors[0]
