"""The notebook's copy of a remote process's session: a real :class:`Session` fed by the agent's messages.

Finished steps arrive as whole :class:`StatsTable` objects (one ``step`` message each); the step in
progress arrives as a partial table when training pauses inside it. Everything the views read from a
session — ``steps``, ``step_index``, ``recorder`` (for "is a step in progress"), ``table``,
``node_table``, ``stats``, ``timeline``, the compact history past the window — works as on the live
session; tensor values are not here (the :class:`~nbdebug.remote.source.RemoteSource` fetches them).

>>> import numpy as np
>>> from nbdebug.session.stats import StatsTable
>>> m = MirrorSession(framework="pytorch")
>>> _ = m.graph.add_node("a", kind="op", op_type="relu")
>>> m.put_step(0, StatsTable.from_rows([("a", "output.0")], ["float32"], [(2,)], np.zeros((1, 10))))
>>> m.step_index, m.stats("a", "output.0", 0)["shape"]
(1, (2,))
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..session.session import Session, StepRecorder
from ..session.stats import FIELDS, StatsTable
from ..session.store import NotRetainedError


class MirrorSession(Session):
    """A session whose tables come over the wire (no adapter writes into it)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._remote_partial: StatsTable | None = None

    def put_step(self, step: int, table: StatsTable) -> None:
        """A finished step: keep its table (older ones leave the window for the compact history)."""
        with self.lock:
            self.steps[step] = table
            if step >= self.step_index:
                self.step_index = step + 1
                self.set_partial(None)
            if self.stats_window is not None:
                while len(self.steps) > self.stats_window:
                    old = min(self.steps)
                    self.history.add(old, self.steps.pop(old))

    def set_partial(self, table: StatsTable | None) -> None:
        """The statistics of the step in progress so far (None: nothing recorded in it yet)."""
        with self.lock:
            self._remote_partial = table
            rec = StepRecorder()
            if table is not None:
                for i, key in enumerate(table.keys):
                    rec.add(key, i, table.dtypes[i], table.shapes[i], int(table.values[i, FIELDS.index("count")]))
                rec.unsupported = dict(table.unsupported)
            self.recorder = rec

    def reset(self) -> None:
        """Forget the statistics (a process re-synchronizes after a reconnect); the graph stays."""
        with self.lock:
            self.steps.clear()
            self.set_partial(None)

    def table(self, step: int) -> StatsTable:
        if step == self.step_index and step not in self.steps:
            partial = self._remote_partial
            if partial is not None:
                return partial
            return StatsTable()
        return super().table(step)

    def node_table(self, node: str) -> StatsTable:
        partial = self._remote_partial
        if partial is None:
            return StatsTable()
        idx = [i for i, (n, _s) in enumerate(partial.keys) if n == node]
        table = StatsTable.from_rows([partial.keys[i] for i in idx], [partial.dtypes[i] for i in idx],
                                     [partial.shapes[i] for i in idx],
                                     partial.values[idx] if idx else np.zeros((0, len(FIELDS))))
        table.unsupported = {j: partial.unsupported[i] for j, i in enumerate(idx) if i in partial.unsupported}
        return table

    def tensor(self, node: str, slot: str, step: int | str = "current") -> np.ndarray:
        raise NotRetainedError(f"{node} {slot}: values of a remote process are fetched from it "
                               "(RemoteSource.tensor), not kept in the notebook")
