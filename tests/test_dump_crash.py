"""Crash safety: a training process SIGKILLed mid-step leaves a journal that becomes the step's dump."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

import nbdebug
from nbdebug.dump import recover
from nbdebug.dump.journal import JOURNAL

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import os, signal, sys, time
import torch, torch.nn as nn, torch.nn.functional as F
from nbdebug import PrecisionDebugger

out = sys.argv[1]


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


torch.manual_seed(0)
model = Net()
pd = PrecisionDebugger(dump_path=out, task="tensor", level="mix")
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def crash(mod, args):
    # step 1, fc2 about to run: fc1 and act are done. Let the writer thread catch up (it normally
    # lags by microseconds), show what the parent should find, and die without any cleanup.
    if pd.current_step == 1:
        deadline = time.time() + 20
        while pd.writer.pending and time.time() < deadline:
            time.sleep(0.01)
        pd.debugger.capture = False  # what the test itself saves below is not training
        torch.save(args[0], os.path.join(out, "fc2_input.pt"))
        torch.save(model.fc1.weight.detach(), os.path.join(out, "fc1_weight.pt"))
        print("KILLING", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


model.fc2.register_forward_pre_hook(crash)
for step in range(2):
    x = torch.randn(4, 8)
    pd.start(model)
    loss = F.mse_loss(model(x), torch.zeros(4, 4))
    opt.zero_grad()
    loss.backward()
    opt.step()
    pd.stop()
    pd.step()
print("NOT KILLED", flush=True)
'''


def test_sigkill_mid_step_then_recover(tmp_path):
    out = tmp_path / "dump"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, str(script), str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stdout + r.stderr
    assert "KILLING" in r.stdout and "NOT KILLED" not in r.stdout

    # step 0 finished normally: final files, no journal
    (step0,) = [os.path.join(out, "step0", d) for d in os.listdir(out / "step0")]
    assert not os.path.exists(os.path.join(step0, JOURNAL))
    with open(os.path.join(step0, "dump.json")) as f:
        assert "Module.fc1.Linear.parameters_grad.0" in json.load(f)["data"]

    # step 1 died mid-forward: dump.json is still the empty one written at start(), the journal has the rest
    (step1,) = [os.path.join(out, "step1", d) for d in os.listdir(out / "step1")]
    assert os.path.exists(os.path.join(step1, JOURNAL))
    with open(os.path.join(step1, "dump.json")) as f:
        assert json.load(f)["data"] == {}
    assert not [f for f in os.listdir(os.path.join(step1, "dump_tensor_data")) if ".tmp" in f]

    # nbdebug.load reads the journal without writing anything: step 1 has its rows and the journal is named
    with pytest.warns(UserWarning, match="cut before it finished"):
        off = nbdebug.load(out)
    assert off.steps == [0, 1]
    assert ("Module.act.ReLU.forward.0", "output.0") in off.session.steps[1].index
    (prob,) = [p for p in off.problems if JOURNAL in p.file]
    assert prob.file == os.path.join(step1, JOURNAL) and "4 entries recovered" in prob.message
    assert os.path.exists(os.path.join(step1, JOURNAL))

    assert recover(str(out / "step1")) == [step1]
    assert not os.path.exists(os.path.join(step1, JOURNAL))
    with open(os.path.join(step1, "dump.json")) as f:
        dump = json.load(f)
    assert dump["task"] == "tensor" and dump["level"] == "mix"
    assert list(dump["data"]) == ["Functional.linear.0.forward", "Module.fc1.Linear.forward.0",
                                  "Functional.relu.0.forward", "Module.act.ReLU.forward.0"]
    data_dir = dump["dump_data_dir"]
    for entry in dump["data"].values():
        for part in ("input_args", "output"):
            for t in entry[part]:
                assert os.path.exists(os.path.join(data_dir, t["data_name"])), t["data_name"]
    act_out = torch.load(os.path.join(data_dir, "Module.act.ReLU.forward.0.output.0.pt"), weights_only=True)
    assert torch.equal(act_out, torch.load(out / "fc2_input.pt", weights_only=True))
    weight = torch.load(os.path.join(data_dir, "Module.fc1.Linear.forward.0.parameters.weight.pt"), weights_only=True)
    assert torch.equal(weight, torch.load(out / "fc1_weight.pt", weights_only=True))
    stats = dump["data"]["Module.act.ReLU.forward.0"]["output"][0]
    assert stats["Max"] == act_out.max().item() and stats["Norm"] == act_out.norm().item()
    with open(os.path.join(step1, "construct.json")) as f:
        assert json.load(f)["Functional.relu.0.forward"] == "Module.act.ReLU.forward.0"
    with open(os.path.join(step1, "stack.json")) as f:
        groups = [names for names, _ in json.load(f).values()]
    assert groups[0] == ["Module.fc1.Linear.forward.0", "Module.act.ReLU.forward.0"]  # called on the same line
