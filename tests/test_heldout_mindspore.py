"""Held-out trials on MindSpore PyNative: networks no other test uses, trained as a user would.

A Transformer encoder (``nn.Embedding`` + ``nn.TransformerEncoderLayer``, whose ``nn.MultiheadAttention``
runs inside) trained with ``value_and_grad`` + ``nn.AdamWeightDecay``; an LSTM language model trained with
``nn.TrainOneStepCell`` + ``nn.Adam``; a residual conv net (``nn.BatchNorm2d``, residual adds) with
``value_and_grad`` + ``nn.Momentum``; a Cell whose ``construct`` has Python control flow (a ``for`` over a
``CellList``, an ``if`` on the step's data, a Cell called twice) with ``TrainOneStepCell``. Checked over the
whole model at L0, L1 and mix: the losses are bitwise those of an undebugged run, every statistic is that of
the retained value (or the value is refused with a reason); at ``monitor`` the weight norms and update norms
are those computed here; a NaN made at step 1 is found by ``first_nonfinite`` at the op that made it and
fires ``TO`` there first; the replay of a later step of the BatchNorm net is bitwise (the CPU BatchNorm's
unwritten outputs, which hold their memory's previous contents, are not compared).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mindspore import ops
from ms_fixtures import ms, nn, pynative_mode  # noqa: F401 - the fixture
from test_invariant_models import check_step  # every (node, slot): stats == stats(tensor) or refused

import nbdebug
from nbdebug.replay import ReplayMismatch

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pynative_mode")]
STEPS = 3
VOCAB = 11


class Encoder(nn.Cell):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.layer = nn.TransformerEncoderLayer(d, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.head = nn.Dense(d, VOCAB)
        self.fault = False

    def construct(self, x):
        h = self.layer(self.emb(x))
        if self.fault:
            h = ops.sqrt(h - 1e4)
        return self.head(h).reshape(-1, VOCAB)


class LSTMLM(nn.Cell):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.rnn = nn.LSTM(d, d, batch_first=True)
        self.head = nn.Dense(d, VOCAB)
        self.fault = False

    def construct(self, x):
        h, _ = self.rnn(self.emb(x))
        if self.fault:
            h = ops.sqrt(h - 1e4)
        return self.head(h).reshape(-1, VOCAB)


class ResBlock(nn.Cell):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, pad_mode="same")
        self.bn1 = nn.BatchNorm2d(c)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(c, c, 3, pad_mode="same")
        self.bn2 = nn.BatchNorm2d(c)

    def construct(self, x):
        return self.relu(x + self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))))


class ResNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 3, pad_mode="same")
        self.blocks = nn.SequentialCell([ResBlock(4), ResBlock(4)])
        self.flat = nn.Flatten()
        self.head = nn.Dense(4 * 6 * 6, 5)
        self.fault = False

    def construct(self, x):
        h = self.blocks(self.stem(x))
        if self.fault:
            h = ops.sqrt(h - 1e4)
        return self.head(self.flat(h))


class Flow(nn.Cell):
    """Python control flow: a ``for`` over a CellList, ``gate`` called twice, an ``if`` on the data."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.CellList([nn.Dense(6, 6) for _ in range(3)])
        self.gate = nn.Dense(6, 6)
        self.act = nn.Tanh()
        self.head = nn.Dense(6, 5)
        self.fault = False

    def construct(self, x):
        h = x
        for i, layer in enumerate(self.layers):
            h = self.act(layer(h))
            if i % 2 == 0:
                h = h + self.gate(h)
        if float(h.abs().mean()) > 10.0:
            h = h / 10.0
        if self.fault:
            h = ops.sqrt(h - 1e4)
        return self.head(h)


def build(kind: str):
    """(net, batches of (x, labels))."""
    ms.set_seed(0)
    rng = np.random.default_rng(1)
    if kind in ("encoder", "lstm"):
        net = Encoder() if kind == "encoder" else LSTMLM()
        xs = [rng.integers(0, VOCAB, (2, 5)).astype(np.int32) for _ in range(STEPS)]
        ys = [rng.integers(0, VOCAB, (10,)).astype(np.int32) for _ in range(STEPS)]
    elif kind == "resnet":
        net = ResNet()
        xs = [rng.standard_normal((3, 1, 6, 6)).astype(np.float32) for _ in range(STEPS)]
        ys = [rng.integers(0, 5, (3,)).astype(np.int32) for _ in range(STEPS)]
    else:
        net = Flow()
        xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(STEPS)]
        ys = [rng.integers(0, 5, (4,)).astype(np.int32) for _ in range(STEPS)]
    net.set_train(True)
    return net, [(ms.Tensor(x), ms.Tensor(y)) for x, y in zip(xs, ys, strict=True)]


def make_step(kind: str, net):
    params = net.trainable_params()
    opt = {"encoder": lambda: nn.AdamWeightDecay(params, 1e-2, weight_decay=0.01),
           "resnet": lambda: nn.Momentum(params, 0.05, 0.9)}.get(kind, lambda: nn.Adam(params, 1e-2))()
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if kind in ("lstm", "flow"):
        step = nn.TrainOneStepCell(nn.WithLossCell(net, crit), opt)
        step.set_train(True)
        return step
    grad_fn = ms.value_and_grad(lambda x, y: crit(net(x), y), None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    return step


KINDS = ("encoder", "lstm", "resnet", "flow")


def _plain_losses(kind: str) -> list[np.ndarray]:
    net, batches = build(kind)
    step = make_step(kind, net)
    return [step(x, y).asnumpy().copy() for x, y in batches]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_statistic_is_the_retained_value(kind, level):
    want = _plain_losses(kind)
    net, batches = build(kind)
    with nbdebug.Debugger(net, level=level) as dbg:
        step = make_step(kind, net)
        got, counts = [], []
        for i, (x, y) in enumerate(batches):
            got.append(step(x, y).asnumpy().copy())
            counts.append(check_step(dbg, i))
            if i:
                check_step(dbg, i - 1)  # the previous step's values after one more step
        assert dbg.step_index == STEPS
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]
    assert all(r > 20 for r, _ in counts), counts


@pytest.mark.parametrize("kind", KINDS)
def test_monitor_weight_and_update_norms_are_those_computed_here(kind):
    want = _plain_losses(kind)
    net, batches = build(kind)
    with nbdebug.Debugger(net, level="monitor") as dbg:
        step = make_step(kind, net)
        got, expected = [], []
        for x, y in batches:
            before = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
            got.append(step(x, y).asnumpy().copy())
            after = {p.name: p.asnumpy().astype(np.float64) for p in net.trainable_params()}
            expected.append({k: (np.linalg.norm(v), np.linalg.norm(after[k] - v)) for k, v in before.items()})
        m = dbg.session.monitor
        for i, row in enumerate(expected):
            for name, (weight, update) in row.items():
                assert m.value(i, f"Parameter.{name}", "weight_norm") == pytest.approx(weight, rel=1e-5)
                assert m.value(i, f"Parameter.{name}", "update_norm") == pytest.approx(update, rel=1e-4, abs=1e-8)
        if kind in ("lstm", "flow"):  # the Debugger is on the net: WithLossCell's loss is no output of it
            assert m.series("Run", "loss")[0].size == 0
        # a Cell never called has no value (MultiheadAttention's out_proj: its weights are used functionally)
        norms = [m.value(0, n, "output_norm") for n in m.names() if n.startswith("Cell.")]
        ran = [v for v in norms if v is not None]
        assert len(ran) >= 3 and all(v > 0 for v in ran), norms
    assert [g.tobytes() for g in got] == [w.tobytes() for w in want]


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("kind", KINDS)
def test_nan_made_at_step_1_is_found_at_its_op(kind, level):
    net, batches = build(kind)
    with nbdebug.Debugger(net, level=level) as dbg:
        dbg.watch("TO")
        step = make_step(kind, net)
        for i, (x, y) in enumerate(batches):
            net.fault = i == 1
            step(x, y)
        net.fault = False
        assert dbg.first_nonfinite(0) is None
        assert dbg.first_nonfinite(1) == ("Functional.sqrt.0.forward", "output.0", 1)
        first = next(h for h in dbg.hits if h.hits)
        assert (first.node, first.slot, first.step) == ("Functional.sqrt.0.forward", "output.0", 1)


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_replay_of_a_later_batchnorm_step_is_bitwise(level):
    """The CPU BatchNorm's outputs 1-2 are never written by its kernel: refused live, and not compared by the
    replay (their memory held another value in the live step than in the replayed one)."""
    net, batches = build("resnet")
    with nbdebug.Debugger(net, level=level, replay_window=STEPS) as dbg:
        step = dbg.step_fn(make_step("resnet", net))
        for x, y in batches:
            step(x, y)
        node = "Primitive.bn_train.BatchNorm.0.forward"
        assert "unsupported" in dbg.stats(node, "output.1", step=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error", ReplayMismatch)
            for s in range(STEPS):
                r = dbg.replay(s)
                assert r.bitwise, (s, [str(m) for m in r.mismatches[:3]])
                assert r.compared > 100


@pytest.mark.parametrize("level", ["monitor", "L0", "L1", "mix"])
def test_run_loss_at_every_level(level):
    """``dbg.record_loss`` (value_and_grad) and a ``WithLossCell``'s own output (TrainOneStepCell) are the
    monitor's ``Run.loss`` at every level, as they are with PyTorch (at L0/L1/mix they were dropped)."""
    net, batches = build("resnet")
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    with nbdebug.Debugger(net, level=level) as dbg:
        opt = nn.Momentum(net.trainable_params(), 0.05, 0.9)
        grad_fn = ms.value_and_grad(lambda x, y: crit(net(x), y), None, opt.parameters)
        losses = []
        for x, y in batches:
            loss, grads = grad_fn(x, y)
            dbg.record_loss(loss)
            opt(grads)
            losses.append(float(loss.asnumpy()))
        assert dbg.session.monitor.series("Run", "loss")[1].tolist() == losses
    net, batches = build("flow")
    with_loss = nn.WithLossCell(net, crit)
    with nbdebug.Debugger(with_loss, level=level) as dbg:
        step = nn.TrainOneStepCell(with_loss, nn.Adam(net.trainable_params(), 1e-2))
        losses = [float(step(x, y).asnumpy()) for x, y in batches]
        assert dbg.session.monitor.series("Run", "loss")[1].tolist() == losses
