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
import pytest

from nbdebug.session.session import Session, StatsNotRetainedError
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

    # writes bounded: each adds a node, and a check over a graph that grows without end got slower and
    # slower (once 600 s, with the reader starved)
    race(train, notebook, reads=150, writes=400)


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


@pytest.mark.parametrize("on_host", [True, False], ids=["host-rows", "queued-rows"])
def test_step_in_progress_read_while_training_records_it_is_one_moment_of_it(on_host):
    """The statistics of the step in progress (what "current" shows while training runs: the panel, a remote
    ``tensor`` request checking its value) read while the training thread records tensors and ends steps:
    every row read is its own tensor's, of that step, and no row the reader did not finish is lost for the
    step's table. ``queued-rows``: rows computed on the device and moved to the host when read (a GPU's;
    here the same queue on the CPU), which a read on another thread moves too."""
    import torch

    from nbdebug.frameworks.torch.stats import StatsBuffer

    per_step = 40
    s = Session(framework="pytorch")

    def new_buffer() -> StatsBuffer:
        buf = StatsBuffer(capacity=4)  # grows while the step records
        buf.fast = on_host
        s.raw_source = buf.raw
        return buf

    state = {"buf": new_buffer()}

    def train(i: int) -> None:
        step, j = s.step_index, len(s.recorder.keys)
        row, dtype, _ = state["buf"].add(torch.full((3,), float(step * 1000 + j)))
        s.recorder.add((f"n{j}", "output.0"), row, dtype, (3,), 3)
        if j + 1 == per_step:
            s.end_step(state["buf"].raw())
            state["buf"] = new_buffer()

    def check(table: StatsTable, step: int) -> None:
        assert len(table.keys) == len(table.dtypes) == len(table.shapes) == len(table.values) <= per_step
        want = [step * 1000 + int(node[1:]) for node, _slot in table.keys]
        assert table.values[:, FIELDS.index("max")].tolist() == want, step

    def notebook() -> None:
        step = s.step_index
        try:
            check(s.table(step), step)
        except StatsNotRetainedError:  # it ended while the reader waited, and left the window since
            assert s.step_index > step + s.stats_window
        node = s.node_table("n3")  # what a remote tensor request checks its value against (the step then)
        assert len(node.keys) == len(node.values) <= 1
        if len(node.keys):
            now = int(node.values[0, FIELDS.index("max")]) // 1000
            assert now >= step and node.values[0, FIELDS.index("max")] == now * 1000 + 3
        if step - 1 in s.steps:
            check(s.steps[step - 1], step - 1)

    race(train, notebook, reads=3_000)
    for step, table in sorted(s.steps.items()):  # every finished step, read or not while it ran
        check(table, step)


def test_step_that_ends_while_a_reader_asks_for_it_is_read_as_finished():
    """The reader asks for step k while it is in progress, and the training thread ends k (and starts k+1)
    between the reader's look at the step index and its taking of the recorder: the reader gets k's finished
    table, not the rows of the step that replaced it (seen once under load: step 220 read with step 233's
    rows). The interleaving is forced here: the step ends exactly at the reader's take."""
    s = Session(framework="numpy")
    s.graph.add_node("a", kind="op", op_type="relu")

    def record(value: float) -> np.ndarray:
        s.recorder.add(("a", "output.0"), 0, "float32", (1,), 1)
        raw = np.zeros((1, 9))
        raw[0, FIELDS.index("max")] = raw[0, FIELDS.index("min")] = value
        return raw

    raw0 = record(5.0)
    s.raw_source = lambda: raw0
    take = s._in_progress

    def training_ends_the_step_first(*args):
        if s.step_index == 0:
            s.end_step(raw0)
            raw1 = record(7.0)  # the next step's first tensor
            s.raw_source = lambda: raw1
        return take(*args)

    s._in_progress = training_ends_the_step_first
    table = s.table(0)
    assert table.keys == [("a", "output.0")]
    assert table.values[0, FIELDS.index("max")] == 5.0


def test_rows_queued_on_a_device_are_kept_when_another_thread_moves_them(monkeypatch):
    """Rows computed on a device wait in a queue until read; a read on another thread (the step in progress
    shown while training runs, or checked for a remote ``tensor`` request) moves the queue to the host while
    the training thread queues more: a row queued during the move is not dropped with the queue (it kept
    uninitialised memory as its statistics). The training thread queues its row exactly then: when the
    reader starts the transfer."""
    import torch

    from nbdebug.frameworks.torch.stats import StatsBuffer

    buf = StatsBuffer(capacity=4)
    buf.fast = False  # every row queued, as on a GPU
    buf._host[:] = -1.0
    go, queued = threading.Event(), threading.Event()
    stack, reader = torch.stack, threading.get_ident()

    def transfer(*args: object, **kwargs: object) -> torch.Tensor:
        if threading.get_ident() == reader and not go.is_set():
            go.set()  # the reader is moving the queue: the training thread queues a row now
            assert queued.wait(10)
        return stack(*args, **kwargs)

    def train() -> None:
        assert go.wait(10)
        buf.add(torch.full((3,), 4.0))
        queued.set()

    for k in range(3):
        buf.add(torch.full((3,), float(k + 1)))
    t = threading.Thread(target=train)
    t.start()
    monkeypatch.setattr(torch, "stack", transfer)
    try:
        buf.raw()
    finally:
        monkeypatch.setattr(torch, "stack", stack)
        go.set()
        t.join()
    assert buf.raw()[:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_value_of_a_finished_step_read_while_the_next_one_starts_is_that_steps():
    """A retained value asked for (a remote ``tensor`` request, the panel's tensor view) while the training
    thread starts the next step, which moves the store's "current" values to "previous": the value of the step
    asked for, or the reason it is no longer kept — never "not retained" for a value that is."""
    from nbdebug.session.session import numpy_raw
    from nbdebug.session.store import NotRetainedError

    class Value:
        def __init__(self, arr: np.ndarray) -> None:
            self.arr, self.nbytes = arr, arr.nbytes

        def numpy(self) -> np.ndarray:
            return self.arr

    s = Session(framework="numpy")
    key = ("n", "output.0")

    def train(i: int) -> None:
        s.node("n", kind="op", op_type="relu")  # the step's first node: the store rotates
        arr = np.full(3, float(s.step_index))
        s.store.offer(key, Value(arr))
        s.recorder.add(key, 0, "float64", (3,), 3)
        s.end_step(numpy_raw(arr)[None, :])

    train(0)

    def notebook() -> None:
        step = s.step_index - 1
        try:
            got = s.tensor("n", "output.0", step)
        except NotRetainedError as e:  # only when two steps ended since (a slow reader)
            assert "are kept for the current" in str(e), str(e)
        else:
            assert got.tolist() == [float(step)] * 3

    race(train, notebook, reads=20_000)


def test_recheck_from_another_thread_while_training_checks_its_steps_loses_no_hit():
    """The notebook rechecks a finished step (the agent's thread serving ``recheck``) while the training thread
    checks each step it ends: both replace a step's hits in the one list, and no step's hits are lost to the
    other thread's write (a NaN step with no hit record)."""
    s = Session(framework="numpy", stats_window=4)
    s.graph.add_node("a", kind="op", op_type="relu")
    wm = WatchManager(s)
    wm.watch("TO")
    key = ("a", "output.0")

    def train(i: int) -> None:
        s.node("a", kind="op", op_type="relu")
        s.recorder.add(key, 0, "float32", (1,), 1)
        s.end_step(np.array([[np.nan, np.nan, np.nan, np.nan, np.nan, 0, 1, 0, 0]]))
        wm.check(s.step_index - 1)

    train(0)

    def notebook() -> None:
        window = sorted(s.steps)
        if window:
            try:
                wm.check(window[0])
            except KeyError:  # the step left the window meanwhile: nothing to recheck
                pass

    race(train, notebook, reads=3_000, writes=3_000)
    hit_steps = sorted(h.step for h in wm.hits if h.hits and (h.node, h.slot) == key)
    assert hit_steps == list(range(s.step_index))


def test_timeline_series_names_read_while_training_adds_modules():
    """The run timeline lists the modules (the panel, on the kernel's thread) while training — a ``dbg.run()``
    worker, or the listener applying a remote process's graph — adds module nodes."""
    from nbdebug.ui.timeline import RunSeries

    s = Session(framework="numpy")
    for i in range(300):
        s.graph.add_node(f"Module.layer{i}.Linear.forward.0", kind="module", op_type="Linear")
    series = RunSeries(s)

    def train(i: int) -> None:
        s.graph.add_node(f"Module.extra{i}.Linear.forward.0", kind="module", op_type="Linear")

    def notebook() -> None:
        assert len(series.names("norm")) >= 300

    race(train, notebook, reads=100, writes=5_000)


def test_graph_delta_taken_on_the_agents_thread_while_training_adds_slots():
    """The agent sends the graph from its own thread (a ``state`` message after a command it served, e.g.
    ``next_node``, or the sync after a reconnect) while the training thread, resumed, records new slots of a
    node: the node's record is taken as of one moment."""
    from nbdebug.remote.protocol import GraphDelta

    s = Session(framework="numpy")
    node = s.graph.add_node("Module.block.Block.forward.0", kind="module", op_type="Block")
    for k in range(50):
        node.shapes[f"output.{k}"] = (1,)

    def train(i: int) -> None:
        node.shapes[f"input.{i}"] = (i,)

    def agent() -> None:
        rec = GraphDelta().take(s.graph)["nodes"][0]
        assert len(rec["shapes"]) >= 50

    race(train, agent, reads=1_000, writes=2_000)


def test_notable_step_summary_is_readable_at_every_moment_of_its_move_aside():
    """Summary mode (many ranks): the listener's thread keeps a rank's latest summaries and moves older notable
    ones (a hit, a non-finite origin) aside while the job reads them on the kernel's thread: a notable step is
    in one place or the other at every moment (the first non-finite rank is not lost for a read). The read is
    made at the moment the move happens (the job reading then)."""
    from nbdebug.remote.source import SUMMARIES_KEPT, RemoteSource

    src = RemoteSource(None, b"rank0", {"rank": 0})
    readable: list[bool] = []

    class ReadWhenMoved(dict):
        def __setitem__(self, step: int, summary: object) -> None:
            readable.append(src.step_summary(step) is not None)  # a read on the job's thread, just now
            super().__setitem__(step, summary)

    src._notable = ReadWhenMoved()
    for step in range(SUMMARIES_KEPT + 5):
        src._put_summary({"rank": 0, "step": step, "tensors": 1, "nonfinite_tensors": 0, "nonfinite_values": 0,
                          "hits": 1}, step)
    assert readable == [True] * 5
    assert [src.step_summary(k) is not None for k in range(SUMMARIES_KEPT + 5)] == [True] * (SUMMARIES_KEPT + 5)


def test_processes_known_to_the_listener_stay_listed_while_another_one_joins():
    """The listener's thread files a joining process among the others in rank order while the notebook reads
    them (the job panel, ``pause_all`` on the processes live): every process that joined before is listed at
    every moment (refilling the dict in order left it empty for a moment: a group command then reached none).
    The notebook's read is made between every two lines the listener runs (a trace function)."""
    from nbdebug.remote import hub
    from nbdebug.remote.hub import Listener

    listener = Listener(token="t")
    seen: list[list[object]] = []

    def notebook(frame: object, event: str, arg: object) -> object:
        if event == "line":
            seen.append(list(listener.sources))
        return notebook

    def tracer(frame: object, event: str, arg: object) -> object:
        return notebook if frame.f_code.co_filename == hub.__file__ else None

    try:
        for rank in (5, 3, 4, 1):
            before = list(listener.sources)
            seen.clear()
            sys.settrace(tracer)
            try:
                listener._hello(b"id%d" % rank, {"type": "hello", "token": "t", "pid": 100 + rank, "host": "h",
                                                   "rank": rank})
            finally:
                sys.settrace(None)
            assert seen and all(set(before) <= set(keys) for keys in seen), (rank, before, seen)
        assert list(listener.sources) == [1, 3, 4, 5]
    finally:
        listener.close()


def test_job_steps_read_while_a_rank_thread_summarises_its_steps():
    """A job summarises a rank's step when the rank ends it — on the listener's receiving thread (a listener's
    job) or the rank's own training thread — while the notebook lists the job's steps (the job panel)."""
    from nbdebug.job import Job

    s = Session(framework="numpy", stats_window=None)
    s.graph.add_node("a", kind="op", op_type="relu")
    for step in range(3_000):
        s.steps[step] = _table(step, [("a", "output.0")])
    job = Job({0: s})

    def rank_thread(i: int) -> None:
        if i < 3_000:
            job.summary(0, i)

    def notebook() -> None:
        steps = job.steps
        assert steps == list(range(3_000))

    race(rank_thread, notebook, reads=3_000, writes=3_000)
