"""Where nbdebug's dump and msProbe's differ on the zoo (issue 26), each difference decided on a tiny model.

The same script runs under real msProbe's ``PrecisionDebugger``, under ``nbdebug.Debugger`` and (for the
summation order) with no tool at all, each in its own subprocess:

* ``s = 0; s += t`` (T5's loss/bias sums): Python runs ``t.__radd__(0)`` — no in-place op — and msProbe
  records ``Tensor.__radd__``; so do we (we named it ``Tensor.__iadd__`` from the bytecode's ``+=``).
* a function bound before the debugger starts (HF's ``GELUActivation`` keeps ``nn.functional.gelu`` as an
  attribute made at construction) when the model is built before msProbe's ``PrecisionDebugger``: msProbe
  patches ``torch.nn.functional.gelu`` when it is made and never sees the call; the model ran it, and we
  record it (``Functional.gelu.*``, forward and backward). The other entries are the same. Made first, as
  msProbe's documentation does, msProbe records it as we do.
* a module whose output is overwritten in place (BatchNorm2d then ``ReLU(inplace=True)``): msProbe's full
  backward hook does not fire; BatchNorm's backward ran, and our entry's ``input.0`` is the gradient the
  ReLU's backward handed it (msProbe's in-place ReLU backward repeats its output gradient as its input's).
* msProbe's full backward hooks put ``BackwardHookFunction`` nodes into the graph: autograd sums a
  tensor's gradient shares in another order, so its run is not bitwise the plain run; ours is.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from interchange_runs import WRITE_CONFIG, run_scripts, step_data

pytestmark = pytest.mark.slow  # its set-up: nine training runs in subprocesses (~65 s on 2 cores)

SCRIPT = r'''
import json, os, sys
import torch, torch.nn as nn, torch.nn.functional as F

tool, case, level, out = sys.argv[1:5]
torch.manual_seed(0)
torch.set_num_threads(1)
''' + WRITE_CONFIG + r'''early = case == "bound_early"  # msProbe's documented order: its debugger made before the model
if early:
    from msprobe.pytorch import PrecisionDebugger
    case, dbg = "bound", PrecisionDebugger(config_path=cfg)


class Radd(nn.Module):  # s = 0; s += t  (T5's sums start from a Python 0)
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        s = 0
        s += h
        w = h * 2
        w += 1  # a real in-place add: Tensor.__iadd__
        return s + w


class Bound(nn.Module):  # HF's GELUActivation: the function object is kept at construction
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = F.gelu

    def forward(self, x):
        return self.fc(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x):
        return self.a(x) + self.b(x) + x


class Order(nn.Module):  # a tensor with several consumers: its gradient is a sum of shares
    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(8, 16)
        self.blocks = nn.Sequential(*[Block() for _ in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        h = self.emb(x)
        return self.head(self.blocks(h) + h)


class BnRelu(nn.Module):  # ResNet's stem: BatchNorm's output overwritten by ReLU(inplace=True)
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x))).mean((2, 3))


model = {"radd": Radd, "bound": Bound, "order": Order, "bn": BnRelu}[case]()
xs = [torch.randn(4, 2, 5, 5) if case == "bn" else torch.randn(32, 8) for _ in range(2)]
ys = [torch.randn(4 if case == "bn" else 32, {"order": 4, "bn": 4}.get(case, 8)) for _ in range(2)]
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if tool == "msprobe" and not early:
    from msprobe.pytorch import PrecisionDebugger
    dbg = PrecisionDebugger(config_path=cfg)
elif tool == "nbdebug":
    import nbdebug
    dbg = nbdebug.Debugger(model, level, dump_dir=os.path.join(out, "dump"), task="statistics", config=cfg)
grads = []
for x, y in zip(xs, ys):
    if tool == "msprobe":
        dbg.start(model)
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    opt.step()
    if tool == "msprobe":
        dbg.stop()
        dbg.step()
if tool == "nbdebug":
    dbg.close()
torch.save(grads, os.path.join(out, "grads.pt"))
'''

RUNS = [("msprobe", "radd", "L1"), ("nbdebug", "radd", "L1"), ("msprobe", "bound", "mix"),
        ("nbdebug", "bound", "mix"), ("plain", "order", "L0"), ("msprobe", "order", "L0"),
        ("nbdebug", "order", "L0"), ("msprobe", "bn", "mix"), ("nbdebug", "bn", "mix"),
        ("msprobe", "bound_early", "mix")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_scripts(tmp_path_factory.mktemp("interchange"), SCRIPT, RUNS)


@pytest.mark.parametrize("step", [0, 1])
def test_augmented_assign_on_a_python_number_is_radd(runs, step):
    ours = step_data(runs[("nbdebug", "radd", "L1")], step)
    theirs = step_data(runs[("msprobe", "radd", "L1")], step)
    assert list(ours) == list(theirs)
    assert "Tensor.__radd__.0.forward" in ours and "Tensor.__iadd__.0.forward" in ours
    assert "Tensor.__iadd__.1.forward" not in ours  # only ``w += 1`` wrote in place
    assert json.dumps(ours["Tensor.__radd__.0.forward"]) == json.dumps(theirs["Tensor.__radd__.0.forward"])


@pytest.mark.parametrize("step", [0, 1])
def test_function_bound_before_start_msprobe_misses_it(runs, step):
    ours = step_data(runs[("nbdebug", "bound", "mix")], step)
    theirs = step_data(runs[("msprobe", "bound", "mix")], step)
    gelu = [k for k in ours if k.startswith("Functional.gelu.")]
    assert gelu == ["Functional.gelu.0.forward", "Functional.gelu.0.backward"]
    assert not [k for k in theirs if "gelu" in k]
    assert [k for k in ours if k not in gelu] == list(theirs)
    # the model did run gelu: its output is not its input (msProbe's next entry reads gelu's output)
    fwd = ours["Functional.gelu.0.forward"]
    assert fwd["input_args"][0]["Min"] < 0 <= fwd["output"][0]["Min"] + 0.2
    assert fwd["output"][0]["Norm"] == theirs["Functional.linear.1.forward"]["input_args"][0]["Norm"]


@pytest.mark.parametrize("step", [0, 1])
def test_msprobe_made_before_the_model_as_documented_records_the_bound_function_as_we_do(runs, step):
    """msProbe's documentation makes its ``PrecisionDebugger`` before the model is defined: its API hooks are
    in place when the model keeps ``F.gelu``, and its dump then has the same entries as ours, gelu's with
    the same statistics (the difference above comes only from building the model first)."""
    ours = step_data(runs[("nbdebug", "bound", "mix")], step)
    theirs = step_data(runs[("msprobe", "bound_early", "mix")], step)
    assert list(ours) == list(theirs)
    for entry in ("Functional.gelu.0.forward", "Functional.gelu.0.backward"):
        assert json.dumps(ours[entry]) == json.dumps(theirs[entry])


def test_msprobe_hooks_change_gradient_summation_order_ours_do_not(runs):
    plain = torch.load(os.path.join(runs[("plain", "order", "L0")], "grads.pt"))
    theirs = torch.load(os.path.join(runs[("msprobe", "order", "L0")], "grads.pt"))
    ours = torch.load(os.path.join(runs[("nbdebug", "order", "L0")], "grads.pt"))
    for s in range(2):
        assert all(torch.equal(plain[s][k], ours[s][k]) for k in plain[s])  # bitwise the plain run
    differ = [(s, k) for s in range(2) for k in plain[s] if not torch.equal(plain[s][k], theirs[s][k])]
    assert (0, "emb.weight") in differ  # h's gradient: the skip's and the blocks' shares, summed otherwise
    for s, k in differ:  # ... in the last bits only
        torch.testing.assert_close(theirs[s][k], plain[s][k], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("step", [0, 1])
def test_module_overwritten_in_place_msprobe_misses_its_backward(runs, step):
    ours = step_data(runs[("nbdebug", "bn", "mix")], step)
    theirs = step_data(runs[("msprobe", "bn", "mix")], step)
    assert [k for k in ours if k not in theirs] == ["Module.bn.BatchNorm2d.backward.0"]
    assert [k for k in theirs if k not in ours] == []
    bn, relu = ours["Module.bn.BatchNorm2d.backward.0"], ours["Functional.relu.0.backward"]
    assert bn["input"][0] == relu["output"][0]  # what reached BatchNorm's backward: the ReLU's input gradient
    assert bn["output"][0] == ours["Module.conv.Conv2d.backward.0"]["input"][0]
    assert relu["output"][0] != relu["input"][0]  # zero where BatchNorm's output was negative
    theirs_relu = theirs["Functional.relu.0.backward"]
    assert theirs_relu["output"][0] == theirs_relu["input"][0]  # msProbe repeats the output gradient
    assert theirs["Module.bn.BatchNorm2d.parameters_grad.0"] == ours["Module.bn.BatchNorm2d.parameters_grad.0"]
