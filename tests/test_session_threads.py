"""Session state read on one thread while the training thread writes it (the remote agent's I/O thread, the
notebook's listener, a notebook reading a ``dbg.run()`` worker): each read sees one moment.

Each test races a writer looping as training does against a reader checking that what it got agrees with
itself; the thread switch interval is made tiny so that the interleavings a real run meets once in a while
happen many times a second.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from nbdebug.session.session import Session
from nbdebug.session.stats import FIELDS, StatsTable
from nbdebug.watch.watchpoints import WatchManager


@contextmanager
def switching_often() -> Iterator[None]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


def race(write: Callable[[int], None], read: Callable[[], None], reads: int, writes: int = 1_000_000) -> None:
    """``write(i)`` in a loop on a thread of its own while ``read()`` runs ``reads`` times here; an exception
    on the writer's thread fails the test too."""
    stop, failed = threading.Event(), []

    def writer() -> None:
        try:
            i = 0
            while not stop.is_set() and i < writes:
                write(i)
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported below
            failed.append(e)

    t = threading.Thread(target=writer)
    with switching_often():
        t.start()
        try:
            for _ in range(reads):
                read()
                if failed:
                    break
        finally:
            stop.set()
            t.join()
    if failed:
        raise failed[0]


def _table(step: int, keys: list[tuple[str, str]]) -> StatsTable:
    values = np.zeros((len(keys), len(FIELDS)))
    values[:, FIELDS.index("norm")] = step
    values[:, FIELDS.index("count")] = 1
    return StatsTable.from_rows(keys, ["float32"] * len(keys), [(1,)] * len(keys), values)


def test_watchpoints_set_from_another_thread_while_training_checks_its_steps():
    """The notebook (or the agent's thread, serving a ``watch`` request) sets and deletes watchpoints while the
    training thread evaluates them at each step end and adds nodes: neither thread meets a dict or a graph
    changing under its loop ("dictionary changed size during iteration" ended the training step)."""
    s = Session(framework="numpy")
    for i in range(200):
        s.graph.add_node(f"Functional.relu.{i}.forward", kind="op", op_type="relu")
    keys = [(n, "output.0") for n in s.graph.nodes]
    s.steps[0] = _table(0, keys)
    wm = WatchManager(s)
    for _ in range(3):
        wm.watch("TR", nodes="Functional.relu.1*", range_start_inclusive=-1.0, range_end_inclusive=1.0,
                 range_percentage_gt=50.0)

    def train(i: int) -> None:
        s.graph.add_node(f"Module.new.{i}.forward", kind="module", op_type="Linear")
        wm.check(0)

    made: list[int] = []

    def notebook() -> None:
        made.append(wm.watch("TR", nodes="Functional.relu.2*", range_start_inclusive=-1.0, range_end_inclusive=1.0,
                 range_percentage_gt=50.0).id)
        if len(made) > 20:
            wm.delete(made.pop(0))

    race(train, notebook, reads=300)


def test_timeline_read_while_steps_leave_the_window_has_each_step_once():
    """A step timeline (history, then the window) read while training ends steps, each pushing the oldest one
    from the window to the compact history: every step up to the last one read, once, with its own value."""
    s = Session(framework="numpy", stats_window=4)
    s.graph.add_node("a", kind="op", op_type="relu")
    keys = [("a", "output.0")]

    def train(i: int) -> None:
        s.recorder.add(keys[0], 0, "float32", (1,), 1)
        raw = np.zeros((1, 9))
        raw[0, 4] = float(s.step_index) ** 2  # sq_sum: the norm is the step
        s.end_step(raw)

    def notebook() -> None:
        steps, values = s.timeline("a", "output.0", "norm")
        assert steps == list(range(len(steps))), steps[:3] + ["..."] + steps[-3:]
        assert values == [float(k) for k in steps]

    race(train, notebook, reads=300, writes=30_000)
