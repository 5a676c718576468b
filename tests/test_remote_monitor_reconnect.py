"""A remote process's monitor series stay complete in the notebook across a reconnect (issue 20): after the kernel
restarts (a new listener knows nothing of the process) the rows it lacks — every full-resolution one the
process holds — follow the ``sync``, as the statistics window and the hits do; after a blink of the same
listener only the missing rows travel, none twice.

The wire part alone (``MonitorSender.replay`` → ``MonitorReceiver.apply_rows``) first, then a real attached
PyTorch process (``remote_scripts/torch_train.py``)."""

from __future__ import annotations

import numpy as np
import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)
from remote_procs import finish, progress, start, until

import nbdebug
from nbdebug.remote import protocol as P
from nbdebug.remote.monitor_wire import MonitorReceiver, MonitorSender
from nbdebug.session.monitor import Monitor


def _recorded(steps, horizon=10_000):
    """A monitor of ``steps`` steps: ``Run/loss`` each step, a parameter's series every other step, a NaN the
    model computed at step 6, and a series that only appears from step 12."""
    mon = Monitor(horizon=horizon, block=2)
    for step in range(steps):
        keys = [("Run", "loss")] + ([("Parameter.w", "grad_norm")] if step % 2 == 0 else [])
        keys += [("Module.late", "output_norm")] if step >= 12 else []
        values = np.array([3.0 - 0.01 * step, np.nan if step == 6 else step + 0.5, 7.0][:len(keys)])
        mon.record(step, keys, values)
    return mon


def _same(a, b):
    keys = list(a.keys)
    sa, va = a.columns(keys)
    sb, vb = b.columns(keys)
    assert sa.tolist() == sb.tolist()
    assert np.array_equal(a.present(keys)[1], b.present(keys)[1])
    assert np.array_equal(va, vb, equal_nan=True)


def _through_the_wire(sender, receiver, mon, mirror, first, chunk):
    out = sender.replay(mon, first, chunk)
    for head, frames in out:  # as the transport carries them: encoded, then decoded
        decoded, got = P.decode(P.encode({"type": "monitor", **head}, frames))
        receiver.apply_rows(decoded, got, mirror)
    return out


def test_replay_sends_every_row_a_new_notebook_lacks():
    mon, mirror = _recorded(30), Monitor()
    out = _through_the_wire(MonitorSender(), MonitorReceiver(), mon, mirror, 0, chunk=7)
    assert len(out) == 5 and sum(len(h["steps"]) for h, _f in out) == 30
    assert out[0][0]["keys"] and not any(h["keys"] for h, _f in out[1:])  # names once per connection
    _same(mon, mirror)
    assert np.isnan(mirror.value(6, "Parameter.w", "grad_norm"))  # a NaN the model computed stays a value
    assert mirror.value(3, "Parameter.w", "grad_norm") is None  # an absent series stays absent


def test_replay_after_a_blink_sends_only_the_missing_rows():
    mon = _recorded(20)
    sender, receiver, mirror = MonitorSender(), MonitorReceiver(), Monitor()
    _through_the_wire(sender, receiver, mon, mirror, 0, chunk=64)
    more = _recorded(26)  # the process went on; the connection starts over (names again)
    sender.reset(), receiver.reset()
    out = _through_the_wire(sender, receiver, more, mirror, mirror.last_step + 1, chunk=64)
    assert [h["steps"] for h, _f in out] == [list(range(20, 26))]
    _same(more, mirror)


def test_replay_sends_the_full_resolution_rows_only():
    mon = _recorded(30, horizon=20)  # steps 0..9 folded into min/max blocks: no row of theirs exists
    mirror = Monitor(horizon=20, block=2)
    out = _through_the_wire(MonitorSender(), MonitorReceiver(), mon, mirror, 0, chunk=256)
    assert out[0][0]["steps"] == list(range(10, 30))
    assert mirror.value(25, "Run", "loss") == mon.value(25, "Run", "loss")


def test_replay_while_training_records_sends_each_step_its_own_values():
    """The agent replays on its own thread while the training thread records: every row sent carries the
    values of its own step (a step and another step's values read a moment apart was a CI failure)."""
    import threading

    mon, stop = Monitor(horizon=400, block=4), threading.Event()
    keys = [("Run", "loss"), ("Parameter.w", "grad_norm")]

    def train():
        step = 0
        while not stop.is_set() and step < 200_000:
            mon.record(step, keys, np.array([step, -step], np.float64))
            step += 1

    writer = threading.Thread(target=train)
    writer.start()
    try:
        checked = 0
        while checked < 300:
            for head, frames in MonitorSender().replay(mon, 0, chunk=64):
                ids = np.frombuffer(frames[0], "<i4").reshape(-1, 2)
                values = np.frombuffer(frames[1], "<f4").reshape(-1, 2)
                steps = np.asarray(head["steps"], np.float32)
                assert head["rows"] == [2] * len(steps) and (ids == [0, 1]).all()
                assert np.array_equal(values[:, 0], steps) and np.array_equal(values[:, 1], -steps)
                checked += 1
    finally:
        stop.set()
        writer.join()


def test_rows_that_do_not_match_their_frames_are_refused():
    mon = _recorded(4)
    (head, frames), = MonitorSender().replay(mon, 0)
    bad = dict(head, rows=[*head["rows"][:-1], head["rows"][-1] + 1])
    try:
        MonitorReceiver().apply_rows(bad, frames, Monitor())
    except P.ProtocolError as e:
        assert "do not hold" in str(e)
    else:
        raise AssertionError("a row count the frames do not hold was accepted")


def test_monitor_series_complete_after_the_notebook_restarts(tmp_path):
    first = nbdebug.listen(quiet=True)
    port, token = first.port, first.token
    proc = start("torch_train.py", [str(tmp_path), "2000", "0.02"], first.env)
    try:
        until(lambda: first.live_count() or proc.poll() is not None, 60, "the script to connect")
        src = first.source
        until(lambda: src.session.monitor.last_step is not None and src.session.monitor.last_step >= 20, 60,
              "monitor rows")
        before = src.session.monitor
        first.close()  # the kernel goes: everything the notebook had of this process is gone
        at_close = progress(tmp_path)
        until(lambda: progress(tmp_path) > at_close + 20, 30, "training to go on without the notebook")
        second = nbdebug.listen(port, token=token, quiet=True)
        try:
            second.wait_for(1, 40)
            again = second.source
            assert again is not src and again.session.monitor is not before
            until(lambda: (again.session.monitor.last_step or -1) > at_close + 20, 30, "the rows re-sent")
            mon = again.session.monitor
            key = mon.keys[0]
            steps, _v = mon.series(*key)
            assert steps.tolist() == list(range(int(steps[-1]) + 1)), "a gap in the series after the restart"
            assert steps[0] == 0  # from the run's first step, as the process holds it
            old = list(before.keys)
            assert set(old) <= set(mon.keys)
            upto = before.last_step
            got, had = mon.columns(old), before.columns(old)
            n = upto + 1  # the steps the first notebook had: the same values, bitwise
            assert got[0][:n].tolist() == had[0][:n].tolist()
            assert np.array_equal(got[1][:n], had[1][:n], equal_nan=True)
            again.terminate()
            code, _out, err = finish(proc)
            assert code == 0, err[-2000:]
        finally:
            second.close()
    finally:
        if proc.poll() is None:
            proc.kill()
