"""Shared MindSpore setup for the MindSpore tests.

Importing this module imports MindSpore once per pytest run (Python caches the import) and arms
MindSpore's kernel dump before any GRAPH-mode compile in the process (MindSpore reads the dump config
only at its first graph compile). The small networks and training loops the tests share live here, in
a real file, because GRAPH mode compiles from source.
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import mint, nn, ops

from nbdebug.frameworks.mindspore import graph_live as mindspore_graph_live

DUMP_DIR = mindspore_graph_live.arm()


class LeNet(nn.Cell):
    """LeNet-style: conv, batch norm, ReLU, pool, two dense layers; ``fault`` injects a NaN or an exploding
    gradient.

    ``fault="nan"``: ``log`` of a negative value inside ``construct``; ``fault="explode"``: the logits'
    gradient is multiplied by 1e60 while the forward is unchanged (gradients overflow to inf);
    ``freeze``: parameter names not trained.
    """

    def __init__(self, fault: str | None = None, freeze: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 5, pad_mode="valid")
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(4 * 6 * 6, 16)
        self.fc2 = nn.Dense(16, 10)
        self.nan = fault == "nan"
        self.explode = fault == "explode"
        for p in self.get_parameters():
            if p.name in freeze:
                p.requires_grad = False

    def construct(self, x):
        x = self.pool(self.relu(self.bn(self.conv1(x))))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        if self.nan:
            x = ops.log(x - 10.0)
        x = self.fc2(x)
        if self.explode:  # forward unchanged, gradient times 1e30 twice: overflows to inf
            x = x * 1e30 - ops.stop_gradient(x * 1e30) + ops.stop_gradient(x)
            x = x * 1e30 - ops.stop_gradient(x * 1e30) + ops.stop_gradient(x)
        return x


class ApiNet(nn.Cell):
    """Uses every wrapped API family: a Cell, mindspore.ops, mindspore.mint, mint.nn.functional, Tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(6, 4)

    def construct(self, x):
        h = ops.relu(self.fc(x))
        h = mint.abs(h) + 1.0
        return mint.nn.functional.softmax(h, dim=-1) * h


def batches(n: int = 2, batch: int = 8, seed: int = 0) -> list[tuple[ms.Tensor, ms.Tensor]]:
    rng = np.random.default_rng(seed)
    return [(ms.Tensor(rng.standard_normal((batch, 1, 16, 16)).astype(np.float32)),
             ms.Tensor(rng.integers(0, 10, batch).astype(np.int32))) for _ in range(n)]


def loss_fn() -> nn.Cell:
    return nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")


def _in_mode(mode: int):
    """MindSpore's execution mode set to ``mode`` while the test runs, then put back."""
    old = ms.get_context("mode")
    ms.set_context(mode=mode)
    yield
    ms.set_context(mode=old)


@pytest.fixture
def pynative_mode():
    """PyNative mode for one test (``pytestmark = pytest.mark.usefixtures("pynative_mode")``)."""
    yield from _in_mode(ms.PYNATIVE_MODE)


@pytest.fixture
def graph_mode():
    """GRAPH mode for one test (``pytestmark = pytest.mark.usefixtures("graph_mode")``)."""
    yield from _in_mode(ms.GRAPH_MODE)


def pynative_trainer(net: nn.Cell, lr: float = 0.05):
    """``step(x, y) -> loss`` with ``mindspore.value_and_grad`` and SGD (PyNative)."""
    crit = loss_fn()
    opt = nn.SGD(net.trainable_params(), lr)
    net.set_train(True)

    def forward(x, y):
        return crit(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    return step


def graph_trainer(net: nn.Cell, lr: float = 0.05) -> nn.Cell:
    """A compiled training step: ``TrainOneStepCell(WithLossCell(net, loss), SGD)``."""
    return nn.TrainOneStepCell(nn.WithLossCell(net, loss_fn()), nn.SGD(net.trainable_params(), lr))


def same_weights(src: nn.Cell, dst: nn.Cell) -> None:
    ms.load_param_into_net(dst, {p.name: ms.Parameter(p.asnumpy().copy(), name=p.name)
                                 for p in src.get_parameters()})


def np_stats(a: np.ndarray) -> dict[str, float]:
    x = np.asarray(a, dtype=np.float64)
    return {"max": x.max(), "min": x.min(), "mean": x.mean(), "abs_mean": np.abs(x).mean(),
            "norm": float(np.sqrt((x * x).sum())), "zero_count": int((x == 0).sum())}


def assert_stats(got, arr, rtol=1e-5, atol=1e-6) -> None:
    exp = np_stats(arr)
    for k, v in exp.items():
        assert np.isclose(got[k], v, rtol=rtol, atol=atol), (k, got[k], v)
    assert tuple(got["shape"]) == tuple(np.shape(arr))
