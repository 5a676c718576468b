"""A remote training process in JupyterLab: the listener's job panel (process table, the panel's header with
the process's PID and host), driven by the lab extension's commands (step, terminate) — a real script in
its own process, a real JupyterLab and Chromium."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import zmq  # noqa: F401 - the listener needs ZeroMQ (tests/torch_only.py reads the imports)

if TYPE_CHECKING:
    from browser import LabPage

SCRIPT = Path(__file__).resolve().parent / "remote_scripts" / "torch_train.py"
NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
JOB = f"{NB} .nbdebug-job-panel"


pytestmark = pytest.mark.usefixtures("built_extension")  # tests/browser.py


def facts(lab: LabPage) -> dict[str, Any]:
    return lab.page.evaluate("""(sel) => {
        const p = document.querySelector(sel);
        if (!p) return null;
        const t = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : null; };
        const st = p.querySelector('.nbdebug-state [data-state]');
        return {table: t('.nbdebug-process-table'), pid: t('.nbdebug-pid'), host: t('.nbdebug-remote'),
                state: st ? st.dataset.state : null, step: t('.nbdebug-step'), reason: t('.nbdebug-pause-reason')};
    }""", JOB)


def wait_for(lab: LabPage, check: Any, what: str, timeout: float = 60.0) -> dict[str, Any]:
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        f = facts(lab)
        if f and check(f):
            return f
        time.sleep(0.2)
    raise AssertionError(f"{what} not seen; panel: {facts(lab)}; console errors: {lab.errors[-5:]}")


def test_remote_job_panel_and_lab_commands(lab_page: LabPage, tmp_path: Path) -> None:
    lab = lab_page
    out = tmp_path / "run"
    out.mkdir()
    lab.server.write_notebook("remote.ipynb", [
        f"""\
import nbdebug, os, subprocess, sys
listener = nbdebug.listen(quiet=True)
proc = subprocess.Popen([sys.executable, {str(SCRIPT)!r}, {str(out)!r}, "3000", "0.02"],
                        env={{**os.environ, **listener.env}})
listener.wait_for(1, 120)
src = listener.source
src.pause(); src.wait(60)
listener""",
        "print('exit', proc.wait(60))",
    ])
    lab.open_notebook("remote.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0, timeout=180)
    f = wait_for(lab, lambda f: f["state"] == "paused" and f["pid"], "the paused remote panel")
    pid = f["pid"]
    assert pid in f["table"] and socket.gethostname() in f["host"]
    step = int(f["step"])  # paused inside this step (or, when PAUSE came at its end, after it)

    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:step')")
    wait_for(lab, lambda f: f["state"] == "paused" and any(f"step {k} done" in f["reason"] for k in (step, step + 1)),
             "the step finished by the lab command")
    # the remote process's graph is drawn in the panel (its nodes came over the wire as graph deltas)
    lab.page.wait_for_function("""(sel) => { const e = document.querySelector(sel + ' .nbdebug-ui-graph');
        return e && e.nbdebugGraph && e.nbdebugGraph.stats().visibleItems > 0; }""", arg=JOB, timeout=60_000)
    lab.assert_not_blank(lab.screenshot("remote-job-panel", JOB))

    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:terminate')")
    wait_for(lab, lambda f: f["state"] == "terminated", "the terminated remote process")
    lab.run_cell(1)
    lab.wait_for_output("exit 0")
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]


STATUS = "#jp-main-statusbar .nbdebug-StatusItem"


def test_status_item_sums_up_a_job_of_several_processes(lab_page: LabPage, tmp_path: Path) -> None:
    """Two processes connected to one listener: the status item counts both (not only the last to connect),
    its tooltip lists each, and the lab's pause and terminate commands act on both."""
    lab = lab_page
    outs = [tmp_path / f"run{i}" for i in range(2)]
    for o in outs:
        o.mkdir()
    lab.server.write_notebook("job.ipynb", [
        f"""\
import nbdebug, os, subprocess, sys
listener = nbdebug.listen(quiet=True)
procs = [subprocess.Popen([sys.executable, {str(SCRIPT)!r}, out, "3000", "0.02"],
                          env={{**os.environ, **listener.env}}) for out in {[str(o) for o in outs]!r}]
listener.wait_for(2, 120)
listener""",
        "print('exits', [p.wait(60) for p in procs])",
    ])
    lab.open_notebook("job.ipynb")
    lab.run_cell(0, timeout=180)

    def item() -> dict[str, Any]:
        return lab.page.evaluate("""(sel) => { const e = document.querySelector(sel);
            return e ? {text: e.textContent.trim(), state: e.dataset.state, title: e.title} : null; }""", STATUS)

    def until(check: Any, what: str, timeout: float = 60.0) -> dict[str, Any]:
        import time

        end = time.monotonic() + timeout
        while time.monotonic() < end:
            s = item()
            if s and check(s):
                return s
            time.sleep(0.2)
        raise AssertionError(f"{what} not seen; status item: {item()}; console errors: {lab.errors[-5:]}")

    s = until(lambda s: "2 processes" in s["text"] and "2 running" in s["text"], "two running processes")
    assert s["state"] == "running"
    assert len([line for line in s["title"].splitlines() if ": running, step" in line]) == 2, s["title"]
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:pause')")
    s = until(lambda s: "2 paused" in s["text"], "both processes paused by the lab command")
    assert s["state"] == "paused"
    lab.screenshot("labextension-job-status", STATUS)
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:terminate')")
    lab.run_cell(1)
    lab.wait_for_output("exits [0, 0]")
