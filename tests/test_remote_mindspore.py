"""Remote attach of a MindSpore PyNative script (a real process): pause, steps, the tensor view of a remote
value equal to the one the script computed, a watchpoint, terminate; and ``python -m nbdebug.run``."""

from __future__ import annotations

import mindspore  # noqa: F401 - the script needs MindSpore (tests/torch_only.py reads the imports)
import numpy as np
import zmq  # noqa: F401
from remote_procs import finish, progress, start, until

import nbdebug

FC1 = "Cell.fc1.Dense.forward.0"


def _attached(listener, out, runner=False):
    proc = start("ms_train.py", [str(out), "3000", "0.02", "plain" if runner else "attach"], listener.env,
                 runner=runner)
    until(lambda: listener.live_count() or proc.poll() is not None, 120, "the script to connect")
    if not listener.live_count():
        raise AssertionError(proc.communicate()[1][-3000:])
    return proc, listener.source


def test_mindspore_pynative_script_attached(tmp_path):
    with nbdebug.listen(quiet=True) as listener:
        proc, src = _attached(listener, tmp_path)
        try:
            assert src.session.framework == "mindspore" and src.remote_info["pid"] == proc.pid
            until(lambda: FC1 in src.graph.nodes, 60, "the Cell graph")
            src.pause()
            assert str(src.wait(30)) == "paused"
            src.watch("GL", max_gt=1e9)  # gradients: never this large here
            before = src.step_index
            src.cont(2)
            until(lambda: str(src.state) == "paused" and src.step_index == before + 2, 60, "2 steps")
            step = src.step_index - 1
            value = src.tensor(FC1, "output.0", step)
            np.testing.assert_array_equal(value, np.load(tmp_path / f"ref_{step}.npy"))
            assert src.stats(FC1, "output.0", step)["shape"] == (16, 8)
            assert not src.hits
            paused_at = progress(tmp_path)
            src.terminate()
            code, _out, err = finish(proc, 120)
            assert code == 0, err[-2000:]
            assert progress(tmp_path) <= paused_at + 1
        finally:
            if proc.poll() is None:
                proc.kill()


def test_mindspore_runner_finds_the_cell(tmp_path):
    with nbdebug.listen(quiet=True) as listener:
        proc, src = _attached(listener, tmp_path, runner=True)
        try:
            until(lambda: FC1 in src.graph.nodes, 60, "the Cell graph")
            src.terminate()
            assert finish(proc, 120)[0] == 0
        finally:
            if proc.poll() is None:
                proc.kill()


def test_mindspore_graph_mode_script_attached(tmp_path):
    """GRAPH mode: a fresh process, so the Debugger exists before the first compile; pauses come at graph-run
    (step) boundaries, and the kernels' statistics arrive per step."""
    with nbdebug.listen(quiet=True) as listener:
        proc = start("ms_train.py", [str(tmp_path), "3000", "0.05", "attach", "graph"], listener.env)
        try:
            until(lambda: listener.live_count() or proc.poll() is not None, 120, "the script to connect")
            assert listener.live_count(), proc.communicate()[1][-3000:]
            src = listener.source
            until(lambda: src.session.steps, 120, "a first graph run")
            src.pause()
            assert str(src.wait(60)) == "paused"
            before = src.step_index
            src.cont(2)
            until(lambda: str(src.state) == "paused" and src.step_index == before + 2, 60, "2 graph runs")
            table = src.session.table(src.step_index - 1)
            assert len(table) and len(src.graph) >= 5
            node, slot = table.keys[0]
            assert src.stats(node, slot, src.step_index - 1)["count"] > 0
            src.terminate()
            assert finish(proc, 120)[0] == 0
        finally:
            if proc.poll() is None:
                proc.kill()
