"""Entry names against real msProbe at L0, L1 and mix (issue #11 item 10).

The same script runs under msProbe's ``PrecisionDebugger`` and nbdebug's (the import swapped): the
entries of each step's ``dump.json`` must be the same, in the same order — ``0.5 * h`` is
``Tensor.__rmul__``, ``F.conv2d`` is ``Functional.conv2d``, and calls msProbe does not hook
(``torch.tensor``, ``Tensor.contiguous``, ``Tensor.__getitem__``, AdamW's state initialisation) are
not entries; a parameter used without its module's call has no ``parameters_grad`` entry.
"""

from __future__ import annotations

import glob
import json
import os

import pytest
from interchange_runs import TOOL_IMPORTS, run_forked

pytestmark = pytest.mark.slow  # its set-up: ten msProbe/nbdebug training runs in subprocesses (~85 s on 2 cores)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import sys
import torch, torch.nn as nn, torch.nn.functional as F

tool, cfg_path = sys.argv[1], sys.argv[2]
if tool == "msprobe":
    from msprobe.pytorch import PrecisionDebugger, seed_all
else:
    from nbdebug import PrecisionDebugger, seed_all


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)  # its weight is used through F.conv2d, not a call
        self.fc = nn.Linear(16, 4)
        self.ln = nn.LayerNorm(4)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = F.conv2d(x, self.conv.weight, self.conv.bias, padding=1)
        h = h.transpose(1, 2).contiguous()
        h = h[:, 0].flatten(1)
        h = self.fc(h)
        scale = torch.tensor(2.0)
        s = 0.25
        y = self.ln(h) + 0.5 * h * scale
        y = s * y - y * 0.5
        return self.act(y)


seed_all(1234)
model = Net()
debugger = PrecisionDebugger(config_path=cfg_path)
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
for _ in range(2):
    x, y = torch.randn(2, 3, 4, 4), torch.randn(2, 4)
    debugger.start(model)
    loss = F.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    debugger.stop()
    debugger.step()
'''

GPT2_SCRIPT = r'''
import sys
import torch

tool, cfg_path, tests = sys.argv[1], sys.argv[2], sys.argv[3]
if tool == "msprobe":
    from msprobe.pytorch import PrecisionDebugger
else:
    from nbdebug import PrecisionDebugger
sys.path.insert(0, tests)
from test_invariant_models import build  # GPT-2 with tied weights, from a config, random weights

model, batches, loss_fn, _ = build("gpt2")
debugger = PrecisionDebugger(config_path=cfg_path)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for b in batches[:2]:
    debugger.start(model)
    loss = loss_fn(model, b)
    opt.zero_grad()
    loss.backward()
    opt.step()
    debugger.stop()
    debugger.step()
'''

LEVELS = ("L0", "L1", "mix")


def _config(path: str, dump: str, level: str) -> None:
    cfg = {"task": "statistics", "dump_path": dump, "rank": [], "step": [], "level": level, "extra_info": True,
           "async_dump": False,
           "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
           "tensor": {"scope": [], "list": [], "data_mode": ["all"]}}
    with open(path, "w") as f:
        json.dump(cfg, f)


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """The runs, forked per tool from one parent that imported torch, the tool and GPT-2's modules
    (interchange_runs.run_forked): each run its own process."""
    root = tmp_path_factory.mktemp("names")
    script = root / "train.py"
    script.write_text(SCRIPT)
    gpt2 = root / "gpt2.py"
    gpt2.write_text(GPT2_SCRIPT)
    groups = {}
    for tool in ("msprobe", "nbdebug"):
        jobs = []
        for name, path, levels in (("", script, LEVELS), ("gpt2_", gpt2, ("L0", "mix"))):
            for level in levels:
                cfg = str(root / f"{tool}_{name}{level}.json")
                _config(cfg, str(root / tool / f"{name}{level}"), level)
                jobs.append([str(path), tool, cfg, os.path.join(REPO, "tests"), f"{cfg}.log"])
        groups[tool] = (TOOL_IMPORTS[tool] + ("transformers.models.gpt2.modeling_gpt2",), jobs)
    codes = run_forked(groups, cwd=root)
    for tool, (_, jobs) in groups.items():
        for job, code in zip(jobs, codes[tool], strict=True):
            with open(job[-1]) as f:
                assert code == 0, f"{tool} {job[0]} {job[2]} failed:\n{f.read()[-6000:]}"
    return root


def _data(root, tool: str, level: str, step: int) -> dict:
    (path,) = glob.glob(str(root / tool / level / f"step{step}" / "*" / "dump.json"))
    with open(path) as f:
        return json.load(f)["data"]


@pytest.mark.parametrize("step", [0, 1])
@pytest.mark.parametrize("level", LEVELS)
def test_entries_equal_msprobe(dumps, level, step):
    ours, theirs = _data(dumps, "nbdebug", level, step), _data(dumps, "msprobe", level, step)
    assert list(ours) == list(theirs)
    for key in theirs:  # and the statistics of each entry
        if key == "Functional.relu.0.backward":
            # the in-place ReLU's input gradient: msProbe's hook on an op that overwrote its input does not
            # report the gradient of the value the op read (at mix it repeats the output gradient); ours does
            # (zero where the ReLU's input was negative): only the output gradient is compared
            assert json.dumps(ours[key]["input"]) == json.dumps(theirs[key]["input"])
            continue
        assert json.dumps(ours[key]) == json.dumps(theirs[key]), key
    if level != "L0":
        assert "Functional.conv2d.0.forward" in ours and "Tensor.__rmul__.0.forward" in ours
        assert "Tensor.__rmul__.1.forward" in ours  # s * y, s a float variable
        assert not [k for k in ours if k.startswith(("Torch.tensor.", "Tensor.contiguous.", "Tensor.__getitem__."))]
    if level != "L1":
        assert "Module.fc.Linear.parameters_grad.0" in ours and "Module.conv.Conv2d.parameters_grad.0" not in ours


@pytest.mark.parametrize("step", [0, 1])
@pytest.mark.parametrize("level", ["L0", "mix"])
def test_gpt2_dump_equals_msprobe(dumps, level, step):
    """HF GPT-2 (tied ``lm_head``, ModelOutput returns, ``0.5 * x`` and ``math.sqrt(..) * (..)`` in its
    GELU): the same entries, in the same order, with the same statistics."""
    ours, theirs = _data(dumps, "nbdebug", f"gpt2_{level}", step), _data(dumps, "msprobe", f"gpt2_{level}", step)
    assert list(ours) == list(theirs)
    for key in theirs:
        assert json.dumps(ours[key]) == json.dumps(theirs[key]), key
    assert "Module.lm_head.Linear.parameters_grad.0" in ours
    assert "Module.transformer.wte.Embedding.parameters_grad.0" in ours
    assert ours["Module.transformer.GPT2Model.backward.0"]["input"]  # a ModelOutput: a real backward entry
