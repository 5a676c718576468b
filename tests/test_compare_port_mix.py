"""A faithful PyTorch → MindSpore port of a LeNet-like network, both captured live at mix and compared:
MindSpore's bias-less ``Conv2D`` + ``BiasAdd`` pair with PyTorch's biased ``conv2d`` (and ``MatMul`` +
``BiasAdd`` with ``linear``); ops pair within their module, so a ``relu`` spelled ``x.relu()`` on one side and
``F.relu(x)`` on the other pairs with its counterpart, not with another block's. A perturbed layer is the first
divergence."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mindspore import mint, ops
from mindspore import nn as msnn

import nbdebug

rng = np.random.default_rng(0)
WEIGHTS = {"conv.weight": rng.standard_normal((4, 1, 3, 3)).astype(np.float32) * 0.3,
           "conv.bias": rng.standard_normal(4).astype(np.float32) * 0.1,
           "fc1.weight": rng.standard_normal((16, 36)).astype(np.float32) * 0.2,
           "fc1.bias": rng.standard_normal(16).astype(np.float32) * 0.1,
           "fc2.weight": rng.standard_normal((5, 16)).astype(np.float32) * 0.2,
           "fc2.bias": rng.standard_normal(5).astype(np.float32) * 0.1}
X = rng.standard_normal((2, 1, 8, 8)).astype(np.float32)
Y = rng.standard_normal((2, 5)).astype(np.float32)


class TorchNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.pool = torch.nn.MaxPool2d(2)
        self.fc1 = torch.nn.Linear(36, 16)
        self.fc2 = torch.nn.Linear(16, 5)

    def forward(self, x):
        x = self.pool(F.relu(self.conv(x)))  # the conv block's relu: Functional.relu.0
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))  # the fc block's: Torch.relu.0


class PortNet(msnn.Cell):
    def __init__(self, perturbed: bool = False) -> None:
        super().__init__()
        self.conv = msnn.Conv2d(1, 4, 3, pad_mode="valid", has_bias=True)
        self.pool = msnn.AvgPool2d(2, 2) if perturbed else msnn.MaxPool2d(2, 2)
        self.fc1 = msnn.Dense(36, 16)
        self.fc2 = msnn.Dense(16, 5)

    def construct(self, x):
        x = self.pool(ops.relu(self.conv(x)))  # Functional.relu.0, whose PyTorch spelling is tried as Torch.relu first
        return self.fc2(mint.nn.functional.relu(self.fc1(x.reshape(x.shape[0], -1))))  # MintFunctional.relu.0


def _torch_run(level: str) -> nbdebug.Debugger:
    model = TorchNet()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(WEIGHTS[name]))
    dbg = nbdebug.Debugger(model, level=level)
    F.mse_loss(model(torch.from_numpy(X)), torch.from_numpy(Y)).backward()
    dbg.step()
    return dbg


def _mindspore_run(level: str, perturbed: bool = False) -> nbdebug.Debugger:
    net = PortNet(perturbed)
    for name, p in net.parameters_and_names():
        p.set_data(ms.Tensor(WEIGHTS[name]))
    dbg = nbdebug.Debugger(net, level=level)
    loss = msnn.MSELoss()
    ms.value_and_grad(lambda x, y: loss(net(x), y), None, net.trainable_params())(ms.Tensor(X), ms.Tensor(Y))
    dbg.step()
    return dbg


@pytest.fixture(scope="module")
def golden():
    dbg = _torch_run("mix")
    yield dbg
    dbg.close()


def _op(dbg: nbdebug.Debugger, api: str, scope: str, section: str = "forward") -> str:
    names = [n.name for n in dbg.graph.in_order() if n.kind == "op" and n.section == section
             and n.scope == scope and f".{api}." in n.name]
    assert len(names) == 1, names
    return names[0]


def test_a_faithful_port_has_no_divergence_at_mix(golden):
    target = _mindspore_run("mix")
    try:
        res = nbdebug.compare(target, golden)
        assert res.errors == [] and res.warnings == []
        assert res.first_divergence is None
        # the conv: MindSpore's Conv2D output is taken after its BiasAdd, the bias is conv2d's input.2
        conv = _op(target, "conv2d", "conv")
        out = res.row(conv, "output.0")
        assert out.golden == "Functional.conv2d.0.forward" and out.status == "pass" and out.cosine > 0.99999
        assert any("BiasAdd" in m for m in out.messages)
        bias = res.row(conv, "input.2")
        assert bias.golden_slot == "input.2" and bias.status == "pass" and bias.max_abs_err == 0
        assert not any(".bias_add." in n for n in res.unmatched_target if n.endswith(".forward"))
        # Dense: MatMul + BiasAdd pair with linear
        assert res.row(_op(target, "matmul", "fc1"), "output.0").golden == "Functional.linear.0.forward"
        # each relu pairs with the relu of its own block, whatever its spelling (by name alone the conv block's
        # Functional.relu.0 would pair with Torch.relu.0, the fc block's)
        conv_relu, fc_relu = "Functional.relu.0.forward", "MintFunctional.relu.0.forward"
        assert target.graph.nodes[conv_relu].order < target.graph.nodes[fc_relu].order
        assert res.row(conv_relu, "output.0").golden == "Functional.relu.0.forward"
        assert res.row(fc_relu, "output.0").golden == "Torch.relu.0.forward"
        assert res.row(conv_relu, "output.0").matched_by == "scoped"
    finally:
        target.close()


def test_a_perturbed_layer_is_the_first_divergence_at_mix(golden):
    target = _mindspore_run("mix", perturbed=True)
    try:
        res = nbdebug.compare(target, golden)
        fd = res.first_divergence
        assert fd is not None
        assert fd.node == "Cell.pool.AvgPool2d.forward.0" and fd.golden == "Module.pool.MaxPool2d.forward.0"
        assert fd.layer == "pool"
        conv = _op(target, "conv2d", "conv")
        assert res.row(conv, "output.0").status == "pass"  # everything before the pool agrees
    finally:
        target.close()


def test_l0_of_the_same_port_agrees():
    t, g = _mindspore_run("L0"), _torch_run("L0")
    try:
        res = nbdebug.compare(t, g)
        assert res.first_divergence is None and res.errors == []
        assert res.row("Cell.conv.Conv2d.forward.0", "output.0").golden == "Module.conv.Conv2d.forward.0"
    finally:
        t.close()
        g.close()
