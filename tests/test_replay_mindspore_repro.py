"""MindSpore save_repro / load_repro (frameworks/mindspore/repro.py): a PyNative step written as a folder and
recomputed by the generated ``repro.py`` in a fresh process, loss and every updated Parameter bitwise — a
``value_and_grad`` step with ``nn.Adam`` (a NaN batch included) and a ``TrainOneStepCell`` with ``nn.Momentum``;
what the script cannot rebuild is refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ms_fixtures import ms, pynative_mode  # noqa: F401 - the fixture

import nbdebug

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("pynative_mode")]

FACTORY = textwrap.dedent('''
    import mindspore as ms
    from mindspore import nn


    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, pad_mode="valid")
            self.bn = nn.BatchNorm2d(2)
            self.flatten = nn.Flatten()
            self.fc = nn.Dense(2 * 4 * 4, 3)

        def construct(self, x):
            return self.fc(self.flatten(ms.ops.tanh(self.bn(self.conv(x)))))  # tanh keeps a NaN (relu gives 0)


    def build(kind="fn"):
        net = Net()
        net.set_train(True)
        crit = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
        if kind == "cell":
            opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
            step = nn.TrainOneStepCell(nn.WithLossCell(net, crit), opt)
            step.set_train(True)
            return {"model": net, "step": step}
        opt = nn.Adam(net.trainable_params(), 1e-2)

        def forward(x, y):
            return crit(net(x), y)

        grad_fn = ms.value_and_grad(forward, None, opt.parameters)

        def train_step(x, y):
            loss, grads = grad_fn(x, y)
            opt(grads)
            return loss

        return {"model": net, "step": train_step, "optimizers": [opt]}


    def make():
        return build("fn")


    def make_cell():
        return build("cell")
''')


@pytest.fixture
def factory(tmp_path, monkeypatch):
    (tmp_path / "msrepro_net.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import msrepro_net

    yield msrepro_net, tmp_path
    sys.modules.pop("msrepro_net", None)


def _batches(n: int, nan_at: int | None = None):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        x = rng.normal(size=(4, 1, 6, 6)).astype(np.float32)
        if i == nan_at:
            x[1, 0, 2, 2] = np.nan
        out.append((ms.Tensor(x), ms.Tensor(rng.integers(0, 3, 4).astype(np.int32))))
    return out


def _run(folder, pythonpath):
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    return subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=500)


def _train(mod, kind: str, n: int, nan_at: int | None = None):
    ms.set_seed(0)
    built = mod.build(kind)
    dbg = nbdebug.Debugger(built["model"], level="L0")
    step = dbg.step_fn(built["step"])
    losses = [step(x, y) for x, y in _batches(n, nan_at)]
    return dbg, built, losses


@pytest.mark.parametrize("safetensors", [True, False], ids=["safetensors", "npy"])
def test_save_repro_value_and_grad_adam_reproduces_the_nan_step(factory, monkeypatch, safetensors):
    from nbdebug.frameworks.mindspore import repro as ms_repro

    monkeypatch.setattr(ms_repro, "_SAFETENSORS", safetensors)
    mod, tmp = factory
    dbg, built, losses = _train(mod, "fn", 3, nan_at=2)
    assert np.isnan(losses[2].asnumpy())
    live = {n: p.asnumpy().copy() for n, p in built["model"].parameters_and_names()}
    folder = dbg.save_repro(tmp / "step", 2, model_factory="msrepro_net:make")
    assert {n: p.asnumpy().tobytes() for n, p in built["model"].parameters_and_names()} == \
        {n: a.tobytes() for n, a in live.items()}  # saving replayed the step: the live run is unchanged
    files = os.listdir(folder)
    assert ("tensors.safetensors" in files) is safetensors and ("tensors" in files) is not safetensors
    manifest = json.loads(open(os.path.join(folder, "manifest.json")).read())
    assert manifest["framework"] == "mindspore" and manifest["bitwise_replay"] is True
    assert "opt0:moment1.fc.weight" in manifest["state"]["params"]  # Adam's own Parameters saved
    assert "import pickle" not in open(os.path.join(folder, "repro.py")).read()
    r = _run(folder, tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss nan bitwise identical | non-finite: True" in r.stdout
    assert "Parameters after the step: " in r.stdout and "bitwise identical" in r.stdout.splitlines()[-1]
    # load_repro: the folder's JSON and arrays, nothing of it run
    marker = tmp / "executed"
    with open(os.path.join(folder, "repro.py"), "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    off = nbdebug.load_repro(folder)
    assert not marker.exists()
    arrays = off.meta["arrays"]
    assert np.isnan(arrays["args.0"]).any() and arrays["state/param:conv.weight"].shape == (2, 1, 3, 3)
    assert off.meta["kind"] == "step" and off.first_nonfinite()[2] == 2
    dbg.close()


def test_save_repro_train_one_step_cell_momentum(factory):
    mod, tmp = factory
    dbg, _, losses = _train(mod, "cell", 3)
    folder = dbg.save_repro(tmp / "cell", model_factory="msrepro_net:make_cell")
    manifest = json.loads(open(os.path.join(folder, "manifest.json")).read())
    assert manifest["step_is_cell"] and manifest["optimizers"] == ["Momentum"]
    assert manifest["bitwise_replay"] is True  # the TrainOneStepCell's replay at mix matched the live step
    r = _run(folder, tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"step 2: loss {losses[2].asnumpy().item()!r} bitwise identical" in r.stdout
    # a wrong saved value is seen: the script says the step differs (exit status 1)
    arrays = dict(nbdebug.load_repro(folder).meta["arrays"])
    arrays["after/param:fc.bias"] = arrays["after/param:fc.bias"] + np.float32(1)
    from safetensors.numpy import save_file

    save_file(arrays, os.path.join(folder, "tensors.safetensors"))
    r = _run(folder, tmp)
    assert r.returncode == 1 and "DIFFER, first param:fc.bias" in r.stdout, r.stdout + r.stderr
    dbg.close()


def test_save_repro_refusals_write_nothing(factory):
    mod, tmp = factory
    dbg, _, _ = _train(mod, "fn", 2)
    with pytest.raises(ValueError, match="model_factory='module:function'"):
        dbg.save_repro(tmp / "none")
    with pytest.raises(ValueError, match="a Primitive held by a Cell carries attributes"):
        dbg.save_repro(tmp / "op", node="Primitive.matmul.MatMul.0.forward")
    assert not (tmp / "none").exists() and not (tmp / "op").exists()
    dbg.close()


class _Ops(ms.nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = ms.nn.Dense(4, 6)
        self.fc2 = ms.nn.Dense(6, 1)

    def construct(self, x):
        h = ms.mint.mul(ms.ops.tanh(self.fc1(x)), 1.5)
        h += 0.25  # Tensor.__iadd__: the saved input is h before the addition
        return self.fc2(h / x.sum(axis=1, keepdims=True))


def test_save_repro_node_calls_one_op_bitwise(tmp_path):
    ms.set_seed(0)
    net = _Ops()
    opt = ms.nn.SGD(net.trainable_params(), 0.1)
    dbg = nbdebug.Debugger(net, level="L0")
    grad_fn = ms.value_and_grad(lambda x: net(x).sum(), None, opt.parameters)

    @dbg.step_fn
    def train_step(x):
        loss, grads = grad_fn(x)
        opt(grads)
        return loss

    x = np.random.default_rng(0).uniform(0.5, 1.5, (3, 4)).astype(np.float32)
    x[1] = [1.0, -1.0, 2.0, -2.0]  # sums to 0: the division makes inf and NaN
    train_step(ms.Tensor(x))
    r = dbg.replay(0)
    iadd = "Tensor.__iadd__.0.forward"
    before = r.tensor(iadd, "input.0")
    assert before.tobytes() == r.tensor("Mint.mul.0.forward", "output.0").tobytes()
    for node, nonfinite in (("Mint.mul.0.forward", False), (iadd, False), ("Tensor.__truediv__.0.forward", True)):
        folder = dbg.save_repro(tmp_path / node.split(".")[1].strip("_"), 0, node=node)
        arrays = nbdebug.load_repro(folder).meta["arrays"]
        if node == iadd:
            assert arrays["args.0"].tobytes() == before.tobytes()  # the value before the op, not its result
        done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{node}: output bitwise identical | non-finite: {nonfinite}" in done.stdout
    dbg.close()
