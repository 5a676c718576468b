"""msProbe-format dumps from MindSpore (PyNative): ``PrecisionDebugger`` and ``MsprobeStep``.

(Real msProbe cannot write a MindSpore dump on this CPU build — its statistics call ``mint.norm``, which has
no CPU kernel in MindSpore 2.10 — so these tests check the format against msProbe's documented MindSpore
layout and the values against numpy.)
"""

from __future__ import annotations

import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from ms_fixtures import pynative_mode  # noqa: F401 - the fixture

import nbdebug
from nbdebug.dump.precision import MsprobeStep


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(8, 2)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _rank_dir(root, step):
    subs = os.listdir(os.path.join(root, f"step{step}"))
    assert len(subs) == 1, subs
    return os.path.join(root, f"step{step}", subs[0])


@pytest.mark.usefixtures("pynative_mode")
def test_mindspore_tensor_dump(tmp_path):
    ms.set_seed(0)
    net = Net()
    loss_fn = nn.MSELoss()
    grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, net.trainable_params())
    pd = nbdebug.PrecisionDebugger(dump_path=str(tmp_path), task="tensor", level="mix")
    xs = [np.random.RandomState(i).randn(3, 4).astype(np.float32) for i in range(2)]
    for x in xs:
        pd.start(net)
        grad_fn(ms.Tensor(x), ms.Tensor(np.zeros((3, 2), np.float32)))
        pd.stop()
        pd.step()
    pd.close()
    assert sorted(os.listdir(tmp_path)) == ["step0", "step1"]
    rank_dir = _rank_dir(str(tmp_path), 1)
    assert os.path.basename(rank_dir) == f"proc{os.getpid()}"
    with open(os.path.join(rank_dir, "dump.json")) as f:
        dump = json.load(f)
    assert dump["framework"] == "mindspore" and dump["task"] == "tensor" and dump["level"] == "mix"
    data = dump["data"]
    assert "Cell.fc1.Dense.forward.0" in data and "Cell.fc2.Dense.backward.0" in data
    assert "Cell.fc1.Dense.parameters_grad.0" in data
    assert not [k for k in data if k.startswith(("Parameter.", "Input.", "Optimizer."))]
    fc1 = data["Cell.fc1.Dense.forward.0"]
    assert list(fc1) == ["input_args", "input_kwargs", "output", "parameters"]
    x = fc1["input_args"][0]
    assert list(x) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "data_name"]  # no requires_grad
    assert x["type"] == "mindspore.Tensor" and x["dtype"] == "Float32" and x["shape"] == [3, 4]
    assert x["data_name"] == "Cell.fc1.Dense.forward.0.input.0.npy"
    arr = np.load(os.path.join(dump["dump_data_dir"], x["data_name"]))
    assert np.array_equal(arr, xs[1])
    assert x["Max"] == float(xs[1].max()) and x["Min"] == float(xs[1].min())
    assert x["Mean"] == pytest.approx(float(xs[1].mean()), rel=1e-6)
    assert x["Norm"] == pytest.approx(float(np.linalg.norm(xs[1])), rel=1e-6)
    files = os.listdir(dump["dump_data_dir"])
    assert files and all(f.endswith(".npy") for f in files)
    assert "Cell.fc1.Dense.forward.0.parameters.weight.npy" in files
    with open(os.path.join(rank_dir, "construct.json")) as f:
        construct = json.load(f)
    assert construct["Cell.fc1.Dense.forward.0"] is None
    assert any(v == "Cell.fc1.Dense.forward.0" for v in construct.values())  # the ops inside fc1


@pytest.mark.usefixtures("pynative_mode")
def test_msprobe_step_callback_with_model_train(tmp_path):
    ms.set_seed(0)
    net = Net()
    pd = nbdebug.PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="L0")
    pd.start(net)  # L0: the model is given once, before training
    rng = np.random.RandomState(0)
    data = [(rng.randn(4).astype(np.float32), rng.randn(2).astype(np.float32)) for _ in range(6)]
    ds = ms.dataset.GeneratorDataset(data, ["x", "y"], shuffle=False).batch(2)
    model = ms.train.Model(net, loss_fn=nn.MSELoss(), optimizer=nn.SGD(net.trainable_params(), 0.01))
    model.train(1, ds, callbacks=[MsprobeStep(pd)], dataset_sink_mode=False)
    pd.close()
    assert sorted(os.listdir(tmp_path)) == ["step0", "step1", "step2"]
    with open(os.path.join(_rank_dir(str(tmp_path), 2), "dump.json")) as f:
        keys = list(json.load(f)["data"])
    assert keys[:3] == ["Cell.fc1.Dense.forward.0", "Cell.act.ReLU.forward.0", "Cell.fc2.Dense.forward.0"]
    assert "Cell.fc1.Dense.backward.0" in keys
