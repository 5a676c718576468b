"""Replay of a MindSpore GRAPH-mode step (CPU): the compiled step (``TrainOneStepCell``) run again from the kept
Parameters with the kernel dump armed; bitwise with the live step's kernel statistics and loss, the live run
unchanged; ``on_hit="replay"`` on a NaN born in a division; sampled capture (``graph_every`` > 1) and
``save_repro`` refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import warnings

import numpy as np
import pytest
from ms_fixtures import (
    LeNet,
    batches,
    graph_mode,  # noqa: F401 - the fixture every test here uses
    graph_trainer,
    ms,
    nn,
)

import nbdebug
from nbdebug.frameworks.mindspore.replay_state import unread_outputs
from nbdebug.replay import ReplayMismatch

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("graph_mode")]
SCOPE = "Default/network-WithLossCell/_backbone-LeNet"


def _train(replay_at: int | None):
    ms.set_seed(20)
    net = LeNet()
    dbg = nbdebug.Debugger(net)
    step = dbg.step_fn(graph_trainer(net))
    replayed, losses = None, []
    for i, (x, y) in enumerate(batches(4, seed=5)):
        losses.append(step(x, y).asnumpy().tobytes())
        if i == replay_at:
            live = {p.name: p.asnumpy().tobytes() for p in net.get_parameters()}
            with warnings.catch_warnings():
                warnings.simplefilter("error", ReplayMismatch)
                replayed = dbg.replay(i)
            with pytest.raises(ValueError, match="PyNative mode only"):
                dbg.save_repro(os.path.join(tempfile.mkdtemp(), "repro"), i, model_factory="m:f")
            assert {p.name: p.asnumpy().tobytes() for p in net.get_parameters()} == live
    weights = {p.name: p.asnumpy().tobytes() for p in net.get_parameters()}
    tables = [dbg.session.table(s) for s in range(4)]
    loose = unread_outputs(dbg.session)
    dbg.close()
    return replayed, weights, tables, losses, loose


def test_graph_replay_is_bitwise_and_leaves_the_live_run_alone():
    r, weights, tables, losses, loose = _train(replay_at=2)
    assert r.bitwise and r.compared > 150, [str(m) for m in r.mismatches[:3]]
    assert r.loss.tobytes() == r.live_loss.tobytes() == losses[2]
    matmul = f"{SCOPE}/fc1-Dense/MatMul-op0"
    assert matmul in r.graph.nodes and r.tensor(matmul, "output.0").shape == (8, 16)  # read after the replay
    _, weights0, tables0, losses0, _ = _train(replay_at=None)
    assert weights == weights0 and losses == losses0
    # MindSpore's CPU BatchNorm outputs 1-4 (batch statistics, reserve spaces; the kernel does not fill them
    # in training) and BatchNormGrad's inputs reading them differ between two identical live runs, replay or
    # not, while every weight and loss is the same: every other statistic of every step is the same bits
    bn = f"{SCOPE}/bn-BatchNorm2d/BatchNorm-op0"
    assert {(bn, "output.1"), (bn, "output.2")} <= loose
    assert any(k[0].endswith("BatchNormGrad-op0") for k in loose)  # the inputs they feed
    for a, b in zip(tables, tables0, strict=True):  # the live capture's steps, with and without the replay
        assert a.keys == b.keys
        rows = [i for i, k in enumerate(a.keys) if k not in loose]
        differ = [a.keys[i] for i in rows if not np.array_equal(a.values[i].view(np.int64), b.values[i].view(np.int64))]
        assert not differ, differ[:4]
    assert len(rows) > 150


class _Div(nn.Cell):
    """Dense layers around a division by each row's sum: a row that sums to 0 makes inf and NaN."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = nn.Dense(8, 1)

    def construct(self, x):
        return self.fc2(self.fc1(x / x.sum(axis=1, keepdims=True)))


def test_graph_nan_on_hit_replay_names_the_dividing_kernel():
    ms.set_seed(11)
    net = _Div()
    dbg = nbdebug.Debugger(net, on_hit="replay")
    dbg.watch("TO")
    step = dbg.step_fn(nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.05)))
    rng = np.random.default_rng(0)
    y = ms.Tensor(np.ones((3, 1), np.float32))
    step(ms.Tensor(rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32)), y)
    bad = rng.uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    bad[1] = [1.0, -1.0, 2.0, -2.0]
    step(ms.Tensor(bad), y)
    r = dbg.replayed
    assert r is not None and r.step == 1 and r.bitwise, dbg.replay_error
    node, slot, step_ = r.first_nonfinite()
    assert (slot, step_) == ("output.0", 1) and r.graph.nodes[node].op_type in ("RealDiv", "Div"), node
    ins = [r.tensor(node, s) for s in ("input.0", "input.1")]  # its inputs, readable: the batch and its sums
    assert np.isfinite(ins[0]).all() and (ins[1] == 0).any()
    dbg.close()


def test_graph_every_above_one_is_refused_with_the_reason():
    script = textwrap.dedent("""
        import numpy as np
        import mindspore as ms
        from mindspore import nn
        import nbdebug
        from nbdebug.replay import ReplayRefused

        ms.set_context(mode=ms.GRAPH_MODE)
        net = nn.SequentialCell(nn.Dense(4, 8), nn.ReLU(), nn.Dense(8, 1))
        dbg = nbdebug.Debugger(net, graph_every=2)
        step = dbg.step_fn(nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()),
                                               nn.SGD(net.trainable_params(), 0.05)))
        x, y = ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.ones((2, 1), np.float32))
        step(x, y); step(x, y)
        try:
            dbg.replay(1)
        except ReplayRefused as e:
            print("REFUSED", e)
        dbg.close()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert "REFUSED step 1 cannot be replayed: Debugger(graph_every=2)" in done.stdout, done.stdout + done.stderr
    assert "replay needs graph_every=1 in GRAPH mode" in done.stdout


def test_graph_model_train_step_replays_bitwise():
    import mindspore.dataset as msds
    from mindspore.train import Model

    ms.set_seed(21)
    net = _Div()
    model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9))
    dbg = nbdebug.Debugger(net)
    assert dbg.step_fn(model) is model
    rng = np.random.default_rng(1)
    data = msds.NumpySlicesDataset({"x": rng.uniform(0.5, 1.5, (9, 4)).astype(np.float32),
                                    "y": rng.normal(size=(9, 1)).astype(np.float32)}, shuffle=False).batch(3)
    model.train(1, data, dataset_sink_mode=False)
    assert dbg.replay_steps == [2] and dbg.step_index == 3
    live = {p.name: p.asnumpy().tobytes() for p in net.get_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayMismatch)
        r = dbg.replay(2)
    assert r.bitwise and r.compared > 30 and r.loss.tobytes() == r.live_loss.tobytes()
    assert any(n.endswith("ApplyMomentum-op0") for n in r.graph.nodes)  # the update ran in the replayed graph
    assert {p.name: p.asnumpy().tobytes() for p in net.get_parameters()} == live
    dbg.close()


def test_live_graph_capture_refuses_the_outputs_cpu_batchnorm_leaves_unwritten():
    """The value shown is the value used: MindSpore's CPU BatchNorm never writes its outputs 1–4 (their dump
    files hold leftover memory — a NaN of an earlier kernel could make TO fire there), so the live capture
    gives them, and the BatchNormGrad inputs that read them, no statistics and no value, with the reason;
    ``y`` (output 0) keeps its value."""
    ms.set_seed(20)
    net = LeNet()
    dbg = nbdebug.Debugger(net)
    step = graph_trainer(net)
    for x, y in batches(2, seed=5):
        step(x, y)
    table = dbg.session.table(1)
    bn = f"{SCOPE}/bn-BatchNorm2d/BatchNorm-op0"
    refused = {table.keys[i]: why for i, why in table.unsupported.items()}
    for slot in ("output.1", "output.2", "output.3", "output.4"):
        if (bn, slot) in table.index:
            assert "does not write this output" in refused[(bn, slot)], slot
            with pytest.raises(nbdebug.NotRetainedError, match="does not write this output"):
                dbg.session.tensor(bn, slot, step=1)
    assert any(k[0].endswith("BatchNormGrad-op0") and "does not write" in why for k, why in refused.items())
    assert (bn, "output.0") not in refused and np.isfinite(dbg.session.tensor(bn, "output.0", step=1)).all()
    dbg.close()


def test_a_long_graph_run_leaves_no_iteration_directories_behind():
    """MindSpore makes a ``{net}/{graph}/{iteration}`` directory per graph run and never removes one: the live
    capture removes each once read and emptied, so what a step lists stays one step's size (30 steps here
    leave at most the newest three iterations of each graph: files go a step after they are read)."""
    from nbdebug.frameworks.mindspore.kernel_load import graph_dirs

    ms.set_seed(20)
    net = LeNet()
    dbg = nbdebug.Debugger(net)
    step = graph_trainer(net)
    for x, y in batches(30, seed=5):
        step(x, y)
    adapter = dbg._adapter if hasattr(dbg, "_adapter") else dbg.adapter
    rank = adapter._rank_dirs()[0]
    left = {g: sorted(int(i) for i in os.listdir(d) if i.isdigit()) for g, d in graph_dirs(rank)}
    assert left and all(len(its) <= 3 for its in left.values()), left
    assert dbg.step_index == 30
    dbg.close()
