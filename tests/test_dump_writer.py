"""nbdebug's msProbe-format dump writer, in process: layout, JSON format, values, config filters, errors."""

from __future__ import annotations

import json
import os
import zlib

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import train_steps

import nbdebug
from nbdebug.dump import ConfigError, DumpConfig, attach_dump
from nbdebug.dump.journal import JOURNAL, Journal, read_journal, recover


def _only_dir(path: str) -> str:
    subs = os.listdir(path)
    assert len(subs) == 1, subs
    return os.path.join(path, subs[0])


def _dump(root: str, step: int, name: str = "dump.json") -> dict:
    with open(os.path.join(_only_dir(os.path.join(root, f"step{step}")), name)) as f:
        return json.load(f)


def test_layout_format_and_no_nbdebug_only_entries(net, tmp_path):
    w0 = net.fc1.weight.detach().clone()
    dbg = nbdebug.Debugger(net, level="mix")
    writer = attach_dump(dbg, str(tmp_path), task="statistics")
    train_steps(net, steps=2)  # steps end at optimizer.step()
    writer.close()
    dbg.close()
    assert sorted(os.listdir(tmp_path)) == ["step0", "step1"]
    rank_dir = _only_dir(str(tmp_path / "step0"))
    assert os.path.basename(rank_dir) == f"proc{os.getpid()}"
    assert sorted(os.listdir(rank_dir)) == ["construct.json", "dump.json", "stack.json"]  # no journal, no temp
    with open(os.path.join(rank_dir, "dump.json")) as f:
        text = f.read()
    assert text.startswith('{\n "task": "statistics",\n "level": "mix",\n "framework": "pytorch",\n'
                           ' "dump_data_dir": null,\n "data": {\n  "')
    data = json.loads(text)["data"]
    live = set(dbg.graph.nodes)
    assert {n for n in live if n.startswith(("Parameter.", "Input.", "Optimizer."))}  # the live graph has them
    assert not [n for n in data if n.startswith(("Parameter.", "Input.", "Constant.", "Optimizer."))]
    assert set(data) <= live
    n_params = len(list(net.parameters()))  # SGD updates each with Tensor.add_, counted after the model's own
    assert [n for n in data if n.startswith("Tensor.add_.") and n.endswith(".forward")] == [
        f"Tensor.add_.{i}.forward" for i in range(1 + n_params)]
    fc1 = data["Module.fc1.Linear.forward.0"]
    assert list(fc1) == ["input_args", "input_kwargs", "output", "parameters"]
    weight = fc1["parameters"]["weight"]
    assert list(weight) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]
    assert weight["type"] == "torch.Tensor" and weight["dtype"] == "torch.float32" and weight["shape"] == [16, 8]
    assert weight["Max"] == torch.max(w0).item() and weight["Min"] == torch.min(w0).item()
    assert weight["Mean"] == torch.mean(w0).item() and weight["Norm"] == torch.norm(w0).item()
    grads = data["Module.fc1.Linear.parameters_grad.0"]
    assert set(grads) == {"weight", "bias"} and grads["weight"][0]["requires_grad"] is False
    add = data["Tensor.add_.0.forward"]  # in place: its input as it was before the op
    assert add["input_args"][1] == {"type": "float", "value": 1.0}
    assert add["output"][0]["Max"] == pytest.approx(add["input_args"][0]["Max"] + 1.0)
    construct = _dump(str(tmp_path), 0, "construct.json")
    assert construct["Functional.linear.1.forward"] == "Module.block.lin.Linear.forward.0"
    assert construct["Module.block.lin.Linear.forward.1"] == "Module.block.Block.forward.0"
    assert construct["optimizer"] is None and construct["Tensor.add_.1.forward"] == "optimizer"
    stack = _dump(str(tmp_path), 0, "stack.json")
    groups = [names for names, _ in stack.values()]
    assert ["Module.block.lin.Linear.forward.0", "Module.block.lin.Linear.forward.1"] in groups
    assert not [n for names in groups for n in names if ".backward" in n or "parameters_grad" in n]
    frames = stack["0"][1]
    assert frames and all(f.startswith("File ") and ", \n " in f for f in frames)
    assert not [f for f in frames if "/nbdebug/" in f.split(",")[0]]


class Args(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        h = self.fc(x).reshape(torch.Size([2, 3]))
        h = h.to(dtype=torch.float64, device="cpu").to(torch.float32)
        h = F.pad(h, (0, 1), mode="constant", value=0.5)
        h = torch.clamp(h, min=None, max=1.0)
        idx = torch.argmax(h, dim=1)
        mask = h > 0
        d = h.double()
        first = h * 1.0
        first[0:1, ...] = 0.5  # msProbe hooks __setitem__, not __getitem__
        empty = h.narrow(1, 4, 0)
        return h.sum() + first.sum() + d.sum().float() + idx.sum() + mask.sum() + empty.sum()


def test_value_descriptions_as_msprobe(tmp_path):
    torch.manual_seed(0)
    model = Args()
    dbg = nbdebug.Debugger(model, level="L1")
    cfg = {"task": "statistics", "level": "L1", "risk_level": "ALL"}
    writer = attach_dump(dbg, str(tmp_path), config=cfg)
    model(torch.randn(2, 4)).backward()
    dbg.step()
    writer.close()
    dbg.close()
    d = _dump(str(tmp_path), 0)["data"]
    assert d["Tensor.reshape.0.forward"]["input_args"][1] == {"type": "torch.Size", "value": [2, 3]}
    assert d["Tensor.to.0.forward"]["input_kwargs"] == {"dtype": {"type": "torch.dtype", "value": "torch.float64"},
                                                        "device": {"type": "torch.device", "value": "cpu"}}
    assert d["Tensor.to.1.forward"]["input_args"][1] == {}  # a positional dtype: msProbe writes {}
    assert d["Functional.pad.0.forward"]["input_args"][1] == [{"type": "int", "value": 0}, {"type": "int", "value": 1}]
    assert d["Functional.pad.0.forward"]["input_kwargs"] == {"mode": {"type": "str", "value": "constant"},
                                                             "value": {"type": "float", "value": 0.5}}
    assert d["Torch.clamp.0.forward"]["input_kwargs"] == {"min": None, "max": {"type": "float", "value": 1.0}}
    idx = d["Torch.argmax.0.forward"]["output"][0]
    assert idx["dtype"] == "torch.int64" and isinstance(idx["Max"], int) and idx["Mean"] is None and idx["Norm"] is None
    mask = d["Tensor.gt.0.forward"]["output"][0] if "Tensor.gt.0.forward" in d else d["Tensor.__gt__.0.forward"][
        "output"][0]
    assert mask["dtype"] == "torch.bool" and mask["Max"] is True and mask["Mean"] is None
    dbl = d["Tensor.double.0.forward"]["output"][0]
    assert dbl["dtype"] == "torch.float64" and dbl["Mean"] is None and dbl["Norm"] is None and dbl["Max"] is not None
    first = d["Tensor.__setitem__.0.forward"]["input_args"][1]
    assert first == [{"type": "slice", "value": [0, 1, None]}, {"type": "ellipsis", "value": "..."}]
    scalar = d["Tensor.sum.0.forward"]["output"][0]
    assert scalar["shape"] == [] and scalar["Max"] == scalar["Min"] == scalar["Mean"] == scalar["Norm"]
    empty = d["Tensor.narrow.0.forward"]["output"][0]
    assert empty["shape"] == [2, 0] and [empty[k] for k in ("Max", "Min", "Mean", "Norm")] == [None] * 4
    assert d["Functional.linear.0.backward"]["output"][1] is None  # x needs no gradient: null, as msProbe


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x):
        h = torch.add(self.act(self.fc1(x)), 0.5)
        h.mul_(2.0)
        return self.fc2(h)


def _run(model, root, config, level="L1", steps=1, task=None):
    dbg = nbdebug.Debugger(model, level=level)
    writer = attach_dump(dbg, str(root), task=task, config=config)
    g = torch.Generator().manual_seed(1)
    xs = []
    for _ in range(steps):
        x = torch.randn(3, 4, generator=g)
        xs.append(x)
        F.mse_loss(model(x), torch.zeros(3, 2)).backward()
        dbg.step()
    writer.close()
    dbg.close()
    return xs


def test_tensor_task_files_hold_the_values(tmp_path):
    torch.manual_seed(0)
    model = Small()
    w = model.fc1.weight.detach().clone()
    (x,) = _run(model, tmp_path, {"task": "tensor", "level": "mix"}, level="mix")
    rank_dir = _only_dir(str(tmp_path / "step0"))
    data_dir = os.path.join(rank_dir, "dump_tensor_data")
    d = _dump(str(tmp_path), 0)
    assert d["dump_data_dir"] == data_dir and os.path.isabs(data_dir)
    names = []

    def walk(v):
        if isinstance(v, dict):
            if "data_name" in v:
                names.append(v["data_name"])
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(d["data"])
    assert sorted(names) == sorted(os.listdir(data_dir)) and all(n.endswith(".pt") for n in names)
    load = lambda n: torch.load(os.path.join(data_dir, n), weights_only=True)  # noqa: E731
    assert torch.equal(load("Functional.linear.0.forward.input.0.pt"), x)
    assert torch.equal(load("Module.fc1.Linear.forward.0.parameters.weight.pt"), w)
    h = torch.relu(F.linear(x, w, model.fc1.bias.detach())) + 0.5  # unchanged parameters: no optimizer here
    assert torch.equal(load("Tensor.mul_.0.forward.input.0.pt"), h)  # before the in-place op
    assert torch.equal(load("Tensor.mul_.0.forward.output.0.pt"), h * 2)
    entry = d["data"]["Tensor.mul_.0.forward"]["input_args"][0]
    assert entry["data_name"] == "Tensor.mul_.0.forward.input.0.pt" and list(entry)[-1] == "data_name"
    assert "Module.fc1.Linear.parameters_grad.0.weight.pt" in names


def test_config_step_list_and_list_filter(tmp_path):
    torch.manual_seed(0)
    _run(Small(), tmp_path, {"task": "statistics", "level": "L1", "step": ["1-2"],
                             "statistics": {"list": ["Functional.linear"]}}, steps=3)
    assert sorted(os.listdir(tmp_path)) == ["step1", "step2"]
    keys = list(_dump(str(tmp_path), 1)["data"])
    assert keys == ["Functional.linear.0.forward", "Functional.linear.1.forward", "Functional.linear.1.backward",
                    "Functional.linear.0.backward"]


def test_config_scope_range(tmp_path):
    torch.manual_seed(0)
    cfg = {"level": "L1", "statistics": {"scope": ["Functional.relu.0.forward", "Functional.linear.1.forward"]}}
    _run(Small(), tmp_path, cfg)
    assert list(_dump(str(tmp_path), 0)["data"]) == ["Functional.relu.0.forward", "Torch.add.0.forward",
                                                     "Tensor.mul_.0.forward", "Functional.linear.1.forward"]


def test_config_module_scope_at_l0(tmp_path):
    torch.manual_seed(0)
    cfg = {"level": "L0", "statistics": {"scope": ["Module.act.ReLU.forward.0", "Module.fc2.Linear.forward.0"]}}
    _run(Small(), tmp_path, cfg, level="L0")
    assert list(_dump(str(tmp_path), 0)["data"]) == ["Module.act.ReLU.forward.0", "Module.fc2.Linear.forward.0"]


@pytest.mark.parametrize("mode, fwd_keys, bwd_keys", [
    (["forward"], ["input_args", "input_kwargs", "output"], None),
    (["backward"], None, ["input", "output"]),
    (["input"], ["input_args", "input_kwargs"], ["input"]),
    (["forward", "output"], ["output"], None),
])
def test_config_data_mode(tmp_path, mode, fwd_keys, bwd_keys):
    torch.manual_seed(0)
    _run(Small(), tmp_path, {"level": "L1", "statistics": {"data_mode": mode}})
    d = _dump(str(tmp_path), 0)["data"]
    fwd = [v for k, v in d.items() if k.endswith(".forward")]
    bwd = [v for k, v in d.items() if k.endswith(".backward")]
    assert [list(v) for v in fwd] == ([fwd_keys] * len(fwd) if fwd_keys else [])
    assert [list(v) for v in bwd] == ([bwd_keys] * len(bwd) if bwd_keys else [])
    assert (len(fwd) > 0) == (fwd_keys is not None) and (len(bwd) > 0) == (bwd_keys is not None)


def test_md5_summary_mode_is_crc32_of_the_bytes(tmp_path):
    torch.manual_seed(0)
    (x,) = _run(Small(), tmp_path, {"level": "L1", "statistics": {"summary_mode": "md5"}})
    d = _dump(str(tmp_path), 0)["data"]
    first = d["Functional.linear.0.forward"]["input_args"][0]
    assert list(first) == ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad", "md5"]
    assert first["md5"] == f"{zlib.crc32(x.numpy().tobytes()):08x}"


def test_risk_level(tmp_path):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x).reshape(2, 6).transpose(0, 1).sum()

    for risk, expect in (("FOCUS", False), ("ALL", True)):
        torch.manual_seed(0)
        model = M()
        dbg = nbdebug.Debugger(model, level="L1")
        w = attach_dump(dbg, str(tmp_path / risk), config={"level": "L1", "risk_level": risk})
        model(torch.randn(3, 4)).backward()
        dbg.step()
        w.close()
        dbg.close()
        keys = list(_dump(str(tmp_path / risk), 0)["data"])
        assert ("Tensor.reshape.0.forward" in keys) is expect and ("Tensor.transpose.0.backward" in keys) is expect
        assert "Tensor.sum.0.forward" in keys and "Functional.linear.0.backward" in keys


@pytest.mark.parametrize("cfg, words", [
    ({"task": "overflow_check"}, ["task", "overflow_check", "statistics, tensor"]),
    ({"level": "L2"}, ["level", "L2"]),
    ({"step": ["3-1"]}, ["step", "3-1"]),
    ({"step": [True]}, ["step"]),
    ({"statistics": {"data_mode": ["all", "input"]}}, ["data_mode", "all"]),
    ({"statistics": {"data_mode": ["sideways"]}}, ["data_mode", "sideways"]),
    ({"statistics": {"scope": ["a"]}}, ["scope", "2 names"]),
    ({"statistics": {"summary_mode": "xor"}}, ["summary_mode", "xor"]),
    ({"statistics": {"list": ["name-regex(([)"]}}, ["list", "regex"]),
    ({"risk_level": "LOW"}, ["risk_level", "LOW"]),
    ({"extra_info": "yes"}, ["extra_info"]),
])
def test_config_errors_name_the_key(cfg, words):
    with pytest.raises(ConfigError) as e:
        DumpConfig.load(cfg)
    for w in words:
        assert w in str(e.value)


def test_config_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="config.json"):
        DumpConfig.load(str(bad))
    with pytest.raises(ConfigError, match="not found"):
        DumpConfig.load(str(tmp_path / "missing.json"))


def test_config_level_must_match_the_debugger(tmp_path):
    model = Small()
    dbg = nbdebug.Debugger(model, level="L0")
    with pytest.raises(ConfigError, match="level 'mix'"):
        attach_dump(dbg, str(tmp_path), config={"level": "mix"})
    with pytest.raises(ValueError, match="dump directory"):
        attach_dump(dbg)
    dbg.close()


def test_journal_truncated_tail_is_dropped_damaged_middle_names_the_line(tmp_path):
    j = Journal(str(tmp_path), {"task": "statistics", "level": "L1", "framework": "pytorch", "dump_data_dir": None,
                                "extra_info": True})
    for i in range(3):
        j.add({"t": "e", "n": f"Torch.exp.{i}.forward", "k": "api_f", "c": [], "d": {"output": [i]}})
    j.close(remove=False)
    path = os.path.join(str(tmp_path), JOURNAL)
    with open(path, "ab") as f:
        f.write(b'{"t":"e","n":"Torch.exp.3.for')  # the process died mid-write
    assert list(read_journal(path).data) == [f"Torch.exp.{i}.forward" for i in range(3)]
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[2] = b"garbage"
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    with pytest.raises(ValueError, match=r"line 3"):
        recover(str(tmp_path))
    os.remove(path)
    with pytest.raises(FileNotFoundError, match="nothing to recover"):
        recover(str(tmp_path))
