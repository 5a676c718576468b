"""save_repro(node=...) of an in-place op (nbdebug/replay/repro.py): the saved input is the value the op
received — before it wrote it — so ``repro.py`` recomputes the op's output bitwise in a fresh process; for
an in-place op of the forward (``Tensor.add_``, ``Tensor.__imul__``) and of the optimizer (SGD's
``Tensor.add_`` on a parameter); a written input whose value before the op is gone is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.replay import repro as replay_repro


class InPlace(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 1)

    def forward(self, x):
        h = self.fc1(x)
        h.add_(0.75)  # in place on a non-leaf: its input is fc1's output
        h *= 1.5
        return self.fc2(torch.tanh(h))


def _run(folder):
    return subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True, timeout=300)


@pytest.fixture
def run():
    torch.manual_seed(0)
    model = InPlace()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)  # per-parameter add_ in place
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    for _ in range(2):
        train_step(torch.rand(3, 4))
    yield dbg
    dbg.close()


def _saved(folder, name):
    arrays = nbdebug.load_repro(folder).meta["arrays"]
    return arrays[name]


def test_inplace_forward_op_saves_its_input_before_the_op(run, tmp_path):
    dbg = run
    r = dbg.replay(1)
    node = next(n for n in r.graph.nodes if n.startswith("Tensor.add_."))
    before = r.tensor(node, "input.0")  # what the capture shows as the op's input: fc1's output
    fc1_out = r.tensor(next(n for n in r.graph.nodes if n.startswith("Functional.linear.")), "output.0")
    assert before.tobytes() == fc1_out.tobytes()
    folder = dbg.save_repro(tmp_path / "add", 1, node=node)
    saved = _saved(folder, "args.0")
    assert saved.tobytes() == before.tobytes()  # not the op's result (that is input + 0.75)
    assert not np.array_equal(saved, _saved(folder, "expected"))
    done = _run(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{node}: output bitwise identical" in done.stdout
    imul = next(n for n in r.graph.nodes if n.startswith("Tensor.__imul__."))
    done = _run(dbg.save_repro(tmp_path / "imul", 1, node=imul))
    assert done.returncode == 0 and "output bitwise identical" in done.stdout, done.stdout + done.stderr


def test_inplace_optimizer_op_saves_the_parameter_before_the_update(run, tmp_path):
    dbg = run
    r = dbg.replay(1)
    node = next(n for n in r.graph.nodes if n.startswith("Tensor.add_.") and r.graph.nodes[n].section == "optimizer")
    folder = dbg.save_repro(tmp_path / "sgd", 1, node=node)
    manifest = json.loads(open(os.path.join(folder, "manifest.json")).read())
    assert manifest["node"] == node
    saved, expected = _saved(folder, "args.0"), _saved(folder, "expected")
    assert not np.array_equal(saved, expected)  # the parameter before the update, not after it
    done = _run(folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{node}: output bitwise identical" in done.stdout


def test_written_input_not_retained_is_refused(run, tmp_path, monkeypatch):
    dbg = run
    node = next(n for n in dbg.replay(1).graph.nodes if n.startswith("Tensor.add_."))
    real = replay_repro.replay

    def forgetful(*a, **k):  # the replay drops the op's retained input (as a capture over its budget would)
        out = real(*a, **k)
        store = out.session.store
        for which in ("current", "previous"):
            getattr(store, which).pop((node, "input.0"), None)
        return out

    monkeypatch.setattr(replay_repro, "replay", forgetful)
    with pytest.raises(ValueError, match=r"writes its input\.0 in place, and the replay did not retain"):
        dbg.save_repro(tmp_path / "gone", 1, node=node)
    assert not (tmp_path / "gone").exists()
