"""MindSpore GRAPH mode, sampled capture (``Debugger(net, graph_every=k)``), in fresh processes: MindSpore's
kernel dump runs for every k-th training step only; the other steps are counted, have no statistics, say why
when read, are not in the step list, and watchpoints see the captured steps only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import mindspore as ms
import pytest

import nbdebug
from nbdebug.frameworks.mindspore import graph as kd

pytestmark = pytest.mark.timeout(300)

SCRIPT = """\
    import numpy as np
    import mindspore as ms
    from mindspore import nn
    import nbdebug
    from nbdebug import NotRetainedError
    from nbdebug.ui.source import SourceView

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(3)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
    dbg = nbdebug.Debugger(net, graph_every=3)
    dbg.watch("TL", abs_mean_gt=0.0)  # holds for every activation: fires on every step it can see
    train = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.05))
    rng = np.random.default_rng(0)
    x = ms.Tensor(rng.standard_normal((16, 8)).astype(np.float32))
    y = ms.Tensor(rng.standard_normal((16, 1)).astype(np.float32))
    losses = [float(train(x, y).asnumpy()) for _ in range(8)]
    s = dbg.session
    assert dbg.step_index == 8, dbg.step_index
    assert sorted(s.steps) == [0, 3, 6], sorted(s.steps)
    assert sorted(s.skipped) == [1, 2, 4, 5, 7], sorted(s.skipped)
    assert SourceView(dbg).steps == [0, 3, 6]  # the panel's step selector
    loss_nodes = [n for n, node in dbg.graph.nodes.items() if "_loss_fn-MSELoss" in n and node.section == "forward"
                  and node.shapes.get("output.0") == ()]
    assert loss_nodes, [n for n in dbg.graph.nodes if "MSELoss" in n]
    for step in (0, 3, 6):  # the captured steps' statistics are those steps' values
        assert any(abs(dbg.stats(n, "output.0", step)["mean"] - losses[step]) < 1e-6 for n in loss_nodes), step
    node = loss_nodes[0]
    for step in (1, 7):
        try:
            dbg.stats(node, "output.0", step)
        except NotRetainedError as e:
            assert f"step {step} was not captured" in str(e) and "graph_every=3" in str(e), str(e)
        else:
            raise AssertionError(f"step {step} has statistics")
    try:
        dbg.tensor(node, "output.0", 7)
    except NotRetainedError as e:
        assert "graph_every=3" in str(e), str(e)
    else:
        raise AssertionError("a skipped step has a value")
    assert dbg.tensor(node, "output.0", 6).shape == ()
    assert dbg.stats(node, "output.0") == dbg.stats(node, "output.0", 6)  # "current": the latest captured
    assert SourceView(dbg).step == 6
    assert {h.step for h in dbg.hits if h.hits} == {0, 3, 6}
    dbg.close()
    try:
        nbdebug.Debugger(net)  # the process's dump samples every 3rd run: another value cannot apply
    except RuntimeError as e:
        assert "graph_every=3" in str(e) and "graph_every=1" in str(e), str(e)
    else:
        raise AssertionError("a Debugger with another graph_every attached")
    dbg = nbdebug.Debugger(net, graph_every=3)
    for _ in range(4):
        train(x, y)  # the graph's runs 8..11: MindSpore's run 9 is captured
    assert sorted(dbg.session.steps) == [1], sorted(dbg.session.steps)
    dbg.close()
    print("OK")
"""


def test_graph_every_captures_every_kth_step_in_a_fresh_process(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ)
    env.pop(kd.ENV, None)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(nbdebug.__file__))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]


def test_graph_every_is_checked():
    with pytest.raises(ValueError, match="graph_every must be an int >= 1"):
        kd.check_every(0)
    assert kd.sampled_iterations(4, 3) == "0|4|8"
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        with pytest.raises(ValueError, match="in PyNative mode every step is captured"):
            nbdebug.Debugger(ms.nn.Dense(2, 1), graph_every=2)
    finally:
        ms.set_context(mode=mode)
