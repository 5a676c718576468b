"""save_repro / load_repro (nbdebug/replay/repro.py): a step or one op recomputed bitwise in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import transformers  # noqa: E402 - the numpy-2 run leaves this module out (tests/torch_only.py)

import nbdebug

MODEL_SOURCE = textwrap.dedent('''
    import torch


    class Div(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 8)
            self.fc2 = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.fc2(self.fc1(x) / x.sum(dim=1, keepdim=True))


    def make():
        return Div()
''')


def _run(folder, pythonpath=None):
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, env=env,
                          timeout=300)


@pytest.fixture
def nan_run(tmp_path, monkeypatch):
    (tmp_path / "divmodel.py").write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import divmodel

    torch.manual_seed(0)
    model = divmodel.make()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    dbg = nbdebug.Debugger(model, level="L0", on_hit="replay")
    dbg.watch("TO")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    batches = [torch.rand(3, 4) + 0.5 for _ in range(4)]
    batches[3][1] = torch.tensor([1.0, -1.0, 2.0, -2.0])
    for b in batches:
        train_step(b)
    yield dbg, tmp_path
    dbg.close()
    sys.modules.pop("divmodel", None)


@pytest.mark.parametrize("safetensors", [True, False], ids=["safetensors", "npy"])
def test_save_repro_reproduces_the_nan_step_and_its_op(nan_run, monkeypatch, safetensors):
    from nbdebug.frameworks.torch import repro as torch_repro

    monkeypatch.setattr(torch_repro, "_SAFETENSORS", safetensors)
    dbg, tmp = nan_run
    assert dbg.replayed.step == 3
    step_dir = dbg.save_repro(tmp / "step", 3, model_factory="divmodel:make")
    files = os.listdir(step_dir)
    assert ("tensors.safetensors" in files) is safetensors and ("tensors" in files) is not safetensors
    r = _run(step_dir, pythonpath=tmp)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "loss nan bitwise identical" in r.stdout
    node = dbg.replayed.first_nonfinite()[0]
    op_dir = dbg.save_repro(tmp / "op", 3, node=node)
    r = _run(op_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{node}: output bitwise identical | non-finite: True" in r.stdout


def test_save_repro_gpt2_from_its_config(tmp_path):
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(ids):
        opt.zero_grad()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        return out.loss

    for i in range(2):
        train_step(torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(i)))
    folder = dbg.save_repro(tmp_path / "gpt2", 1)
    r = _run(folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bitwise identical" in r.stdout
    # the op form: a linear-like op of the replayed step, called on its own
    op = next(n for n in nbdebug.load_repro(folder).graph.nodes if n.startswith("Functional.embedding"))
    r = _run(dbg.save_repro(tmp_path / "op", 1, node=op))
    assert r.returncode == 0 and "output bitwise identical" in r.stdout, r.stdout + r.stderr
    with pytest.raises(FileExistsError):
        dbg.save_repro(tmp_path / "gpt2", 1)
    dbg.close()


def test_load_repro_reads_json_and_arrays_only(nan_run):
    dbg, tmp = nan_run
    node = "Tensor.__truediv__.0.forward"
    folder = dbg.save_repro(tmp / "op", 3, node=node)
    marker = tmp / "executed"
    with open(os.path.join(folder, "repro.py"), "a") as f:
        f.write(f"\nopen({str(marker)!r}, 'w').write('ran')\n")
    off = nbdebug.load_repro(folder)
    assert not marker.exists()
    assert off.first_nonfinite() == (node, "output.0", 3)
    arrays = off.meta["arrays"]
    assert arrays["args.1"].ravel()[1] == 0.0 and not np.isfinite(arrays["expected"]).all()
    assert off.meta["kind"] == "op" and off.meta["bitwise_replay"] is True
    with pytest.raises(FileNotFoundError, match="not a reproduction folder"):
        nbdebug.load_repro(tmp)


def test_save_repro_rebuilds_an_lr_scheduler_and_refuses_a_lambda(tmp_path, monkeypatch):
    (tmp_path / "divmodel.py").write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import divmodel

    torch.manual_seed(0)
    model = divmodel.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        sched.step()
        return loss.detach() * opt.param_groups[0]["lr"]  # the rate the scheduler set after the step

    for _ in range(3):
        train_step(torch.rand(3, 4) + 0.5)
    folder = dbg.save_repro(tmp_path / "repro")
    manifest = json.loads((tmp_path / "repro" / "manifest.json").read_text())
    assert manifest["state"]["schedulers"][0]["class"][1] == "StepLR"
    assert "import pickle" not in (tmp_path / "repro" / "repro.py").read_text()
    done = _run(folder, pythonpath=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "bitwise identical" in done.stdout
    dbg.close()

    lam = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 0.9 ** e)
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def lambda_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        lam.step()
        return loss

    lambda_step(torch.rand(3, 4) + 0.5)
    with pytest.raises(ValueError, match="LambdaLR computes its rate with Python functions"):
        dbg.save_repro(tmp_path / "repro2")
    dbg.close()
    sys.modules.pop("divmodel", None)



def test_save_repro_checks_every_parameter_after_the_step(tmp_path, monkeypatch):
    from nbdebug.frameworks.torch import repro as torch_repro

    monkeypatch.setattr(torch_repro, "_SAFETENSORS", False)  # .npy files: one tensor is altered below
    (tmp_path / "divmodel.py").write_text(MODEL_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "divmodel", raising=False)
    import divmodel

    torch.manual_seed(0)
    model = divmodel.make()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    dbg = nbdebug.Debugger(model, level="L0", replay_window=2)

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(3):
        train_step(torch.rand(3, 4) + 0.5)
    folder = dbg.save_repro(tmp_path / "step1", 1, model_factory="divmodel:make")  # not the last: from the replay
    r = _run(folder, pythonpath=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Parameters after the step: 4 bitwise identical" in r.stdout
    manifest = json.loads((tmp_path / "step1" / "manifest.json").read_text())
    assert manifest["after"] == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    # the values are the live run's after step 1: the pre-step state step 2 kept
    after = nbdebug.load_repro(folder).meta["arrays"]
    start2 = dbg._replay.get(2).state.tensors
    for name in manifest["after"]:
        assert after["after/" + name].tobytes() == start2["param:" + name].numpy().tobytes(), name
    # a broken folder: one parameter's expected value altered by one bit
    path = tmp_path / "step1" / manifest["tensors"]["tensors"]["after/fc2.bias"]["file"]
    arr = np.load(path)
    arr.view(np.int32)[0] ^= 1
    np.save(path, arr)
    r = _run(folder, pythonpath=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "bitwise identical" in r.stdout.splitlines()[0]  # the loss still is
    assert "Parameters after the step: 1 of 4 DIFFER: fc2.bias" in r.stdout
    dbg.close()


def test_save_repro_after_a_replay_that_is_not_bitwise(tmp_path, monkeypatch):
    """A replay that is not bitwise (the step reads a module value changed since) cannot stand for the live
    parameters: the last step's come from the live model, an earlier step's are reported as not checked."""
    (tmp_path / "scaled.py").write_text(MODEL_SOURCE + "\n\nFACTOR = 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "scaled", raising=False)
    import scaled

    torch.manual_seed(0)
    model = scaled.make()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="L0", replay_window=2)

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = (model(x) * scaled.FACTOR).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        train_step(torch.rand(3, 4) + 0.5)
    monkeypatch.setattr(scaled, "FACTOR", 3.0)  # the replays compute something else than the live steps did
    with pytest.warns(nbdebug.replay.ReplayMismatch):
        last = dbg.save_repro(tmp_path / "last", 1, model_factory="scaled:make")
    r = _run(last, pythonpath=tmp_path)  # the script imports scaled afresh: FACTOR 1.0, as the live run had
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Parameters after the step: 4 bitwise identical" in r.stdout
    assert json.loads((tmp_path / "last" / "manifest.json").read_text())["after_note"].endswith("last step")
    with pytest.warns(nbdebug.replay.ReplayMismatch):
        first = dbg.save_repro(tmp_path / "first", 0, model_factory="scaled:make")
    r = _run(first, pythonpath=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Parameters after the step: NOT CHECKED, step 0's replay cannot stand for the live run" in r.stdout
    dbg.close()
