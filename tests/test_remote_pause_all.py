"""``Listener.pause_all`` stops every process at the earliest step boundary all of them can reach — the end of the
step the furthest one is in — not one step later (issue 20 item 4: pause-all within 2 step periods at 1,000
ranks). A process found past that boundary moves it for all, and the processes already paused short of it are
resumed up to it, so none waits alone in a collective.

First against scripted processes that follow ``Controller.pause_after``'s rules (every case, deterministic),
then against simulated ranks speaking the real protocol (``bench/hub.py``'s ``_rank_loop``)."""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
import types
from pathlib import Path

import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)

import nbdebug
from nbdebug.remote.hub import landing

BENCH = Path(__file__).resolve().parent.parent / "bench"


class Proc:
    """A process as ``Controller.pause_after`` behaves: ``index`` is the step in progress; paused at a boundary
    means after step ``index - 1``. ``heard`` is what the listener's mirror last heard (it may lag)."""

    def __init__(self, key, index, heard=None, paused=False, race=False):
        self.key, self.index, self.paused, self.race = key, index, paused, race
        self.current_node, self.pause_reason, self.connected = None, "", True
        self.session = types.SimpleNamespace(step_index=index if heard is None else heard)
        self.pause_after = None
        self.asked: list[tuple[str, object]] = []

    @property
    def state(self):
        return "paused" if self.paused else "running"

    @property
    def step_index(self):  # as its state message tells the listener
        return self.index

    def serve(self, op, args):
        self.asked.append((op, args.get("step")))
        if op == "cont":
            self.paused = False
            return None
        step = args["step"]
        if step is None:  # forget the boundary (cont_all)
            self.pause_after = None
            return {"step_index": self.index, "state": self.state, "at_boundary": self.paused}
        if self.race:  # answers "running in the next step" while still ending this one, then pauses there
            self.race = False
            self.pause_after = step
            reply = {"step_index": self.index + 1, "state": "running", "at_boundary": False}
            self.index, self.paused = self.index + 1, True
            return reply
        done = self.index - 1 if self.paused else None
        self.pause_after = None if done is not None and done >= step else step
        return {"step_index": self.index, "state": "paused" if self.paused else "running",
                "at_boundary": self.paused}

    def stops_at(self):
        """The boundary it ends at once every request was served and it runs on (None: never pauses)."""
        if self.paused:
            return self.index - 1
        return None if self.pause_after is None else max(self.index, self.pause_after)


def _listener_over(monkeypatch, procs):
    listener = nbdebug.listen(quiet=True)
    monkeypatch.setattr(listener, "live", lambda: list(procs))
    monkeypatch.setattr(listener, "request_all",
                        lambda sources, op, args, *a, **k: [(p.serve(op, dict(args)), []) for p in sources])
    return listener


def test_pause_all_stops_at_the_end_of_the_furthest_step_not_one_later(monkeypatch):
    procs = [Proc(r, 5) for r in range(4)]
    listener = _listener_over(monkeypatch, procs)
    try:
        assert listener.pause_all() == 5  # the end of step 5, which every rank is in: the earliest boundary
        assert [p.stops_at() for p in procs] == [5] * 4
        assert all(p.asked == [("pause_at_step", 5)] for p in procs)  # one round, no cont
    finally:
        listener.close()


def test_a_process_past_the_boundary_moves_it_for_all(monkeypatch):
    # the mirror heard step 5 of everyone, but rank 2 already finished it: it stops at the end of step 6
    procs = [Proc(0, 5), Proc(1, 5), Proc(2, 6, heard=5), Proc(3, 5)]
    listener = _listener_over(monkeypatch, procs)
    try:
        assert listener.pause_all() == 6
        assert [p.stops_at() for p in procs] == [6] * 4
        assert procs[2].asked == [("pause_at_step", 5)]  # bound for 6 already: not asked again
        assert all(p.asked == [("pause_at_step", 5), ("pause_at_step", 6)] for p in (procs[0], procs[1], procs[3]))
    finally:
        listener.close()


def test_processes_paused_short_of_the_boundary_are_resumed_up_to_it(monkeypatch):
    # rank 1 paused at the end of step 4 (a hit, or the user); rank 3 already in step 6: the others can only
    # meet at the end of step 6, and rank 1 must run there (else rank 3 waits for it in the allreduce)
    procs = [Proc(0, 5), Proc(1, 5, paused=True), Proc(2, 5), Proc(3, 6)]
    listener = _listener_over(monkeypatch, procs)
    try:
        assert listener.pause_all() == 6
        assert ("cont", None) in procs[1].asked and procs[1].pause_after == 6
        assert [p.stops_at() for p in procs] == [6] * 4
        assert all(("cont", None) not in p.asked for p in (procs[0], procs[2], procs[3]))
    finally:
        listener.close()


def test_a_process_paused_at_a_later_boundary_by_itself_sets_it(monkeypatch):
    procs = [Proc(0, 7), Proc(1, 8, paused=True), Proc(2, 7)]  # rank 1 paused after step 7 on a hit
    listener = _listener_over(monkeypatch, procs)
    try:
        assert listener.pause_all() == 7
        assert [p.stops_at() for p in procs] == [7] * 3
        assert procs[1].pause_after is None  # nothing left pending on the one already there
    finally:
        listener.close()


def test_an_answer_that_raced_the_boundary_is_corrected_from_its_state_message(monkeypatch):
    # rank 0 answers "running in step 6" while it is still ending step 5, then pauses at the end of 5 after
    # all: the boundary moves to 6; rank 0's state message (paused after step 5) has it asked again and resumed
    procs = [Proc(0, 5, race=True), Proc(1, 5), Proc(2, 5)]
    listener = _listener_over(monkeypatch, procs)
    try:
        assert listener.pause_all() == 6
        assert procs[0].stops_at() == 5  # short of the others: they would wait for it in the allreduce
        procs[0].pause_reason = "step 5 done (asked to pause after step 5)"
        listener._paused_short(procs[0])
        end = time.monotonic() + 10
        while procs[0].asked[-1] != ("cont", None):
            assert time.monotonic() < end, procs[0].asked
            time.sleep(0.01)
        assert procs[0].asked[-2:] == [("pause_at_step", 6), ("cont", None)]
        assert [p.stops_at() for p in procs] == [6] * 3
    finally:
        listener.close()


def test_a_hit_or_a_continue_is_not_resumed_as_short(monkeypatch):
    procs = [Proc(0, 5, paused=True), Proc(1, 6)]
    listener = _listener_over(monkeypatch, procs)
    try:
        assert listener.pause_all() == 6
        procs[0].paused, procs[0].index = True, 6  # paused after step 5 again, on a hit: line_up's business
        procs[0].pause_reason = "1 watchpoint hit in step 5"
        asked = len(procs[0].asked)
        listener._paused_short(procs[0])
        listener.cont_all()  # a continue forgets the boundary: nothing is resumed towards it afterwards
        procs[0].paused, procs[0].pause_reason = True, "paused"
        listener._paused_short(procs[0])
        time.sleep(0.2)
        assert ("pause_at_step", 6) not in procs[0].asked[asked:]
    finally:
        listener.close()


def test_landing_reads_each_answer():
    assert landing({"step_index": 4, "state": "running"}, 6) == 6  # behind: runs to the target
    assert landing({"step_index": 6, "state": "paused", "at_boundary": False}, 6) == 6  # paused at a node
    assert landing({"step_index": 6, "state": "paused", "at_boundary": True}, 6) is None  # short by one step


def test_simulated_ranks_pause_at_the_end_of_the_step_they_are_in():
    """Four ranks over the real protocol, stepping together every second: asked 0.2 and 0.6 of a period
    into step k, every rank pauses after step k (the old margin stopped them after k + 1), within a period."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))  # the spawned worker imports bench/hub.py by name (it gets this path)
    import hub as bench

    period, ranks = 1.0, 4
    listener = nbdebug.listen(quiet=True)
    proc = mp.get_context("spawn").Process(target=bench._rank_loop, daemon=True, args=(
        listener.address, listener.token, list(range(ranks)), ranks, 10, period, time.monotonic() + 120, 10))
    proc.start()
    try:
        listener.wait_for(ranks, 60)
        srcs = list(listener.sources.values())
        for phase in (0.2, 0.6):
            first = min(s.step_index for s in srcs)
            while min(s.step_index for s in srcs) <= first:  # a step boundary just passed, every message in
                time.sleep(0.005)
            time.sleep(phase * period)
            k = max(s.step_index for s in srcs)
            t0 = time.monotonic()
            assert listener.pause_all() == k
            while not all(str(s.state) == "paused" for s in srcs):
                assert time.monotonic() - t0 < 10 * period, [str(s.state) for s in srcs]
                time.sleep(0.005)
            took = time.monotonic() - t0
            assert [s.step_index for s in srcs] == [k + 1] * ranks  # all paused after step k
            assert took < (1 - phase) * period + 0.5, took  # at that boundary, not a step later
            listener.cont_all()
        listener.terminate_all()
    finally:
        listener.close()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
