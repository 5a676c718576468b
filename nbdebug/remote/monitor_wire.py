"""A step's monitor row over the wire: the agent adds it to each ``step`` message, the notebook's mirror records it.

The ``step`` message's ``monitor`` part (PROTOCOL.md) is ``{"start", "keys", "rows"}`` and two frames: the
series' column ids (``<i4``) and their values (``<f4``, the monitor keeps float32). ``keys`` are the
``[name, field]`` of series new on this connection, ids ``start, start + 1, …`` — a series' name travels once,
rows then carry integer ids (as the statistics tables' :class:`~nbdebug.remote.protocol.KeyBook`). Only the
series with a value at that step travel. The receiving side records the row into the mirror session's
:class:`~nbdebug.session.monitor.Monitor`, so the notebook has every rank's monitor series — what ODD_RANK
(:mod:`nbdebug.job.odd_rank`), the job timeline and the temporal watchpoints read; a step replayed after a
reconnect (already recorded) is skipped.

>>> import numpy as np
>>> from nbdebug.session.monitor import Monitor
>>> mon, mirror = Monitor(), Monitor()
>>> send, receive = MonitorSender(), MonitorReceiver()
>>> for step in range(2):
...     mon.record(step, [("Run", "loss"), ("Parameter.w", "update_ratio")], np.array([3.0 - step, 1e-3]))
...     head, frames = send.part(mon, step)
...     _ = receive.apply(head, frames, step, mirror)
>>> head["keys"], mirror.value(1, "Run", "loss"), mirror.last_step
([], 2.0, 1)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .protocol import ProtocolError, array_frame

Key = tuple[str, str]


class MonitorSender:
    """The agent's side: which series this connection has named so far (:meth:`reset` on a new connection)."""

    def __init__(self) -> None:
        self.sent = 0

    def reset(self) -> None:
        self.sent = 0

    def part(self, monitor: Any, step: int) -> tuple[dict[str, Any] | None, list[Any]]:
        """``(header, [ids, values])`` of ``step``'s row, or ``(None, [])`` when the monitor has none."""
        if monitor is None:
            return None, []
        row = monitor.row(step)
        if not row:
            return None, []
        keys = monitor.keys
        start, self.sent = self.sent, len(keys)
        col = {k: i for i, k in enumerate(keys)} if start == 0 or len(row) > 64 else None
        ids = np.fromiter((col[k] if col is not None else keys.index(k) for k in row), "<i4", len(row))
        values = np.fromiter(row.values(), "<f4", len(row))
        head = {"start": start, "keys": [[n, f] for n, f in keys[start:]], "rows": len(row)}
        return head, [array_frame(ids), array_frame(values)]


    def replay(self, monitor: Any, first: int, chunk: int = 256) -> list[tuple[dict[str, Any], list[Any]]]:
        """The full-resolution rows of steps ``first`` on (those a notebook that reconnected lacks: every one
        after a kernel restart) as ``monitor`` messages' ``(header, [ids, values])``, ``chunk`` steps each —
        ``{"start", "keys", "steps", "rows"}`` (``rows``: each step's series count; the frames hold the steps'
        ids and values one after the other). Steps folded into min/max blocks (older than the monitor's
        ``horizon``) have no row to send. Only rows complete when this is called (read at one moment)."""
        if monitor is None or monitor.last_step is None:
            return []
        keys, steps, values, has = monitor.full_rows()  # of one moment (training goes on meanwhile)
        if not len(steps) or not keys:
            return []
        pick = np.flatnonzero(steps >= first)
        out = []
        for lo in range(0, len(pick), chunk):
            part = pick[lo:lo + chunk]
            counts = has[part].sum(axis=1)
            rows, cols = np.nonzero(has[part])
            start, self.sent = self.sent, len(keys)
            head = {"start": start, "keys": [[n_, f] for n_, f in keys[start:]],
                    "steps": [int(x) for x in steps[part]], "rows": [int(c) for c in counts]}
            out.append((head, [array_frame(cols.astype("<i4")),
                               array_frame(values[part][rows, cols].astype("<f4"))]))
        return out


class MonitorReceiver:
    """The notebook's side: the connection's series names by id (:meth:`reset` when the process re-syncs)."""

    def __init__(self) -> None:
        self.names: list[Key] = []
        self._last: tuple[bytes, list[Key]] | None = None  # the previous row's ids and keys (usually the same)

    def reset(self) -> None:
        self.names, self._last = [], None

    def apply(self, head: Mapping[str, Any], frames: Sequence[Any], step: int, monitor: Any) -> bool:
        """Record the row into ``monitor``; False when ``step`` is already there (a replay)."""
        start = int(head.get("start", -1))
        if start != len(self.names):
            raise ProtocolError(f"monitor series ids start at {start}, {len(self.names)} known")
        self.names.extend((str(n), str(f)) for n, f in head.get("keys", ()))
        n = int(head["rows"])
        if len(frames) < 2:
            raise ProtocolError("a monitor row needs two frames (ids, values)")
        raw_ids, raw_values = memoryview(frames[0]), memoryview(frames[1])
        if n < 0 or raw_ids.nbytes != 4 * n or raw_values.nbytes != 4 * n:
            raise ProtocolError(f"monitor frames of {raw_ids.nbytes} and {raw_values.nbytes} bytes do not hold "
                                f"{n} series")
        raw = raw_ids.tobytes()
        if self._last is None or self._last[0] != raw:  # a new id list (usually the previous row's: no work)
            ids = np.frombuffer(raw, "<i4")
            if n and (int(ids.min()) < 0 or int(ids.max()) >= len(self.names)):
                raise ProtocolError("unknown monitor series id")
            self._last = (raw, [self.names[i] for i in ids.tolist()])  # one key list object: Monitor.record's fast path
        if monitor.last_step is not None and step <= monitor.last_step:
            return False
        values = np.frombuffer(raw_values, "<f4")  # record copies it into its own columns
        monitor.record(step, self._last[1], values)
        return True

    def apply_rows(self, head: Mapping[str, Any], frames: Sequence[Any], monitor: Any) -> int:
        """Record a ``monitor`` message's rows (:meth:`MonitorSender.replay`) into ``monitor``, skipping the steps
        it already has; returns how many were recorded."""
        steps, counts = head.get("steps"), head.get("rows")
        if (not isinstance(steps, list) or not isinstance(counts, list) or len(steps) != len(counts)
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in [*steps, *counts])):
            raise ProtocolError("a monitor message needs lists of steps and row lengths, as long as each other")
        total = sum(counts)
        ids_all = np.frombuffer(memoryview(frames[0]).tobytes(), "<i4") if len(frames) >= 2 else None
        if ids_all is None or len(ids_all) != total or memoryview(frames[1]).nbytes != 4 * total:
            raise ProtocolError(f"monitor frames do not hold {total} values")
        values_all = np.frombuffer(memoryview(frames[1]).tobytes(), "<f4")
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        done = 0
        for i, step in enumerate(steps):
            lo, hi = int(offsets[i]), int(offsets[i + 1])
            part = {"start": len(self.names), "keys": head.get("keys", ()) if i == 0 else (), "rows": hi - lo}
            if i == 0 and int(head.get("start", -1)) != len(self.names):
                raise ProtocolError(f"monitor series ids start at {head.get('start')}, {len(self.names)} known")
            done += self.apply(part, [ids_all[lo:hi].tobytes(), values_all[lo:hi].tobytes()], step, monitor)
        return done
