"""``nbdebug.PrecisionDebugger``: msProbe's API (start/stop/step/save/set_init_step/custom APIs ...)."""

from __future__ import annotations

import json
import os
import types

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import nbdebug
from nbdebug.dump.precision import PrecisionDebugger


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _rank_dir(root, step):
    subs = os.listdir(os.path.join(root, f"step{step}"))
    assert len(subs) == 1, subs
    return os.path.join(root, f"step{step}", subs[0])


def _data(root, step):
    with open(os.path.join(_rank_dir(root, step), "dump.json")) as f:
        return json.load(f)["data"]


def test_segments_like_msprobe(tmp_path):
    """start / forward / stop / backward / step: the forward and its APIs' backward are dumped; what runs
    outside start..stop (the loss, module backward, parameter gradients, the optimizer) is not."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    pd = nbdebug.PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    for _ in range(2):
        x = torch.randn(3, 4) * 2  # before start(): not dumped, not counted
        pd.start(model)
        out = model(x)
        pd.stop()
        loss = F.mse_loss(out, torch.zeros(3, 2))
        opt.zero_grad()
        loss.backward()
        opt.step()
        pd.step()
    pd.close()
    assert sorted(os.listdir(tmp_path)) == ["step0", "step1"]
    for step in (0, 1):
        assert list(_data(str(tmp_path), step)) == [
            "Functional.linear.0.forward", "Module.fc1.Linear.forward.0", "Functional.relu.0.forward",
            "Module.act.ReLU.forward.0", "Functional.linear.1.forward", "Module.fc2.Linear.forward.0",
            "Functional.linear.1.backward", "Functional.relu.0.backward", "Functional.linear.0.backward"]


def test_set_init_step_step_list_and_end(tmp_path):
    torch.manual_seed(0)
    model = Net()
    pd = PrecisionDebugger(dump_path=str(tmp_path), level="L0", step=[6, 7])
    pd.set_init_step(5)
    for _ in range(4):
        pd.start(model)
        model(torch.randn(2, 4)).sum().backward()
        pd.stop()
        pd.step()
    assert sorted(os.listdir(tmp_path)) == ["step6", "step7"]
    assert pd.finished and not pd.debugger.capture  # past the last listed step nothing is captured
    assert pd.current_step == 9
    assert list(_data(str(tmp_path), 6))[0] == "Module.fc1.Linear.forward.0"
    with pytest.raises(ValueError, match="step"):
        pd.set_init_step(-1)
    pd.close()


def test_rank_id_and_model_list(tmp_path):
    torch.manual_seed(0)
    a, b = Net(), Net()
    pd = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    pd.start([a, b], rank_id=3)
    b(a(torch.randn(2, 4)).repeat(1, 2)).sum().backward()
    pd.stop()
    pd.step()
    pd.close()
    assert os.listdir(tmp_path / "step0") == ["rank3"]
    keys = list(_data(str(tmp_path), 0))
    assert "Module.0.fc1.Linear.forward.0" in keys and "Module.1.fc2.Linear.backward.0" in keys
    cfg = tmp_path / "config.json"  # msProbe's rank list: rank 3 is not dumped, rank 1 is
    cfg.write_text(json.dumps({"task": "statistics", "level": "L0", "dump_path": str(tmp_path / "ranks"),
                               "rank": [1]}))
    for rank in (3, 1):
        other = PrecisionDebugger(config_path=str(cfg))
        other.start(a, rank_id=rank)
        a(torch.randn(2, 4)).sum().backward()
        other.stop()
        other.step()
        other.close()
    assert os.listdir(tmp_path / "ranks" / "step0") == ["rank1"]
    with pytest.raises(ValueError, match="rank_id"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L1").start(rank_id=-2)
    with pytest.raises(ValueError, match="pass the model"):
        PrecisionDebugger(dump_path=str(tmp_path), level="mix").start()


def test_l1_without_model_and_custom_api(tmp_path):
    def fused(x, w):
        return torch.tanh(x @ w) * 2

    lib = types.ModuleType("mylib")
    lib.fused = fused
    pd = PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    pd.register_custom_api(lib, "fused", "MyLib")
    assert lib.fused is not fused
    w = torch.randn(4, 3, requires_grad=True)
    for _ in range(2):
        pd.start()  # L1: no model needed
        y = lib.fused(torch.randn(2, 4), w)
        y.sum().backward()
        pd.stop()
        pd.step()
    pd.restore_custom_api(lib, "fused")
    assert lib.fused is fused
    keys = list(_data(str(tmp_path), 1))
    # the tanh and matmul inside fused are not separate entries; torch.randn is not in msProbe's support
    # list (it records no tensor creation), so it is no entry either
    assert keys == ["MyLib.fused.0.forward", "Tensor.sum.0.forward", "Tensor.sum.0.backward",
                    "MyLib.fused.0.backward"]
    entry = _data(str(tmp_path), 1)["MyLib.fused.0.forward"]
    assert entry["input_args"][1]["shape"] == [4, 3] and entry["output"][0]["Max"] <= 2.0
    pd.close()
    with pytest.raises(ValueError, match="no attribute"):
        pd.register_custom_api(lib, "missing", "MyLib")


def test_token_range(tmp_path):
    torch.manual_seed(0)
    model = Net()
    xs = [torch.full((1, 4), float(i)) for i in range(5)]
    pd = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    with torch.no_grad():
        pd.start(model, token_range=[1, 3])
        for x in xs:  # one forward call per generated token
            model(x)
        pd.stop()
        pd.step()
    pd.close()
    data = _data(str(tmp_path), 0)
    fc1 = [k for k in data if k.startswith("Module.fc1")]
    assert fc1 == ["Module.fc1.Linear.forward.0", "Module.fc1.Linear.forward.1", "Module.fc1.Linear.forward.2"]
    assert [data[k]["input_args"][0]["Max"] for k in fc1] == [1.0, 2.0, 3.0]
    with pytest.raises(ValueError, match="token_range"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L0").start(model, token_range=[3, 1])


def test_save_debug_level(tmp_path):
    pd = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", level="debug")
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    pd.start()  # nothing at level debug
    y = w * 2
    pd.save({"y": y, "pair": (y + 1, 7)}, "act")
    pd.save(y.detach(), "plain", save_backward=True)  # no gradient will come: stays null
    (y * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    pd.stop()
    pd.step()
    pd.save(y, "act")  # the next step counts from 0 again
    pd.step()
    pd.close()
    with open(os.path.join(_rank_dir(str(tmp_path), 0), "debug.json")) as f:
        dbg = json.load(f)
    assert list(dbg) == ["task", "level", "framework", "dump_data_dir", "data"] and dbg["level"] == "debug"
    d = dbg["data"]
    assert list(d) == ["act.0.debug", "act_grad.0.debug", "plain.0.debug", "plain_grad.0.debug"]
    assert d["act.0.debug"]["pair"][1] == {"type": "int", "value": 7}
    assert d["act_grad.0.debug"]["y"]["Max"] == 3.0 and d["act_grad.0.debug"]["y"]["Min"] == 1.0
    assert d["act_grad.0.debug"]["pair"] == [None, None]  # y + 1 got no gradient
    assert d["plain_grad.0.debug"] is None
    assert os.listdir(_rank_dir(str(tmp_path), 0)) == ["debug.json"]
    with open(os.path.join(_rank_dir(str(tmp_path), 1), "debug.json")) as f:
        assert list(json.load(f)["data"]) == ["act.0.debug", "act_grad.0.debug"]
    not_debug = PrecisionDebugger(dump_path=str(tmp_path / "other"), level="L1")
    not_debug.save(y, "ignored")  # msProbe ignores save() outside level debug
    assert not os.path.exists(tmp_path / "other")


def test_steps_loop_feeds_a_live_debugger(tmp_path):
    torch.manual_seed(0)
    model = Net()
    pd = PrecisionDebugger(dump_path=str(tmp_path), task="tensor", level="L1")
    batches = [torch.randn(2, 4) for _ in range(3)]
    seen = []
    for x in pd.steps(batches, model):
        seen.append(x)
        model(x).sum().backward()
    assert len(seen) == 3 and sorted(os.listdir(tmp_path)) == ["step0", "step1", "step2"]
    dbg = pd.debugger
    assert isinstance(dbg, nbdebug.Debugger) and dbg.step_index == 3
    assert "Functional.linear.0.forward" in dbg.graph.nodes
    st = dbg.stats("Functional.linear.0.forward", "input.0", step=2)
    saved = torch.load(os.path.join(_rank_dir(str(tmp_path), 2), "dump_tensor_data",
                                    "Functional.linear.0.forward.input.0.pt"), weights_only=True)
    assert torch.equal(saved, batches[2]) and st["max"] == pytest.approx(float(batches[2].max()))
    wp = dbg.watch("TL", max_gt=-1e9, nodes="Functional.linear.0.forward")
    dbg.recheck()
    assert any(h.watchpoint == wp.id for h in dbg.hits)
    from IPython.utils.capture import capture_output

    with capture_output() as cap:
        pd._ipython_display_()
    assert cap.outputs or cap.stdout  # the debugger's panel (or its text form outside a kernel)
    pd.close()
    assert dbg.closed


def test_seed_all_is_exported():
    nbdebug.seed_all(11, frameworks=("torch",))
    a = torch.rand(2)
    nbdebug.seed_all(11, frameworks=("torch",))
    assert torch.equal(a, torch.rand(2)) and np.random.get_state()[1][0] == 11
