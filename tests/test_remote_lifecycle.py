"""A remote training process when the notebook is absent, goes away or is flooded, with real processes
(``tests/remote_scripts/torch_train.py``):

* nothing listens: said once, and training goes on; a host that does not resolve or an unknown level fails
  at start (``python -m nbdebug.run`` exits with the reason before the script runs), not silently or from
  inside the first model call;
* the notebook goes away while a watchpoint hits every step: the pause timeout fires once, then hits no
  longer pause training (each would wait the whole timeout again) until a notebook connects;
* the first word when the notebook leaves is that it stopped answering, not that it is "not keeping up";
* a flood of unauthenticated hellos keeps a bounded ``listener.refused`` (and counts them all);
* inside a step, ``tensor(node, slot)`` ("current") of a node that has not run yet in it raises instead of
  handing back the previous step's value.
"""

from __future__ import annotations

import pytest
import torch
import zmq
from ranks_checks import free_port
from remote_procs import finish, progress, start, until

import nbdebug
from nbdebug.remote import protocol as P
from nbdebug.remote.hub import REFUSED_KEPT


def _warnings(err: str) -> list[str]:
    return [line.split("nbdebug: ", 1)[1] for line in err.splitlines() if "RuntimeWarning: nbdebug: " in line]


def test_nothing_listening_is_said_once_and_training_goes_on(tmp_path):
    proc = start("torch_train.py", [str(tmp_path), "40", "0.01"],
                 {"NBDEBUG_CONNECT": f"127.0.0.1:{free_port()}", "NBDEBUG_TOKEN": "t"})
    code, out, err = finish(proc, 90)
    assert code == 0 and "done" in out and progress(tmp_path) == 40, err[-2000:]
    said = [w for w in _warnings(err) if "no notebook answered" in w]
    assert len(said) == 1 and "training goes on" in said[0], err[-2000:]


@pytest.mark.parametrize("env,reason", [
    ({"NBDEBUG_CONNECT": "no-such-host.invalid:5555"}, "does not resolve"),
    ({"NBDEBUG_CONNECT": "127.0.0.1:5555", "NBDEBUG_LEVEL": "L7"}, "unknown level 'L7'"),
])
def test_bad_address_or_level_fails_at_start(tmp_path, env, reason):
    proc = start("torch_train.py", [str(tmp_path), "5", "0", "plain"], {"NBDEBUG_TOKEN": "t", **env}, runner=True)
    code, _out, err = finish(proc, 60)
    assert code != 0 and progress(tmp_path) == 0
    assert "nbdebug.run: nbdebug.attach: " in err and reason in err, err[-2000:]
    assert "Traceback" not in err  # the runner's own message before the script ran, not a model call's error


def test_pause_timeout_fires_once_then_hits_no_longer_pause(tmp_path):
    listener = nbdebug.listen(quiet=True)
    proc = start("torch_train.py", [str(tmp_path), "100", "0.01", "attach", "50"],
                 {**listener.env, "NBDEBUG_PAUSE_TIMEOUT": "1"})
    try:
        listener.wait_for(1, 60)
        src = listener.source
        src.watch("TO")  # the NaN of step 50 reaches the weights: every later step hits
        until(lambda: str(src.state) == "paused" and src.hits, 60, "the first hit")
        listener.close()  # the notebook goes away with the watchpoint set
        # lost after 5 s, paused 1 s more, then the 49 steps left run on (before: each waited 1 s again)
        code, _out, err = finish(proc, 30)
        assert code == 0 and progress(tmp_path) == 100, err[-2000:]
        said = [w for w in _warnings(err) if "NBDEBUG_PAUSE_TIMEOUT" in w]
        assert len(said) == 1 and "no longer pause" in said[0], err[-2000:]
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()


def test_the_notebook_leaving_is_said_as_such(tmp_path):
    listener = nbdebug.listen(quiet=True)
    proc = start("torch_train.py", [str(tmp_path), "450", "0.02"], listener.env)
    try:
        listener.wait_for(1, 60)
        until(lambda: progress(tmp_path) > 5, 30, "training")
        listener.close()
        code, _out, err = finish(proc, 90)
        assert code == 0, err[-2000:]
        said = _warnings(err)
        assert said and "stopped answering" in said[0], err[-2000:]
        assert not any("not keeping up" in w for w in said), said
    finally:
        if proc.poll() is None:
            proc.kill()


def test_refused_hellos_are_bounded_under_a_flood():
    n = REFUSED_KEPT + 150
    with nbdebug.listen(quiet=True) as listener:
        ctx = zmq.Context()
        socks = []
        try:
            for i in range(n):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(f"tcp://{listener.address}")
                sock.send_multipart(P.encode({"type": "hello", "token": "wrong", "pid": i, "host": "h"}))
                socks.append(sock)
            until(lambda: listener.refused_count == n, 30, "every refusal")
            assert len(listener.refused) == REFUSED_KEPT  # the latest ones
            assert listener.refused[-1]["reason"] == "wrong token" and not listener.sources
        finally:
            for sock in socks:
                sock.close(0)
            ctx.term()


def test_current_value_of_a_node_not_run_yet_in_the_step_raises():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    dbg = nbdebug.Debugger(model)
    fc2 = "Module.2.Linear.forward.0"

    def train():
        for _ in range(3):
            model(torch.randn(2, 3)).sum().backward()
            dbg.step()

    try:
        dbg.run(train, steps=1)
        assert str(dbg.wait(30)) == "paused" and dbg.step_index == 1
        dbg.run_to("Module.0.Linear.forward.0")  # inside step 1, before fc2 runs
        assert str(dbg.wait(30)) == "paused" and dbg.current_node == "Module.0.Linear.forward.0"
        assert dbg.tensor("Module.0.Linear.forward.0", "output.0").shape == (2, 4)  # ran: this step's value
        with pytest.raises(nbdebug.NotRetainedError, match=r"not computed yet in step 1 \(in progress\)"):
            dbg.tensor(fc2, "output.0")
        assert dbg.tensor(fc2, "output.0", 0).shape == (2, 1)  # step 0's value, asked for by number
        dbg.terminate()
        dbg.wait(30)
    finally:
        dbg.close()
