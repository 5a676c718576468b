"""A ``torchrun`` job (2 ranks, gloo, CPU, ``tests/remote_scripts/ddp_nan.py``) whose notebook goes away and
comes back — the listener closed and a new one opened on the same port with the same token, as when the
kernel restarts mid-run — is shown and controlled as it is, not as a fresh listener imagines it:

* from its hello until its state arrives a rank shows ``connecting`` and is not counted live (before: a
  rank that had just reconnected showed ``idle, step 0``, and ``live_count()`` counted it);
* when ``live_count()`` reports the ranks, each shows its real state and step;
* a group command issued while a rank is still connecting (``job.pause()`` at its hello) is not lost: the
  rank gets it when its state arrives (the listener's ``notice`` says so) and both ranks pause at one step
  boundary; ``job.terminate()`` then ends both.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading

import torch  # noqa: F401 - the job runs torch.distributed in its processes (tests/torch_only.py reads this)
import zmq  # noqa: F401 - the listener needs ZeroMQ
from ranks_checks import free_port
from remote_procs import ROOT, SCRIPTS, until

import nbdebug
from nbdebug.remote import absent


@contextlib.contextmanager
def ddp_job(env, tmp_path, gate, steps):
    """``torchrun --nproc-per-node 2 -m nbdebug.run ddp_nan.py`` (no NaN: the faulty rank's step is past the
    end); yields ``(process, log path)``; the whole process group is killed on the way out."""
    full = dict(os.environ, **env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = ["timeout", "200", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "nbdebug.run",
           str(SCRIPTS / "ddp_nan.py"), str(gate), "1", str(steps + 1), str(steps)]
    log = tmp_path / "torchrun.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=full, cwd=str(ROOT), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _states(listener):
    return {k: (str(s.state), s.step_index, s.current_node) for k, s in listener.sources.items()}


def _at_each_hello(listener, then=None):
    """What every source of ``listener`` showed at each hello (the ``connected`` event, on the listener's thread
    before the new process's sync can arrive): ``[{key: (state, live)}]``; ``then(n)`` after the n-th hello."""
    seen = []

    def on_state(what):
        if what == "connected":
            live = listener.live()
            seen.append({k: (str(s.state), s in live) for k, s in listener.sources.items()})
            if then is not None:
                then(len(seen))

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

            def pause_at(n):  # at the second hello that rank is connecting: pause the job right then
                if n == 2:
                    thread = threading.Thread(target=lambda: asked.append(second.job.pause()))
                    thread.start()

            hellos = _at_each_hello(second, pause_at)
            until(lambda: second.live_count() == 2, 60, lambda: f"both ranks back; {_states(second)}")
            at_live = _states(second)
            assert len(hellos) == 2, hellos
            for shown in hellos:  # a rank whose state has not arrived is "connecting", and not live
                assert all(live if state != "connecting" else not live for state, live in shown.values()), hellos
                assert all(state in ("connecting", "running") for state, _live in shown.values()), hellos
            assert list(at_live) == [0, 1] and all(state in ("running", "paused") and step >= left_at
                                                   for state, step, _n in at_live.values()), (at_live, left_at)
            # the pause given while rank 1 was connecting reached it when its state came: one boundary for both
            until(lambda: len({v for v in _states(second).values()}) == 1
                  and all(v[0] == "paused" and v[2] is None for v in _states(second).values()), 30,
                  lambda: f"both ranks paused at one step boundary; {_states(second)}")
            assert "connecting or away" in second.notice and "when back" in second.notice, second.notice
            second.job.terminate()  # both paused at one boundary: both end cleanly
            until(lambda: [s for s, _i, _n in _states(second).values()] == ["terminated", "terminated"], 30,
                  lambda: f"both ranks terminated; {_states(second)}")
            until(lambda: proc.poll() is not None, 30, "the job's end")
            assert proc.returncode == 0, log.read_text()[-3000:]
    finally:
        for listener in listeners:
            listener.close()
