"""Held-out trials on MindSpore PyNative, round 4: what a user porting a PyTorch training loop writes.

A ``value_and_grad`` loop with an optimizer over parameter groups (own weight decay, own learning rate), a
dynamic learning rate (``nn.exponential_decay_lr``), ``ops.clip_by_global_norm`` and
``mindspore.amp.auto_mixed_precision`` with a ``DynamicLossScaler`` (``scale`` / ``unscale`` / ``all_finite`` /
``adjust``), on a 2-layer ``nn.GRU`` language model and an ``nn.TransformerEncoder`` (two layers and a final
norm). Checked: the losses and every gradient are bitwise those of an undebugged run, and every (node, slot)'s
tensor agrees with its statistics (or is refused with a reason). Defects found and fixed here:

* under L1/mix ``parameter == x`` (``<``, ``!=`` …) returned a Python ``bool``: the Tensor-method patch wrapped
  ``object.__eq__`` onto ``Parameter`` (whose static bases skip ``Tensor``), shadowing ``Tensor.__eq__`` for
  every real Parameter; ``DynamicLossScaler.adjust`` (``self.counter == …`` in ``ops.select``) then failed;
* under AMP O2 (or any ``to_float``), the gradient probe put in front of a float32 Cell's input (LayerNorm in
  a float16 network) ran under the Cell's mixed-precision type, so MindSpore cast the input at the probe:
  LayerNorm's gamma/beta gradients and every later step changed (at L0, L1 and mix);
* under ``mindspore.train.Model.train`` (a ``GeneratorDataset``, ``FixedLossScaleManager`` + ``amp_level="O2"``,
  the user's own callback beside ``dbg.callback()`` or ``dbg.step_fn(model)``) the monitor's ``Run.loss`` stayed
  empty: the loss the train network returns (``cb_params.net_outputs``, a loss scale cell's first output) is
  now ``Run.loss`` unless ``dbg.record_loss`` gave one; the run is otherwise checked (steps, invariant, a NaN
  batch's ``first_nonfinite`` at ``Input.0`` and ``TO`` there first, training unchanged);
* GRAPH mode, each in a fresh process (the kernel dump is armed at the first compile): a Cell whose
  ``construct`` loops over a ``CellList`` (unrolled) into a training-mode ``BatchNorm1d``, trained by
  ``TrainOneStepCell`` + ``nn.RMSProp`` and by an ``@ms.jit`` step (``value_and_grad`` + ``nn.Adam``): every
  slot's statistics are those of its value, live and in the dump loaded back; a NaN batch's first non-finite
  value is ``Input.0`` live (offline: it or the first kernel reading it); the losses are those of an
  undebugged run. Defects: the CPU ``Adam`` kernel's outputs (never written: leftover memory) made a NaN
  origin of their own under ``@ms.jit`` + ``nn.Adam`` (now refused like BatchNorm's, as is ``ApplyRMSProp``'s
  output; and in ``first_nonfinite`` a consumer without measured outputs cannot absorb a NaN);
  ``dbg.record_loss`` raised ``AttributeError`` in GRAPH mode (now ``Run.loss``, the loss of the step whose
  graph run computed it);
* a PyTorch model and its MindSpore port (Dense, LayerNorm, GELU; the same weights and batches, two SGD steps)
  compared at mix: the faithful port reported a first divergence (an error) at its LayerNorm's backward —
  MindSpore's ``LayerNorm`` Primitive numbers its gradients as they arrive (``output.2`` is the input's),
  PyTorch's ``layer_norm`` by argument, so ``output.0`` was set against the input gradient; and the forward
  ``gamma``/``beta`` (``input.1``/``input.2``) had no counterpart (``input.weight``/``input.bias``). Across
  frameworks, the slots of an op pair that names pair wrongly or not at all are now paired by shape in
  order (said in the row's messages). A LayerNorm with a wrong epsilon (1e-2) is the first divergence, at
  the norm layer; MindSpore's default epsilon (1e-7 against PyTorch's 1e-5) is within compare's tolerances;
* a ``@mindspore.jit`` training step called in PyNative mode under a Debugger failed inside MindSpore's
  compiler (``Unsupported statement 'Try'``, pointing into ``Cell._forward_pre_hook``: MindSpore compiles Cell
  hooks into the graph); now a ``RuntimeError`` says to create the Debugger in GRAPH mode (whose kernel dump
  sees inside ``@jit`` steps, tested above) or to drop ``@jit`` while debugging;
* a Debugger attached before ``auto_mixed_precision(net, "O1")`` (which rewrites the network into new Cells
  that carry the old Cells' hooks) failed with a bare ``KeyError``; now a ``RuntimeError`` says to attach to
  the network ``auto_mixed_precision`` returns (attached so, O1 works and is checked here).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ms_fixtures import ms, nn, pynative_mode  # noqa: F401 - the fixture
from test_invariant_models import check_step  # every (node, slot): stats == stats(tensor) or refused

import nbdebug
from nbdebug.frameworks.mindspore import graph as kd

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("pynative_mode")]
STEPS = 2


class GRULM(nn.Cell):
    def __init__(self, vocab: int = 11, d: int = 8) -> None:
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, num_layers=2, batch_first=True)
        self.head = nn.Dense(d, vocab)

    def construct(self, x):
        h, _ = self.rnn(self.emb(x))
        return self.head(h).reshape(-1, self.vocab)


class Encoder(nn.Cell):
    def __init__(self, vocab: int = 11, d: int = 8) -> None:
        super().__init__()
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm((d,)))
        self.head = nn.Dense(d, vocab)

    def construct(self, x):
        return self.head(self.enc(self.emb(x))).reshape(-1, self.vocab)


class NormNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(6, 8)
        self.norm = nn.LayerNorm((8,))  # in AMP's black list: float32 inside an O2 (float16) network
        self.fc2 = nn.Dense(8, 5)

    def construct(self, x):
        return self.fc2(self.norm(self.fc1(x)))


def build(kind: str):
    """(net, batches of (x, labels)); the same weights and batches at every call."""
    ms.set_seed(0)
    rng = np.random.default_rng(1)
    if kind == "norm":
        net = NormNet()
        xs = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(STEPS)]
        ys = [rng.integers(0, 5, (4,)).astype(np.int32) for _ in range(STEPS)]
    else:
        net = GRULM() if kind == "gru" else Encoder()
        xs = [rng.integers(0, 11, (2, 5)).astype(np.int32) for _ in range(STEPS)]
        ys = [rng.integers(0, 11, (10,)).astype(np.int32) for _ in range(STEPS)]
    net.set_train(True)
    return net, [(ms.Tensor(x), ms.Tensor(y)) for x, y in zip(xs, ys, strict=True)]


def make_step(net, model, amp: bool):
    """A PyTorch-style loop: parameter groups, a decaying rate, loss scaling, clipping; ``(loss, grads)``."""
    decay = [p for p in net.trainable_params() if "bias" not in p.name and "beta" not in p.name]
    rest = [p for p in net.trainable_params() if all(p is not q for q in decay)]  # `in` is elementwise ==
    lr = nn.exponential_decay_lr(0.01, 0.9, 2 * STEPS, 1, 1)
    opt = nn.Adam([{"params": decay, "weight_decay": 0.01}, {"params": rest, "lr": 0.02}], learning_rate=lr)
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    scaler = ms.amp.DynamicLossScaler(2.0 ** 10, 2, 1) if amp else None

    def forward(x, y):
        loss = crit(model(x), y).astype(ms.float32)
        return scaler.scale(loss) if scaler else loss

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def step(x, y):
        loss, grads = grad_fn(x, y)
        if scaler:
            loss, grads = scaler.unscale(loss), scaler.unscale(grads)
            scaler.adjust(ms.amp.all_finite(grads))
        grads = ops_clip(grads)
        opt(grads)
        return loss, grads

    return step


def ops_clip(grads):
    from mindspore import ops

    return ops.clip_by_global_norm(grads, 1.0)


def train(kind: str, amp: str | None, level: str | None = None, check: bool = False):
    """Losses and gradients (bytes) of ``STEPS`` steps; under a Debugger at ``level`` when given (attached
    to the network ``auto_mixed_precision`` returns), each step's invariant checked when ``check``."""
    net, batches = build(kind)
    model = ms.amp.auto_mixed_precision(net, amp) if amp else net
    dbg = nbdebug.Debugger(model, level=level) if level else None
    counts = []
    try:
        step = make_step(net, model, amp is not None)
        out = []
        for i, (x, y) in enumerate(batches):
            loss, grads = step(x, y)
            out.append((loss.asnumpy().tobytes(), [g.asnumpy().tobytes() for g in grads]))
            if check:
                counts.append(check_step(dbg, i))
        if dbg is not None:
            assert dbg.step_index == STEPS
    finally:
        if dbg is not None:
            dbg.close()
    return out, counts


def test_parameter_comparison_is_a_tensor_under_the_op_level():
    """``DynamicLossScaler.adjust`` compares its counter Parameter with an int inside ``ops.select``."""
    p = ms.Parameter(ms.Tensor(0, ms.int32), name="counter")
    with nbdebug.Debugger(nn.Dense(2, 2), level="L1"):
        for got in (p == 0, p != 0, p < 1, p >= 1):
            assert isinstance(got, ms.Tensor), type(got)
        assert bool((p == 0).asnumpy()) and not bool((p != 0).asnumpy())
        scaler = ms.amp.DynamicLossScaler(4.0, 2, 1)
        scaler.adjust(ms.Tensor(True))
        scaler.adjust(ms.Tensor(True))
        assert float(scaler.scale_value.asnumpy()) == 16.0  # window 1: doubled at each finite step


@pytest.mark.parametrize("level", ["L0", "mix"])
def test_amp_o2_float32_layernorm_trains_as_without_the_debugger(level, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    want, _ = train("norm", "O2")
    got, counts = train("norm", "O2", level, check=True)
    assert got == want
    assert all(r > 5 for r, _ in counts), counts


@pytest.mark.parametrize(("kind", "amp"), [("gru", "O2"), ("encoder", "O1")])
def test_language_models_with_amp_clipping_and_groups(kind, amp, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # O1 rewrites the network and writes its source under ./rewritten_network
    want, _ = train(kind, amp)
    got, counts = train(kind, amp, "mix", check=True)
    assert got == want
    assert all(r > 100 for r, _ in counts), counts


class DenseBN(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(6, 16)
        self.bn = nn.BatchNorm1d(16)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(self.act(self.bn(self.fc1(x))))


def _samples(nan_batch: int):
    rng = np.random.default_rng(0)
    for i in range(12):  # batches of 4: 3 per epoch
        x = rng.standard_normal(6).astype(np.float32)
        if i // 4 == nan_batch and i % 4 == 1:
            x[2] = np.nan
        yield x, np.int32(i % 4)


class LossLog(ms.train.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_step_end(self, run_context) -> None:
        out = run_context.original_args().net_outputs
        self.losses.append(float((out[0] if isinstance(out, tuple) else out).asnumpy()))


def _model_train(level: str | None, nan_batch: int = -1, keep: bool = False):
    import mindspore.dataset as ds

    ms.set_seed(0)
    net = DenseBN()
    data = ds.GeneratorDataset(lambda: _samples(nan_batch), ["x", "y"], shuffle=False).batch(4)
    model = ms.train.Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                           nn.Momentum(net.trainable_params(), 0.05, 0.9), amp_level="O2",
                           loss_scale_manager=ms.amp.FixedLossScaleManager(128.0, drop_overflow_update=False))
    log = LossLog()
    if level is None:
        model.train(2, data, callbacks=[log], dataset_sink_mode=False)
        return log.losses, None
    dbg = nbdebug.Debugger(net, level=level)
    if level != "monitor":
        dbg.watch("TO")
    if keep:  # the replay's callback instead of dbg.callback()
        dbg.step_fn(model).train(2, data, callbacks=[log], dataset_sink_mode=False)
    else:
        model.train(2, data, callbacks=[log, dbg.callback()], dataset_sink_mode=False)
    return log.losses, dbg


@pytest.mark.parametrize(("level", "keep"), [("mix", False), ("monitor", True)])
def test_model_train_with_a_generator_dataset_and_loss_scale(level, keep):
    want, _ = _model_train(None, nan_batch=1)
    if level == "mix":
        got, dbg = _model_train(level, nan_batch=1)
    else:
        got, dbg = _model_train(level, keep=keep)
        want, _ = _model_train(None)
    try:
        assert got == want
        assert dbg.step_index == 6 and list(dbg.session.steps) == list(range(6))
        steps, losses = dbg.session.monitor.series("Run", "loss")
        assert steps.tolist() == list(range(6))
        assert np.array_equal(losses, np.array(want, np.float32).astype(np.float64))
        if level == "mix":
            for s in (4, 5):  # the values of the current and the previous step
                assert check_step(dbg, s)[0] > 40
            first = next(h for h in dbg.hits if h.hits)
            assert (first.node, first.slot, first.step) == ("Input.0", "output.0", 1)
            assert dbg.first_nonfinite(0) is None
            assert dbg.first_nonfinite(1) == ("Input.0", "output.0", 1)  # the NaN sample of batch 1
            assert dbg.first_nonfinite(4) == ("Input.0", "output.0", 4)  # the same batch, second epoch
            assert dbg.first_nonfinite(2)[0] == "Parameter.fc1.weight"  # the update of step 1 made it NaN
            assert "Cell.bn._OutputTo16.forward.0" in dbg.graph.nodes  # AMP O2's float32 BatchNorm, wrapped
    finally:
        dbg.close()


def test_attached_before_o1_rewrite_says_what_to_do(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    net, batches = build("norm")
    with nbdebug.Debugger(net, level="L0"):
        model = ms.amp.auto_mixed_precision(net, "O1")
        with pytest.raises(RuntimeError, match="Attach the Debugger to the network auto_mixed_precision returns"):
            model(batches[0][0])


GRAPH_NET = """\
    import sys
    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.CellList([nn.Dense(6, 6) for _ in range(3)])
            self.bn = nn.BatchNorm1d(6)
            self.act = nn.ReLU()
            self.head = nn.Dense(6, 4)
        def construct(self, x):
            for layer in self.layers:
                x = self.act(layer(x))
            return self.head(self.bn(x))

    def batches():
        rng = np.random.default_rng(0)
        out = []
        for i in range(3):
            x = rng.standard_normal((8, 6)).astype(np.float32)
            if i == 2:
                x[3, 1] = np.nan
            out.append((ms.Tensor(x), ms.Tensor(rng.integers(0, 4, 8).astype(np.int32))))
        return out

    def train(net, jit, dbg=None):
        crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        if jit:
            opt = nn.Adam(net.trainable_params(), 1e-2)
            def forward(x, y):
                return crit(net(x), y)
            grad_fn = ms.value_and_grad(forward, None, opt.parameters)
            @ms.jit
            def step(x, y):
                loss, grads = grad_fn(x, y)
                opt(grads)
                return loss
        else:
            step = nn.TrainOneStepCell(nn.WithLossCell(net, crit), nn.RMSProp(net.trainable_params(), 0.01))
            step.set_train(True)
        out = []
        for x, y in batches():
            loss = step(x, y)
            if dbg is not None:
                dbg.record_loss(loss)  # after the graph ran: its step has ended, the loss is that step's
            out.append(loss.asnumpy().tobytes())
        return out

    JIT = sys.argv[-1] == "jit"
    net = Net()
    net.set_train(True)
    dbg = nbdebug.Debugger(net, level="L1")
    dbg.watch("TO")
    got = train(net, JIT, dbg)
    assert list(dbg.session.steps) == [0, 1, 2] and dbg.step_index == 3
    steps, losses = dbg.session.monitor.series("Run", "loss")
    assert steps.tolist() == [0, 1, 2], steps
    assert losses.astype(np.float32).tobytes() == b"".join(got), (losses, got)
    assert invariant_live(dbg, 1) > 150 and invariant_live(dbg, 2) > 150
    names = list(dbg.graph.nodes)
    bn = [n for n in names if n.endswith("/BatchNorm-op0")]
    assert len(bn) == 1 and dbg.graph.nodes[bn[0]].scope.endswith("bn-BatchNorm1d"), bn
    assert len([n for n in names if n.split("/")[-1].startswith("MatMul-op") and "Gradients" not in n]) == 4
    assert dbg.first_nonfinite(1) is None
    origin = dbg.first_nonfinite(2)
    first = next(h for h in dbg.hits if h.hits)
    assert (first.node, first.slot, first.step) == origin, (first, origin)
    assert origin == ("Input.0", "output.0", 2), origin  # the batch: no kernel made the NaN
    first_mm = next(n for n in dbg.graph.successors("Input.0") if "Gradients" not in n)
    # the CPU Adam / ApplyRMSProp kernels leave their outputs unwritten: refused, not shown (a NaN there was the
    # origin of the NaN batch)
    opt_type, outs = ("Adam", 3) if JIT else ("ApplyRMSProp", 1)
    kernels = [n for n in names if dbg.graph.nodes[n].op_type == opt_type]
    assert len(kernels) == 10, kernels  # one per parameter
    assert all("unsupported" in dbg.stats(k, f"output.{j}", 2) for k in kernels for j in range(outs))
    shutil.copytree(dbg._adapter.dump_dir, "copy")
    dbg.close()
    off = nbdebug.load("copy")
    assert invariant_offline(off) > 300
    # the copy holds iterations 1 and 2 only (the live capture deletes older files): loaded as steps 0 and 1
    node, slot, step = off.first_nonfinite(None)
    assert (node, slot) in (origin[:2], (first_mm, "input.0")) and off.session.step_iterations[step][1] == 2
    ms.set_seed(1)
    plain = Net()
    plain.set_train(True)
    want = train(plain, JIT)
    assert got == want
    print("OK")
    """


@pytest.mark.parametrize("how", ["cell", "jit"])
def test_graph_mode_unrolled_layers_and_batchnorm_live_and_offline(how, tmp_path):
    from test_mindspore_graph_control import HEAD  # live / offline invariant helpers

    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(HEAD) + textwrap.dedent(GRAPH_NET))
    env = dict(os.environ)
    env.pop(kd.ENV, None)  # a fresh process arms its own dump
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(nbdebug.__file__))
    res = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-3000:] + res.stderr[-3000:]


def _port_runs(eps: float):
    """(MindSpore port's Debugger, PyTorch's) after two SGD steps on the same weights and batches, at mix."""
    import torch
    import torch.nn.functional as F
    from mindspore import ops

    rng = np.random.default_rng(0)
    w = {"fc1.weight": rng.standard_normal((16, 8)) * 0.3, "fc1.bias": rng.standard_normal(16) * 0.1,
         "norm.weight": 1 + 0.1 * rng.standard_normal(16), "norm.bias": 0.1 * rng.standard_normal(16),
         "fc2.weight": rng.standard_normal((4, 16)) * 0.3, "fc2.bias": rng.standard_normal(4) * 0.1}
    w = {k: v.astype(np.float32) for k, v in w.items()}
    x, y = rng.standard_normal((4, 8)).astype(np.float32), rng.integers(0, 4, 4)

    class TorchNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.norm, self.fc2 = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

        def forward(self, h):
            return self.fc2(F.gelu(self.norm(self.fc1(h))))

    class PortNet(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.norm, self.fc2 = nn.Dense(8, 16), nn.LayerNorm((16,), epsilon=eps), nn.Dense(16, 4)

        def construct(self, h):
            return self.fc2(ops.gelu(self.norm(self.fc1(h)), approximate="none"))

    tnet = TorchNet()
    with torch.no_grad():
        for name, p in tnet.named_parameters():
            p.copy_(torch.from_numpy(w[name]))
    golden = nbdebug.Debugger(tnet, level="mix")
    opt = torch.optim.SGD(tnet.parameters(), 0.1)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(tnet(torch.from_numpy(x)), torch.from_numpy(y)).backward()
        opt.step()
    mnet = PortNet()
    to_torch = {"norm.gamma": "norm.weight", "norm.beta": "norm.bias"}
    for name, p in mnet.parameters_and_names():
        p.set_data(ms.Tensor(w[to_torch.get(name, name)]))
    target = nbdebug.Debugger(mnet, level="mix")
    mopt = nn.SGD(mnet.trainable_params(), 0.1)
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    grad_fn = ms.value_and_grad(lambda a, b: crit(mnet(a), b), None, mopt.parameters)
    for _ in range(2):
        mopt(grad_fn(ms.Tensor(x), ms.Tensor(y.astype(np.int32)))[1])
    return target, golden


def test_port_compare_pairs_layernorm_slots_and_finds_a_wrong_epsilon():
    for eps in (1e-5, 1e-7):  # faithful; MindSpore's default epsilon, within compare's tolerances
        target, golden = _port_runs(eps)
        try:
            res = nbdebug.compare(target, golden)
            assert res.errors == [] and res.warnings == [] and res.first_divergence is None, res.errors[:2]
            back = "Primitive.layer_norm.LayerNorm.0.backward"
            dx = res.row(back, "output.2")  # the input's gradient, the last to arrive
            assert dx.golden_slot == "output.0" and dx.status == "pass" and "by shape and order" in dx.messages[0]
            gamma = res.row("Primitive.layer_norm.LayerNorm.0.forward", "input.1")
            assert gamma.golden_slot == "input.weight" and gamma.status == "pass" and gamma.max_abs_err == 0
        finally:
            target.close()
            golden.close()
    target, golden = _port_runs(1e-2)
    try:
        fd = nbdebug.compare(target, golden).first_divergence
        assert (fd.node, fd.golden, fd.layer) == ("Cell.norm.LayerNorm.forward.0", "Module.norm.LayerNorm.forward.0",
                                                  "norm")
    finally:
        target.close()
        golden.close()


def test_a_jit_step_under_a_pynative_debugger_says_what_to_do(monkeypatch, tmp_path):
    from mindspore.graph.api import _JitExecutor

    monkeypatch.chdir(tmp_path)  # MindSpore writes its analyze_fail.ir under ./rank_0
    original = _JitExecutor.compile
    net, batches = build("norm")
    crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.SGD(net.trainable_params(), 0.1)

    def forward(x, y):
        return crit(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    @ms.jit
    def step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    for level in ("monitor", "L0"):
        with nbdebug.Debugger(net, level=level):
            with pytest.raises(RuntimeError, match="create the Debugger in GRAPH mode") as info:
                step(*batches[0])
            assert "hook" in str(info.value.__cause__)  # MindSpore's own error, chained
        assert _JitExecutor.compile is original  # put back at close
