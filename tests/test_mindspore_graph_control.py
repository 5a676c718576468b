"""MindSpore GRAPH mode with control flow (issue 23), in fresh processes, live and offline: every kernel of an
``if`` on data and of a ``while`` loop recorded (the loss graph a loop splits off included), data flow through the
branches' and loop bodies' bound inputs, the NaN's origin in the branch, offline steps of a while loop, and the
whole-step invariant (every slot's statistics are those of the file it names)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import mindspore  # noqa: F401  (the scripts below train with it in fresh processes)
import pytest

import nbdebug
from nbdebug.frameworks.mindspore import graph as kd

pytestmark = pytest.mark.timeout(300)


def _run(tmp_path, body: str) -> str:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    env = dict(os.environ)
    env.pop(kd.ENV, None)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(nbdebug.__file__))
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


HEAD = """\
    import shutil, numpy as np, mindspore as ms, nbdebug
    from mindspore import nn, ops
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(1)

    def stats_of(a):
        x = np.asarray(a, dtype=np.float64)
        fin = x[np.isfinite(x)]
        return {"nan_count": int(np.isnan(x).sum()), "max": float(fin.max()) if fin.size else None,
                "min": float(fin.min()) if fin.size else None, "shape": tuple(x.shape)}

    def same(st, arr, where):
        got = {k: st[k] for k in ("nan_count", "shape")}
        exp = stats_of(arr)
        assert got == {k: exp[k] for k in got}, (where, got, exp)
        if exp["max"] is not None and not st["nan_count"]:
            assert np.isclose(st["max"], exp["max"]) and np.isclose(st["min"], exp["min"]), (where, st, exp)

    def invariant_live(dbg, step):
        n = 0
        for key in dbg.session.table(step).keys:
            if key in dbg.session.table(step).unsupported:
                continue
            try:
                arr = dbg.tensor(key[0], key[1], step)
            except Exception:
                continue
            same(dbg.stats(key[0], key[1], step), arr, (key, step)); n += 1
        return n

    def invariant_offline(off):
        n = 0
        for step in off.session.steps:
            for key in off.session.table(step).keys:
                st = off.stats(key[0], key[1], step)
                if st.get("file"):
                    same(st, np.load(st["file"]), (key, step)); n += 1
        return n
"""

IF_NET = """\
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Dense(4, 8)
            self.out = nn.Dense(8, 3)
            self.log = ops.Log()
        def construct(self, x):
            h = self.hidden(x)
            if x.sum() > 0:
                h = self.log(h - 1.0) * 2.0      # log of negatives: the NaN is born here
            else:
                h = h * 3.0
            return self.out(h)
    net = Net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.SGD(net.trainable_params(), 0.01))
    dbg = nbdebug.Debugger(net)
    rng = np.random.default_rng(0)
    y = ms.Tensor(np.array([0, 1, 2, 0], np.int32))
    shift = ms.Tensor(np.ones((4, 4), np.float32))
"""


def test_if_on_data_every_branch_kernel_and_the_nan_at_the_branch_log_live_and_offline(tmp_path):
    out = _run(tmp_path, IF_NET + """\
    S = "Default/network-WithLossCell/_backbone-Net"
    # step 0: the else branch (finite); step 1: the if branch, whose Log makes the NaN
    for i, sign in enumerate((-8.0, 8.0)):
        x = ms.Tensor((rng.standard_normal((4, 4)) * 0.1 + sign).astype(np.float32))
        train(x, y)
        assert invariant_live(dbg, i) > 10
    ops_ = {n.op_type for n in dbg.graph.nodes.values()}
    assert {"Log", "Sub", "Greater", "SparseSoftmaxCrossEntropyWithLogits", "AssignAdd", "SGD"} <= ops_, ops_
    muls = sorted(n for n in dbg.graph.nodes if n.startswith("Expand/_Muls/Mul-op"))
    assert len(muls) == 4, muls                      # x*2 and x*3, forward and backward
    g = dbg.graph
    log, mm = f"{S}/Log-op0", f"{S}/out-Dense/MatMul-op0"
    # the branch's output flows into its consumer in the main graph; the Sub's into the Log
    assert any(mm in g.successors(p) for p in muls), [list(g.successors(p)) for p in muls]
    assert log in g.successors(f"{S}/Sub-op0")
    assert dbg.stats(mm, "input.0", 1)["nan_count"] > 0       # the bound input: the branch's value
    assert dbg.stats(log, "input.0", 1)["nan_count"] == 0
    assert dbg.first_nonfinite(None) == (log, "output.0", 1), dbg.first_nonfinite(None)
    assert dbg.first_nonfinite(0) is None
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    dbg.close()
    off = nbdebug.load("copy")
    assert sorted(off.session.steps) == [0, 1], sorted(off.session.steps)
    assert off.first_nonfinite(None) == (log, "output.0", 1), off.first_nonfinite(None)
    assert set(muls) <= set(off.graph.nodes)
    assert invariant_offline(off) > 40
    print("OK")
    """)
    assert "OK" in out


WHILE_NET = """\
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(4, 4)
            self.out = nn.Dense(4, 3)
        def construct(self, x):
            i = ms.Tensor(0, ms.int32)
            while i < 3:
                x = self.fc(x)
                i = i + 1
            return self.out(x)
    net = Net()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    train = nn.TrainOneStepCell(nn.WithLossCell(net, loss), nn.SGD(net.trainable_params(), 0.01))
    dbg = nbdebug.Debugger(net)
    rng = np.random.default_rng(0)
    y = ms.Tensor(np.array([0, 1], np.int32))
"""


def test_while_loop_records_the_loss_and_every_repetition_and_loads_as_two_steps(tmp_path):
    out = _run(tmp_path, WHILE_NET + """\
    for i in range(2):
        loss_value = float(train(ms.Tensor(rng.standard_normal((2, 4)).astype(np.float32)), y).asnumpy())
        assert invariant_live(dbg, i) > 10
    L = "Default/network-WithLossCell/_loss_fn-SoftmaxCrossEntropyWithLogits"
    loss_node = f"{L}/SparseSoftmaxCrossEntropyWithLogits-op0"
    for name in (loss_node, "Default/optimizer-SGD/AssignAdd-op0",
                 f"Gradients/{L}/Grad_SparseSoftmaxCrossEntropyWithLogits/SparseSoftmaxCrossEntropyWithLogits-op0"):
        assert name in dbg.graph.nodes, (name, sorted(dbg.graph.nodes))
    assert np.isclose(dbg.stats(loss_node, "output.0", 1)["max"], loss_value, rtol=1e-5)
    mm = "Default/network-WithLossCell/_backbone-Net/fc-Dense/MatMul-op0"
    reps = [mm, mm + ".1", mm + ".2"]
    assert all(r in dbg.graph.nodes for r in reps) and mm + ".3" not in dbg.graph.nodes
    # each repetition reads the previous one's output (the body's bound input)
    body_out = [dbg.tensor(r.replace("MatMul", "BiasAdd"), "output.0", 1) for r in reps]
    for prev, nxt in zip(body_out, reps[1:]):
        np.testing.assert_array_equal(dbg.tensor(nxt, "input.0", 1), prev)
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    dbg.close()
    off = nbdebug.load("copy")
    assert sorted(off.session.steps) == [0, 1], sorted(off.session.steps)   # two steps, not six runs
    assert loss_node in off.graph.nodes and all(r in off.graph.nodes for r in reps)
    assert np.isclose(off.stats(loss_node, "output.0", 1)["max"], loss_value, rtol=1e-5)
    assert invariant_offline(off) > 40
    print("OK")
    """)
    assert "OK" in out


def test_group_runs_by_iteration():
    runs = [(0, 0, 2, "cond"), (1, 0, 6, "body"), (2, 0, 2, "cond"), (3, 0, 6, "body"), (4, 0, 0, "loss"),
            (5, 1, 2, "cond"), (6, 1, 6, "body"), (7, 1, 0, "loss")]
    groups = kd.group_runs(runs, {0: True, 2: False, 6: True})
    assert [[r[3] for r in g] for g in groups] == [["cond", "body", "cond", "body", "loss"], ["cond", "body", "loss"]]
