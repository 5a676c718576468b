"""A ``torchrun`` job (2 ranks, gloo, CPU, ``tests/remote_scripts/ddp_nan.py``) whose notebook goes away and
comes back — the listener closed and a new one opened on the same port with the same token, as when the
kernel restarts mid-run — is shown and controlled as it is, not as a fresh listener imagines it:

* from its hello until its state arrives a rank shows ``connecting`` and is not counted live (before: a
  rank that had just reconnected showed ``idle, step 0``, and ``live_count()`` counted it);
* when ``live_count()`` reports the ranks, each shows its real state and step;
* a group command issued while a rank is still connecting (``job.pause()`` at its hello) is not lost: the
  rank gets it when its state arrives (the listener's ``notice`` says so) and both ranks pause at one step
  boundary; ``job.terminate()`` then ends both.

Then the same rules at the protocol level, with processes played by raw sockets (deterministic, fast): a
group command given while one is connecting reaches it after its state, one given while a rank is not back
yet waits briefly for it, ranks that never connected are named, and a request a process will not answer (it
reconnected) fails at once instead of after its time-out.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import pytest
import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from remote_procs import ddp_nan_job, until

import nbdebug
from nbdebug.remote import absent
from nbdebug.remote import protocol as P


def ddp_job(env, tmp_path, gate, steps):
    """The 2-rank DDP job with no NaN (the faulty rank's step is past the end)."""
    return ddp_nan_job(env, tmp_path, gate, steps, 1, steps + 1)


def _states(listener):
    return {k: (str(s.state), s.step_index, s.current_node) for k, s in listener.sources.items()}


def _at_each_hello(listener, then=None):
    """What every source of ``listener`` showed at each hello (the ``connected`` event, on the listener's thread
    before the new process's sync can arrive): ``[{key: (state, live)}]``; ``then(shown)`` after each."""
    seen = []

    def on_state(what):
        if what == "connected":
            live = listener.live()
            seen.append({k: (str(s.state), s in live) for k, s in listener.sources.items()})
            if then is not None:
                then(seen[-1])

    listener.hub.on("state", on_state)
    return seen


def test_a_job_reconnected_to_a_new_listener_shows_its_state_and_obeys_it(tmp_path, monkeypatch):
    first = nbdebug.listen(quiet=True)
    port, token = first.port, first.token
    gate = tmp_path / "go"
    listeners = [first]
    try:
        with ddp_job(first.env, tmp_path, gate, steps=3000) as (proc, log):
            until(lambda: first.live_count() == 2 or proc.poll() is not None, 120, "both ranks")
            assert first.live_count() == 2, log.read_text()[-3000:]
            gate.write_text("go")
            until(lambda: min(s.step_index for s in first.sources.values()) >= 5, 60, lambda: _states(first))
            left_at = min(s.step_index for s in first.sources.values())
            first.close()  # the notebook goes: the ranks train on and reconnect when one listens again

            monkeypatch.setattr(absent, "CONNECTING_WAIT_S", 0.0)  # a command does not wait for a rank's state
            second = nbdebug.listen(port, token=token, quiet=True)
            listeners.append(second)
            asked = []

            def pause_at(shown):  # both ranks known, the one just back connecting: pause the job right then
                if len(shown) == 2 and not asked:
                    asked.append(threading.Thread(target=second.job.pause))
                    asked[0].start()

            hellos = _at_each_hello(second, pause_at)
            until(lambda: second.live_count() == 2, 60, lambda: f"both ranks back; {_states(second)}")
            at_live = _states(second)
            assert len(hellos) >= 2, hellos
            for shown in hellos:  # a rank whose state has not arrived is "connecting", and not live
                assert all(live if state != "connecting" else not live for state, live in shown.values()), hellos
                assert all(state in ("connecting", "running", "paused") for state, _live in shown.values()), hellos
            assert list(at_live) == [0, 1] and all(state in ("running", "paused") and step >= left_at
                                                   for state, step, _n in at_live.values()), (at_live, left_at)
            # the pause given while a rank was connecting reached it when its state came: one boundary for both
            until(lambda: len({v for v in _states(second).values()}) == 1
                  and all(v[0] == "paused" and v[2] is None for v in _states(second).values()), 30,
                  lambda: f"both ranks paused at one step boundary; {_states(second)}; {second.notice!r}; {hellos}")
            assert "connecting or away" in second.notice and "when back" in second.notice, second.notice
            second.job.terminate()  # both paused at one boundary: both end cleanly
            until(lambda: [s for s, _i, _n in _states(second).values()] == ["terminated", "terminated"], 30,
                  lambda: f"both ranks terminated; {_states(second)}")
            until(lambda: proc.poll() is not None, 30, "the job's end")
            assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        ranks = {s.info.get("pid") for listener in listeners for s in listener.sources.values()}
        for listener in listeners:
            listener.close()
        for pid in ranks:  # torchrun starts each rank in a session of its own: killing its group leaves them
            with contextlib.suppress(OSError, TypeError):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"ddp_nan.py" in f.read():  # still that rank (not a pid used again since)
                        os.kill(pid, signal.SIGKILL)


class Rank:
    """A rank played by a raw DEALER socket speaking the protocol."""

    def __init__(self, ctx, listener, rank, world=2, pid=None):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://{listener.address}")
        self.hello = {"type": "hello", "token": listener.token, "pid": pid or 1000 + rank, "host": "h", "rank": rank,
                      "world_size": world, "framework": "pytorch"}

    def send(self, head):
        self.sock.send_multipart(P.encode(head))

    def recv(self, timeout=10.0):
        assert self.sock.poll(int(timeout * 1000)), "nothing from the listener"
        return P.decode(self.sock.recv_multipart())[0]

    def connect(self, state=None, step=7):
        self.send(self.hello)
        assert self.recv()["type"] == "welcome"
        if state is not None:
            self.send({"type": "sync", "graph": {}, "watchpoints": [], "hits": [], "step_index": step})
            self.send({"type": "state", "state": state, "step_index": step})


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(0)


def test_a_command_given_while_a_rank_connects_reaches_it_after_its_state(ctx, monkeypatch):
    monkeypatch.setattr(absent, "CONNECTING_WAIT_S", 0.0)
    with nbdebug.listen(quiet=True) as listener:
        r0, r1 = Rank(ctx, listener, 0), Rank(ctx, listener, 1)
        r0.connect("running")
        until(lambda: listener.live_count() == 1, 10, "rank 0 live")
        r1.connect()  # hello and welcome; its state not yet
        src = listener.sources[1]
        assert str(src.state) == "connecting" and listener.live() == [listener.sources[0]]
        assert listener.joined_count() == 2
        panel = src.panel()  # what the notebook shows of it: connecting, no control yet
        assert panel.header.state.value.endswith(">connecting</span>"), panel.header.state.value
        assert "connecting" in panel.controls.status.value and panel.controls.pause.disabled
        assert panel.controls.terminate.disabled
        job = listener.job
        thread = threading.Thread(target=job.terminate)
        thread.start()
        head = r0.recv()
        assert (head["type"], head["op"]) == ("request", "terminate")
        r0.send({"type": "reply", "re": head["id"], "ok": True, "result": None})
        thread.join(10)
        assert "process 1 is connecting or away" in listener.notice
        assert not r1.sock.poll(300)  # nothing sent to it before its state
        r1.send({"type": "sync", "graph": {}, "watchpoints": [], "hits": [], "step_index": 7})
        r1.send({"type": "state", "state": "running", "step_index": 7})
        head = r1.recv()
        assert (head["type"], head["op"]) == ("request", "terminate")
        assert str(src.state) == "running" and src.step_index == 7


def test_a_command_waits_briefly_for_a_rank_not_back_yet(ctx):
    """After a kernel restart the ranks come back about together: a terminate given when one is back reaches the
    other too, if it connects within ``CONNECTING_WAIT_S``."""
    with nbdebug.listen(quiet=True) as listener:
        r0, r1 = Rank(ctx, listener, 0), Rank(ctx, listener, 1)
        r0.connect("running")
        until(lambda: listener.live_count() == 1, 10, "rank 0 live")
        thread = threading.Thread(target=listener.job.terminate)
        thread.start()
        time.sleep(0.3)
        assert not r0.sock.poll(0)  # waiting for rank 1 of the world size rank 0 announced
        r1.connect("running")
        for r in (r0, r1):
            head = r.recv()
            assert (head["type"], head["op"]) == ("request", "terminate")
            r.send({"type": "reply", "re": head["id"], "ok": True, "result": None})
        thread.join(10)
        assert not thread.is_alive() and listener.notice == ""


def test_ranks_that_never_connected_are_named(ctx, monkeypatch):
    monkeypatch.setattr(absent, "CONNECTING_WAIT_S", 0.0)
    with nbdebug.listen(quiet=True) as listener:
        r0 = Rank(ctx, listener, 0, world=3)
        r0.connect("running")
        until(lambda: listener.live_count() == 1, 10, "rank 0 live")
        with pytest.warns(RuntimeWarning, match="ranks 1, 2 of the job never connected here"):
            threading.Thread(target=lambda: r0.send({"type": "reply", "re": r0.recv()["id"], "ok": True}),
                             daemon=True).start()
            listener.terminate_all()


def test_a_request_to_a_process_that_reconnects_fails_at_once(ctx):
    with nbdebug.listen(quiet=True) as listener:
        old = Rank(ctx, listener, 0, world=1)
        old.connect("paused")
        until(lambda: listener.live_count() == 1, 10, "the process live")
        src = listener.sources[0]
        failed = []

        def ask():
            try:
                src.tensor("n", "output.0")
            except RuntimeError as e:
                failed.append((time.monotonic(), str(e)))

        thread = threading.Thread(target=ask)
        thread.start()
        assert old.recv()["op"] == "tensor"  # asked; it goes away before answering and comes back
        new = Rank(ctx, listener, 0, world=1)
        at = time.monotonic()
        new.connect("paused")
        thread.join(10)
        assert failed and failed[0][0] - at < 5, failed  # not the request's 30 s time-out
        assert "tensor: process 0 reconnected before answering" in failed[0][1]
        until(lambda: str(src.state) == "paused", 10, "its state again")
