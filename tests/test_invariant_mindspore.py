"""Whole-model invariant for MindSpore PyNative: the value shown is the value used.

Models built here with random weights — Dense + BatchNorm in train mode, a small Transformer-style block
(attention with softmax, LayerNorm, residuals), one trained with ``TrainOneStepCell`` and the others with
``value_and_grad`` — 3 steps at L0, L1 and mix. For every (node, slot) of every step, ``dbg.tensor()``
returns a value whose statistics are ``dbg.stats()``, or raises :class:`NotRetainedError` with a reason;
losses are bitwise those of an undebugged run. Then the three MindSpore value bugs of issue #11: a
Parameter input (and a view / cast of one) is the weight used, not the updated one (7); BatchNorm's
moving statistics describe the value the op read (8); a value computed inside a Cell without recorded
ops comes from that Cell, not from an ``Input`` node (9).
"""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn, ops
from ms_fixtures import pynative_mode  # noqa: F401 - the fixture
from test_invariant_models import check_step  # every (node, slot): stats == stats(tensor) or refused

import nbdebug

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pynative_mode")]
LEVELS = ("L0", "L1", "mix")
STEPS = 3


def _param(rng, *shape, name):
    return ms.Parameter(ms.Tensor(rng.standard_normal(shape).astype(np.float32) * 0.3), name=name)


# -- models ---------------------------------------------------------------------------------------
class DenseBN(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.relu = nn.ReLU()
        self.head = nn.Dense(8, 3)

    def construct(self, x):
        return self.head(self.relu(self.bn(self.fc(x))))


class Attention(nn.Cell):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv = nn.Dense(d, 3 * d)
        self.proj = nn.Dense(d, d)
        self.scale = 1.0 / np.sqrt(d)

    def construct(self, x):
        q, k, v = ops.split(self.qkv(x), x.shape[-1], axis=-1)
        att = ops.softmax(ops.matmul(q, k.swapaxes(-1, -2)) * self.scale, axis=-1)
        return self.proj(ops.matmul(att, v))


class Block(nn.Cell):
    """Post-LN Transformer block: attention and a GELU MLP, each with a residual and a LayerNorm."""

    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.att = Attention(d)
        self.ln1 = nn.LayerNorm((d,))
        self.fc1 = nn.Dense(d, 2 * d)
        self.act = nn.GELU()
        self.fc2 = nn.Dense(2 * d, d)
        self.ln2 = nn.LayerNorm((d,))
        self.head = nn.Dense(d, 3)

    def construct(self, x):
        h = self.ln1(x + self.att(x))
        h = self.ln2(h + self.fc2(self.act(self.fc1(h))))
        return self.head(h.mean(1))


class ViewsOfWeights(nn.Cell):
    """Uses a Parameter through a view (``swapaxes``) and a no-op cast (``astype``)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = _param(np.random.default_rng(3), 4, 6, name="w")
        self.fc = nn.Dense(4, 3)

    def construct(self, x):
        h = ops.matmul(x, self.w.swapaxes(0, 1))
        h = h + ops.matmul(x, self.w.astype(ms.float32).swapaxes(0, 1))
        return self.fc(h)


def build(kind: str):
    """(net, batches): batches of (x, y) for a mean-squared-error loss."""
    ms.set_seed(0)
    rng = np.random.default_rng(1)
    if kind == "dense_bn":
        net = DenseBN()
        xs = [rng.standard_normal((4, 6)) for _ in range(STEPS)]
    elif kind in ("block", "block_train_one_step"):
        net = Block()
        xs = [rng.standard_normal((2, 5, 8)) for _ in range(STEPS)]
    elif kind == "views":
        net = ViewsOfWeights()
        xs = [rng.standard_normal((4, 6)) for _ in range(STEPS)]
    else:
        raise ValueError(kind)
    ys = [rng.standard_normal((len(x), 3)) for x in xs]
    pairs = zip(xs, ys, strict=True)
    return net, [(ms.Tensor(x.astype(np.float32)), ms.Tensor(y.astype(np.float32))) for x, y in pairs]


MODELS = ("dense_bn", "block", "block_train_one_step", "views")


def train(kind: str, net, batches, after_step=None) -> list[np.ndarray]:
    net.set_train(True)
    opt = nn.Adam(net.trainable_params(), learning_rate=1e-2)
    crit = nn.MSELoss()
    if kind == "block_train_one_step":
        step = nn.TrainOneStepCell(nn.WithLossCell(net, crit), opt)
    else:
        grad_fn = ms.value_and_grad(lambda x, y: crit(net(x), y), None, opt.parameters)

        def step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss

    losses = []
    for i, (x, y) in enumerate(batches):
        losses.append(step(x, y).asnumpy().copy())
        if after_step is not None:
            after_step(i)
    return losses


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind", MODELS)
def test_stats_describe_the_retained_value(kind, level):
    plain, batches = build(kind)
    want = train(kind, plain, batches)
    net, batches = build(kind)
    counts = []
    with nbdebug.Debugger(net, level=level) as dbg:
        def after(i):
            counts.append(check_step(dbg, i))
            if i:
                check_step(dbg, i - 1)  # the previous step's values after one more step

        got = train(kind, net, batches, after)
        assert dbg.step_index == STEPS
    for a, b in zip(got, want, strict=True):
        assert np.array_equal(a, b), (got, want)
    assert all(r > 10 for r, _ in counts), counts
    for (n, a), (_, b) in zip(net.parameters_and_names(), plain.parameters_and_names(), strict=True):
        assert np.array_equal(a.asnumpy(), b.asnumpy()), n


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_parameter_inputs_and_their_views_are_the_weights_used(level):
    """Item 7: the optimizer updates Parameters in place and MindSpore has no version counter — the
    retained value of a Parameter input, and of a view or no-op cast of one, is the weight the op used."""
    net, batches = build("views")
    used = []
    with nbdebug.Debugger(net, level=level) as dbg:
        def after(i):
            w = used[i]
            np.testing.assert_array_equal(dbg.tensor("Parameter.w", "output.0", step=i), w)
            matmul = [n for n in dbg.graph if n.name.startswith("Primitive.matmul.MatMul.")
                      and n.name.endswith(".forward")]
            assert matmul  # the Dense's own MatMul Primitive: its weight input is a Parameter
            assert dbg.tensor(matmul[0].name, "input.1", step=i).shape == (3, 4)
            views = [f"Tensor.swapaxes.{k}.forward" for k in (0, 1)]
            for name in views:
                np.testing.assert_array_equal(dbg.tensor(name, "output.0", step=i), w.T)
            np.testing.assert_array_equal(dbg.tensor("Tensor.astype.0.forward", "output.0", step=i), w)
            check_step(dbg, i)
            if i + 1 < STEPS:
                used.append(net.w.asnumpy().copy())

        used.append(net.w.asnumpy().copy())
        train("views", net, batches, after)
    assert not np.array_equal(used[0], net.w.asnumpy())  # the weight did change


def test_dense_weight_input_is_the_weight_used_at_L1():
    """Item 7 as reported: ``Primitive.matmul.MatMul.0.forward input.1`` after the optimizer step."""
    net, batches = build("dense_bn")
    w0 = net.fc.weight.asnumpy().copy()
    with nbdebug.Debugger(net, level="L1") as dbg:
        train("dense_bn", net, batches[:1])
        got = dbg.tensor("Primitive.matmul.MatMul.0.forward", "input.1", step=0)
        st = dbg.stats("Primitive.matmul.MatMul.0.forward", "input.1", step=0)
    np.testing.assert_array_equal(got, w0)
    assert st["max"] == pytest.approx(float(w0.max()), rel=1e-6)
    assert not np.array_equal(w0, net.fc.weight.asnumpy())


@pytest.mark.parametrize("level", LEVELS)
def test_batchnorm_moving_statistics_describe_the_value_used(level):
    """Item 8: BatchNorm updates ``moving_mean`` / ``moving_variance`` in place in the forward; their
    statistics (and values) are those the op read, before the update."""
    net, batches = build("dense_bn")
    before = [(net.bn.moving_mean.asnumpy().copy(), net.bn.moving_variance.asnumpy().copy())]
    names = {"L0": ("Cell.bn.BatchNorm1d.forward.0", "parameters.moving_mean", "parameters.moving_variance"),
             "L1": ("Primitive.bn_train.BatchNorm.0.forward", "input.3", "input.4"),
             "mix": ("Primitive.bn_train.BatchNorm.0.forward", "input.3", "input.4")}[level]
    with nbdebug.Debugger(net, level=level) as dbg:
        def after(i):
            mean, var = before[i]
            for node, slot, want in (("Parameter.bn.moving_mean", "output.0", mean),
                                     ("Parameter.bn.moving_variance", "output.0", var),
                                     (names[0], names[1], mean), (names[0], names[2], var)):
                st = dbg.stats(node, slot, step=i)
                assert st["max"] == pytest.approx(float(want.max()), abs=1e-7), (node, slot, i)
                assert st["min"] == pytest.approx(float(want.min()), abs=1e-7), (node, slot, i)
                np.testing.assert_array_equal(dbg.tensor(node, slot, step=i), want)
            before.append((net.bn.moving_mean.asnumpy().copy(), net.bn.moving_variance.asnumpy().copy()))

        train("dense_bn", net, batches, after)
    assert float(np.abs(before[0][0]).max()) == 0.0 and float(np.abs(before[1][0]).max()) > 0.0


class Inner(nn.Cell):
    """Computes a NaN between its two layers with an op no L0 hook sees."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 4)
        self.fc2 = nn.Dense(4, 2)

    def construct(self, x):
        h = ops.log(self.fc1(x) - 100.0)  # log of a negative number: NaN
        return self.fc2(h)


class Outer(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def construct(self, x):
        return self.inner(x)


def test_value_computed_inside_a_cell_comes_from_that_cell_at_L0():
    """Item 9: at L0 the NaN made by ``ops.log`` inside ``Inner.construct`` is first seen as ``fc2``'s
    input: its producer is the ``inner`` Cell call, not an ``Input`` node."""
    ms.set_seed(0)
    net = Outer()
    x = ms.Tensor(np.ones((2, 4), np.float32))
    with nbdebug.Debugger(net, level="L0") as dbg:
        net(x)
        dbg.step()
        assert dbg.first_nonfinite(0) == ("Cell.inner.Inner.forward.0", "output.0", 0)
        assert [n.name for n in dbg.graph if n.name.startswith("Input.")] == ["Input.0"]
        edges = dbg.graph.edges
        assert ("Cell.inner.Inner.forward.0", "Cell.inner.fc2.Dense.forward.0") in edges
        assert ("Input.0", "Cell.inner.fc1.Dense.forward.0") in edges
