"""Replay a MindSpore PyNative step (real MindSpore, CPU): ``@dbg.step_fn`` on a ``value_and_grad`` step with
``nn.Adam`` / ``nn.Momentum``, captured at L0 and replayed at mix bitwise, the live run unchanged; a model
with a stateful random Primitive (``nn.Dropout``) is reported as such."""

import warnings

import numpy as np
import pytest
from ms_fixtures import ms, nn, pynative_mode  # noqa: F401 - the fixture

import nbdebug
from nbdebug.replay import ReplayMismatch

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pynative_mode")]


class _Net(nn.Cell):
    def __init__(self, dropout: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Dense(6, 8)
        self.bn = nn.BatchNorm1d(8)  # moving statistics: Parameters the forward updates in place
        self.fc2 = nn.Dense(8, 3)
        self.drop = nn.Dropout(p=0.3) if dropout else None

    def construct(self, x):
        h = ms.ops.relu(self.bn(self.fc1(x)))
        if self.drop is not None:
            h = self.drop(h)
        return self.fc2(h)


def _batches(n: int = 4):
    rng = np.random.default_rng(0)
    return [(ms.Tensor(rng.normal(size=(4, 6)).astype(np.float32)),
             ms.Tensor(rng.integers(0, 3, 4).astype(np.int32))) for _ in range(n)]


def _train(opt_name: str, replay_at: int | None, dropout: bool = False):
    ms.set_seed(0)
    np.random.seed(0)
    net = _Net(dropout)
    net.set_train(True)
    params = net.trainable_params()
    opt = nn.Adam(params, 1e-2) if opt_name == "adam" else nn.Momentum(params, 0.1, 0.9)
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    dbg = nbdebug.Debugger(net, level="L0")

    def forward(x, y):
        return crit(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @dbg.step_fn
    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    replayed = None
    for i, (x, y) in enumerate(_batches()):
        train_step(x, y)
        if i == replay_at:
            before = {n: p.asnumpy().copy() for n, p in list(net.parameters_and_names()) +
                      list(opt.parameters_and_names())}
            replayed = dbg.replay(i, level="mix")
            after = {n: p.asnumpy().copy() for n, p in list(net.parameters_and_names()) +
                     list(opt.parameters_and_names())}
            assert before.keys() == after.keys()
            assert all(before[k].tobytes() == after[k].tobytes() for k in before), "the replay changed the live run"
    weights = {n: p.asnumpy().copy() for n, p in net.parameters_and_names()}
    tables = [dbg.session.table(s) for s in range(4)]
    dbg.close()
    return replayed, weights, tables


@pytest.mark.parametrize("opt_name", ["adam", "momentum"])
def test_pynative_replay_at_mix_is_bitwise_and_leaves_the_live_run_alone(opt_name):
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayMismatch)
        replayed, weights, tables = _train(opt_name, replay_at=2)
    assert replayed.bitwise, [str(m) for m in replayed.mismatches[:3]]
    assert replayed.compared > 40  # the L0 statistics of the step, optimizer node included
    assert replayed.loss.tobytes() == replayed.live_loss.tobytes()
    opt_node = "Optimizer.Adam.step.0" if opt_name == "adam" else "Optimizer.Momentum.step.0"
    assert opt_node in replayed.graph.nodes  # the optimizer's update was replayed too
    matmul = next(n for n in replayed.graph.nodes if n.startswith("Primitive.matmul.MatMul."))
    assert replayed.tensor(matmul, "output.0").shape == (4, 8)  # op level, with its tensors
    _, weights0, tables0 = _train(opt_name, replay_at=None)
    assert all(weights[k].tobytes() == weights0[k].tobytes() for k in weights)
    for a, b in zip(tables, tables0, strict=True):
        assert a.keys == b.keys and np.array_equal(a.values.view(np.int64), b.values.view(np.int64))


def test_stateful_random_primitive_is_named_as_the_reason():
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayMismatch)
        with pytest.raises(ReplayMismatch) as e:
            _train("momentum", replay_at=1, dropout=True)
    assert "stateful random ops (drop.dropout: Dropout)" in str(e.value)
    assert "does not expose for saving" in str(e.value)


def test_mismatch_reason_is_mindspore_s_own_wording():
    ms.set_seed(0)
    net = _Net()
    net.set_train(True)
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    dbg = nbdebug.Debugger(net, level="L0")
    grad_fn = ms.value_and_grad(lambda x, y: crit(net(x), y), None, opt.parameters)
    data = iter(_batches(4))

    scale = [1.0]

    @dbg.step_fn
    def train_step(x, y):  # Python state the step changes: a replay sees the value of now
        scale[0] *= 2.0
        loss, grads = grad_fn(x * scale[0], y)
        opt(grads)
        return loss

    train_step(*next(data))
    with pytest.warns(ReplayMismatch):
        r = dbg.replay(0)
    assert not r.bitwise and r.mismatches
    assert "Python state the step changes" in r.reason and "torch" not in r.reason, r.reason
    dbg.close()
