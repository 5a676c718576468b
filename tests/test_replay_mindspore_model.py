"""Replay of ``mindspore.train.Model.train`` steps (PyNative, CPU): ``dbg.step_fn(model)`` adds the callback
that keeps each step's pre-step state and batch; the replay of a kept step runs the Model's train network
(forward, backward, optimizer update) bitwise; ``on_hit="replay"`` replays a NaN batch's step at op level;
``save_repro`` of a Model step reproduces it in a fresh process; sink mode is refused with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import mindspore.dataset as msds
import numpy as np
import pytest
from ms_fixtures import ms, nn, pynative_mode  # noqa: F401 - the fixture

import nbdebug
from nbdebug.replay import ReplayMismatch

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("pynative_mode")]

FACTORY = textwrap.dedent('''
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model


    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(6, 8)
            self.bn = nn.BatchNorm1d(8)
            self.fc2 = nn.Dense(8, 3)

        def construct(self, x):
            return self.fc2(ms.ops.tanh(self.bn(self.fc1(x / x.sum(axis=1, keepdims=True)))))


    def build():
        net = Net()
        crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        return net, Model(net, crit, nn.Adam(net.trainable_params(), 1e-2))


    def make():
        net, model = build()
        return {"model": net, "step": model}
''')


@pytest.fixture
def netmod(tmp_path, monkeypatch):
    (tmp_path / "msmodel_net.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import msmodel_net

    yield msmodel_net, tmp_path
    sys.modules.pop("msmodel_net", None)


def _dataset(nan_at: int | None = None, steps: int = 4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * steps, 6)).astype(np.float32)
    if nan_at is not None:
        x[4 * nan_at + 1] = [1.0, -1.0, 2.0, -2.0, 0.5, -0.5]  # sums to 0: the division makes inf and NaN
    y = rng.integers(0, 3, 4 * steps).astype(np.int32)
    return msds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)


def _weights(net):
    return {n: p.asnumpy().tobytes() for n, p in net.parameters_and_names()}


def test_model_train_step_replays_bitwise_and_leaves_the_run_alone(netmod):
    mod, _ = netmod
    ms.set_seed(0)
    net, model = mod.build()
    dbg = nbdebug.Debugger(net, level="L0", replay_window=2)
    assert dbg.step_fn(model) is model
    model.train(1, _dataset(), dataset_sink_mode=False)
    assert dbg.replay_steps == [2, 3] and dbg.step_index == 4
    live = _weights(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayMismatch)
        r = dbg.replay(2)
    assert r.bitwise and r.compared > 40
    assert r.loss.tobytes() == r.live_loss.tobytes()
    assert "Optimizer.Adam.step.0" in r.graph.nodes  # the train network's optimizer update, replayed
    matmul = next(n for n in r.graph.nodes if n.startswith("Primitive.matmul.MatMul."))
    assert r.tensor(matmul, "output.0").shape == (4, 8)
    assert _weights(net) == live
    tables = [dbg.session.table(s) for s in range(4)]
    dbg.close()
    # the same training without step_fn: the same weights and statistics (keeping changed nothing)
    ms.set_seed(0)
    net0, model0 = mod.build()
    dbg0 = nbdebug.Debugger(net0, level="L0")
    model0.train(1, _dataset(), callbacks=[dbg0.callback()], dataset_sink_mode=False)
    assert _weights(net0) == live
    for a, s in zip(tables, range(4), strict=True):
        b = dbg0.session.table(s)
        assert a.keys == b.keys and np.array_equal(a.values.view(np.int64), b.values.view(np.int64))
    dbg0.close()


def test_model_train_nan_batch_on_hit_replay_and_save_repro(netmod):
    mod, tmp = netmod
    ms.set_seed(0)
    net, model = mod.build()
    dbg = nbdebug.Debugger(net, level="L0", on_hit="replay")
    dbg.watch("TO")
    dbg.step_fn(model)
    model.train(1, _dataset(nan_at=2, steps=3), callbacks=[dbg.callback()], dataset_sink_mode=True)  # CPU: not sunk
    r = dbg.replayed
    assert r is not None and r.step == 2 and r.bitwise, dbg.replay_error
    node, slot, step = r.first_nonfinite()
    assert step == 2 and not node.startswith(("Input", "Cell")) and slot == "output.0", node  # an op
    assert r.graph.nodes[node].kind != "module"
    ins = [r.tensor(node, s) for s in ("input.0", "input.1")]  # its inputs, readable: the batch and its sums
    assert np.isfinite(ins[0]).all() and (ins[1] == 0).any()
    folder = dbg.save_repro(tmp / "repro", 2, model_factory="msmodel_net:make")
    env = dict(os.environ, PYTHONPATH=str(tmp))
    done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=500)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loss nan bitwise identical | non-finite: True" in done.stdout
    dbg.close()


def test_sink_mode_is_refused_with_the_reason(netmod):
    from mindspore.train.callback import RunContext
    from mindspore.train.callback._callback import InternalCallbackParam

    from nbdebug.frameworks.mindspore.replay_state import KeepCallback

    mod, _ = netmod
    net, model = mod.build()
    dbg = nbdebug.Debugger(net, level="L0")
    dbg.step_fn(model)
    cb = InternalCallbackParam()
    cb.dataset_sink_mode = True  # what Model.train hands its callbacks on a device that sinks the dataset
    with pytest.raises(ValueError, match="reads its batches from the device's data queue"):
        KeepCallback(dbg._replay, dbg.backend.replay_state()).on_train_begin(RunContext(cb))
    with pytest.raises(RuntimeError, match="wrapped already"):
        dbg.step_fn(model)
    dbg.close()
