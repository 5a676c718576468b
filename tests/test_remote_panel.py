"""The panel over a remote process: ``Panel(remote_source)`` builds and its header names the process; the
job panel (the listener's) lists the processes; the JupyterLab commands act on the remote process."""

from __future__ import annotations

import socket

import pytest
import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)
from remote_procs import finish, start, until

import nbdebug
from nbdebug.lab import command, status
from nbdebug.ui.job_panel import JobPanel
from nbdebug.ui.panel import Panel


def test_panel_header_controls_and_lab_commands_on_a_remote_process(tmp_path):
    with nbdebug.listen(quiet=True) as listener:
        proc = start("torch_train.py", [str(tmp_path), "3000", "0.02"], listener.env)
        try:
            until(lambda: listener.live_count() or proc.poll() is not None, 60, "the script to connect")
            src = listener.source
            until(lambda: src.session.steps, 30, "a first step")
            job = JobPanel(listener.job, loop=None)
            assert str(proc.pid) in job.processes.value and socket.gethostname() in job.processes.value
            panel = job.panel
            assert isinstance(panel, Panel) and panel.source.obj is src
            assert panel.header.pid.value == str(proc.pid)
            assert socket.gethostname() in panel.header.remote.value
            assert panel.header.device.value == "cpu"

            panel.controls.pause.click()  # the panel's own PAUSE button, over the wire
            assert str(src.wait(20)) == "paused"
            panel.flush()
            assert "paused" in panel.header.state.value and not panel.controls.cont.disabled

            assert status()["state"] == "paused"  # the status item reads the remote process
            # keep(): the glob is resolved in the process, against its graph; errors come back as raised
            assert src.keep("Module.0.*") == {"Module.0.Linear.forward.0", "Module.0.Linear.backward.0",
                                              "Module.0.Linear.parameters_grad.0"}
            assert src.keep("Module.0.*", on=False) == frozenset() == src.session.kept
            with pytest.raises(ValueError, match="matches none"):
                src.keep("NoSuch.*")
            before = src.step_index
            command("step")  # the extension's "step": one more training step
            until(lambda: str(src.state) == "paused" and src.step_index == before + 1, 30, "one step")
            panel.flush()
            assert panel.header.step.value == str(before)  # the step whose data is shown

            panel.controls.terminate.click()
            assert finish(proc)[0] == 0
            until(lambda: str(src.state) == "terminated", 10, "terminated")
            panel.flush()
            assert "terminated" in panel.header.state.value and panel.controls.pause.disabled
            job.close()
        finally:
            if proc.poll() is None:
                proc.kill()


def test_listen_magic_prints_the_command_and_keeps_one_listener(capsys):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "nbdebug")
    listener = ip.run_line_magic("nbdebug", "listen")
    try:
        out = capsys.readouterr().out
        assert f"NBDEBUG_CONNECT={listener.address}" in out and listener.token in out
        assert "python -m nbdebug.run train.py" in out and listener.host == "127.0.0.1"
        assert ip.run_line_magic("nbdebug", "listen") is listener  # the open one again
        with pytest.raises(UsageError, match="cannot read"):
            ip.run_line_magic("nbdebug", "listen --bogus")
        with pytest.raises(UsageError, match="cannot bind"):
            ip.run_line_magic("nbdebug", f"listen {listener.port}")  # that port is taken
        assert isinstance(listener.panel(), JobPanel)
    finally:
        listener.close()
