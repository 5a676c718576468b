"""Remote attach with real processes: a PyTorch script attached to a listener started here (pause, step,
watchpoint hit, the tensor view of a remote value, terminate, reconnect after the listener restarts,
pause timeout), a wrong token, loopback only, ``python -m nbdebug.run``, and group control."""

from __future__ import annotations

import socket
import subprocess
import time

import numpy as np
import pytest
import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)
from remote_procs import finish, progress, start, until

import nbdebug

FC1 = "Module.0.Linear.forward.0"


@pytest.fixture
def listener():
    with nbdebug.listen(quiet=True) as L:
        yield L


def attached(listener, out, steps=2000, delay=0.02, *extra, runner=False, env=None):
    mode = "plain" if runner else "attach"
    proc = start("torch_train.py", [str(out), str(steps), str(delay), mode, *map(str, extra)],
                 {**listener.env, **(env or {})}, runner=runner)
    until(lambda: listener.live_count() or proc.poll() is not None, 60, "the script to connect")
    if not listener.live_count():
        raise AssertionError(proc.communicate()[1][-3000:])
    return proc, listener.source


def test_pause_hit_tensor_step_terminate(listener, tmp_path):
    proc, src = attached(listener, tmp_path, 2000, 0.02, 40)
    assert src.remote_info["pid"] == proc.pid and src.session.framework == "pytorch"
    until(lambda: src.session.steps, 30, "a first step")  # training waited for the welcome: now it runs
    for _ in range(5):  # a pause asked after a step's last node lands at its end (no node): ask again
        src.pause()
        assert str(src.wait(20)) == "paused"
        if src.current_node is not None or src.pause_reason != "paused":
            break
        src.cont()
    assert src.current_node is not None  # a node-level pause, inside a step
    paused_at = progress(tmp_path)
    time.sleep(0.5)
    assert progress(tmp_path) == paused_at, "a paused script does not train"
    (_node, slot), *_ = src.session.node_table(src.current_node).keys  # the partial step travelled
    assert src.stats(src.current_node, slot, src.step_index)["count"] > 0

    src.watch("TO")  # NaN/Inf in any node's output; the script injects a NaN at step 40
    src.cont()
    until(lambda: str(src.state) == "paused" and src.hits, 60, "the watchpoint hit")
    hit = src.hits[0]
    assert hit.step == 40 and hit.condition == "TO" and "watchpoint" in src.pause_reason
    assert src.first_nonfinite(40)[:1] == ("Input.0",)  # the NaN entered with the batch (mirrored stats)

    # the tensor view shows the value the script computed with (it saved its own copy)
    value = src.tensor(FC1, "output.0")
    ref = np.load(tmp_path / "ref_40.npy")
    np.testing.assert_array_equal(value, ref)
    assert np.isnan(value).any()
    with pytest.raises(KeyError):
        src.tensor("no.such.node", "output.0")

    src.unwatch()
    before = src.step_index
    src.cont(3)
    until(lambda: str(src.state) == "paused" and src.step_index == before + 3, 30, "3 steps")
    assert "done" in src.pause_reason
    src.next_node()
    until(lambda: str(src.state) == "paused" and src.current_node is not None, 30, "one node")

    src.terminate()
    code, _out, err = finish(proc)
    assert code == 0, err[-2000:]
    until(lambda: str(src.state) == "terminated", 10, "the terminated state")
    assert progress(tmp_path) < 2000


def test_a_failing_script_reports_its_traceback(listener, tmp_path):
    proc, src = attached(listener, tmp_path, 2000, 0.02, -1, 30)
    code, _out, err = finish(proc)
    assert code == 1 and "boom at step 30" in err  # the script's own traceback, as without nbdebug
    until(lambda: str(src.state) == "failed", 10, "the failed state")
    assert "RuntimeError: boom at step 30" in src.error and not src.connected


def test_reconnect_after_listener_restarts(tmp_path):
    first = nbdebug.listen(quiet=True)
    port, token = first.port, first.token
    proc, src = attached(first, tmp_path, 1500, 0.02)
    src.watch("TO")
    until(lambda: src.session.steps, 30, "a first step")
    first.close()
    at_close = progress(tmp_path)
    until(lambda: progress(tmp_path) > at_close + 20, 30, "training to go on without the notebook")
    second = nbdebug.listen(port, token=token, quiet=True)
    try:
        second.wait_for(1, 40)
        again = second.source
        until(lambda: len(again.graph) and again.session.steps, 20, "the graph and statistics re-sent")
        assert FC1 in again.graph.nodes
        assert [wp.condition for wp in again.watchpoints.watchpoints.values()] == ["TO"]
        assert max(again.session.steps) > at_close
        again.pause()
        assert str(again.wait(20)) == "paused"
        again.terminate()
        code, _out, err = finish(proc)
        assert code == 0, err[-2000:]
        assert "stopped answering" in err  # it noticed, and went on
    finally:
        second.close()
        if proc.poll() is None:
            proc.kill()


def test_paused_without_notebook_continues_after_timeout(tmp_path):
    first = nbdebug.listen(quiet=True)
    proc, src = attached(first, tmp_path, 300, 0.02, env={"NBDEBUG_PAUSE_TIMEOUT": "2"})
    try:
        src.pause()
        assert str(src.wait(20)) == "paused"
        paused_at = progress(tmp_path)
        first.close()
        time.sleep(4)  # lost after 5 s without pongs, then 2 s more: still paused here
        assert progress(tmp_path) == paused_at
        code, _out, err = finish(proc, 90)
        assert code == 0 and progress(tmp_path) == 300
        assert "NBDEBUG_PAUSE_TIMEOUT" in err
    finally:
        if proc.poll() is None:
            proc.kill()


def test_wrong_token_is_refused_and_training_goes_on(listener, tmp_path):
    proc = start("torch_train.py", [str(tmp_path), "150", "0.02"],
                 {"NBDEBUG_CONNECT": listener.address, "NBDEBUG_TOKEN": "not-the-token"})
    until(lambda: listener.refused, 60, "the refusal")
    assert listener.refused[0]["reason"] == "wrong token" and listener.refused[0]["pid"] == proc.pid
    code, out, err = finish(proc)
    assert code == 0 and "done" in out and progress(tmp_path) == 150
    assert "refused" in err and not listener.sources


def _external_ip() -> str:
    ips = [ip for ip in subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
           if "." in ip and not ip.startswith("127.")]
    assert ips, "this machine has no non-loopback IPv4 address to test with"
    return ips[0]


def test_loopback_only_unless_asked():
    ip = _external_ip()
    with nbdebug.listen(quiet=True) as L:
        with pytest.raises(OSError):
            socket.create_connection((ip, L.port), timeout=3).close()
        socket.create_connection(("127.0.0.1", L.port), timeout=3).close()
    with pytest.warns(UserWarning, match="not the loopback"):
        wide = nbdebug.listen(host="0.0.0.0", quiet=True)
    with wide:
        socket.create_connection((ip, wide.port), timeout=3).close()


def test_runner_attaches_an_unedited_script(listener, tmp_path):
    proc, src = attached(listener, tmp_path, 2000, 0.02, runner=True)
    until(lambda: FC1 in src.graph.nodes, 30, "the model's graph")
    src.pause()
    assert str(src.wait(20)) == "paused"
    src.cont(2)
    before = src.step_index
    until(lambda: str(src.state) == "paused" and src.step_index >= before + 1, 30, "2 steps")
    src.terminate()
    code, _out, err = finish(proc)
    assert code == 0, err[-2000:]


def test_runner_needs_a_listener(tmp_path):
    proc = start("torch_train.py", [str(tmp_path), "3", "0", "plain"], {"NBDEBUG_CONNECT": ""}, runner=True)
    code, _out, err = finish(proc)
    assert code == 1 and "NBDEBUG_CONNECT" in err and progress(tmp_path) == 0


def test_group_control_pauses_all_at_one_step(listener, tmp_path):
    procs = []
    for rank in (0, 1):
        out = tmp_path / f"r{rank}"
        out.mkdir()
        procs.append(start("torch_train.py", [str(out), "3000", "0.05"],
                           {**listener.env, "RANK": str(rank), "WORLD_SIZE": "2"}))
    try:
        listener.wait_for(2, 60)
        assert sorted(listener.sources) == [0, 1]
        a, b = listener.sources[0], listener.sources[1]
        until(lambda: a.session.steps and b.session.steps, 30, "first steps")
        with pytest.raises(RuntimeError, match="exactly one process"):
            a.next_node()
        step = listener.pause_all()
        # a process that answered while ending the step before S pauses there first and is resumed up to S
        # (Listener.pause_all, _paused_short): "paused" alone can be that passing stop, the same step cannot
        until(lambda: str(a.state) == str(b.state) == "paused" and a.step_index == b.step_index, 30,
              "both paused at one step")
        assert a.step_index == b.step_index == step + 1  # paused at the end of the same step
        assert a.current_node is None and b.current_node is None  # at a step boundary
        a.cont(2)  # several processes: the command goes to all of them
        until(lambda: str(a.state) == str(b.state) == "paused" and a.step_index == step + 3
              and b.step_index == step + 3, 30, "both 2 steps on")
        listener.terminate_all()
        for p in procs:
            assert finish(p)[0] == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
