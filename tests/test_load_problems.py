"""Damaged and unusual dumps: load what is valid, name every problem's file, never a bare traceback; the
other layouts (a folder of .npy files, MindSpore kernel dumps) and progress reporting."""

import json
import os
import warnings

import numpy as np
import pytest

import nbdebug
from nbdebug.dump.load import detect_layout


def T(name=None, shape=(2, 3), mx=1.0, mn=-1.0, mean=0.0, norm=2.0):
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": list(shape), "Max": mx, "Min": mn,
         "Mean": mean, "Norm": norm, "requires_grad": False}
    if name:
        t["data_name"] = name
    return t


def tensor_dump(root, n=4, step=0):
    """A tensor-task dump of ``n`` chained ops with .npy files (as msProbe MindSpore writes them)."""
    d = os.path.join(root, f"step{step}", "rank0")
    data_dir = os.path.join(d, "dump_tensor_data")
    os.makedirs(data_dir, exist_ok=True)
    rng = np.random.default_rng(step)
    data = {}
    prev = rng.standard_normal((2, 3)).astype(np.float32)
    for k in range(n):
        name = f"Functional.op{k}.0.forward"
        out = (prev * 2 + k).astype(np.float32)
        entry = {"input_args": [], "input_kwargs": {}, "output": []}
        for slot, arr, key in (("input.0", prev, "input_args"), ("output.0", out, "output")):
            fname = f"{name}.{slot}.npy"
            np.save(os.path.join(data_dir, fname), arr)
            entry[key].append(T(fname, arr.shape, float(arr.max()), float(arr.min()), float(arr.mean()),
                                float(np.linalg.norm(arr))))
        data[name] = entry
        prev = out
    path = os.path.join(d, "dump.json")
    with open(path, "w") as f:
        json.dump({"task": "tensor", "level": "L1", "framework": "mindspore", "dump_data_dir": data_dir,
                   "data": data}, f, indent=1)
    return path, data_dir


def test_clean_tensor_dump_loads_without_problems(tmp_path):
    tensor_dump(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        off = nbdebug.load(tmp_path)
    assert off.problems == [] and len(off.graph) == 4
    assert ("Functional.op0.0.forward", "Functional.op1.0.forward") in off.graph.edges
    s = off.stats("Functional.op3.0.forward", "output.0", 0)
    value = off.tensor("Functional.op3.0.forward", "output.0")
    assert s["unknown"] == () and s["zero_count"] == int((value == 0).sum())


def test_truncated_dump_json_keeps_the_complete_entries(tmp_path):
    path, _ = tensor_dump(tmp_path, n=4)
    text = open(path).read()
    cut = text.index('"Functional.op3.0.forward"') + 60  # in the middle of the last entry
    with open(path, "w") as f:
        f.write(text[:cut])
    with pytest.warns(UserWarning, match="dump.json"):
        off = nbdebug.load(tmp_path)
    assert sorted(off.graph.nodes) == [f"Functional.op{k}.0.forward" for k in range(3)]
    (p,) = off.problems
    assert p.file.endswith("step0/rank0/dump.json") and "loaded the 3 complete entries" in p.message
    assert off.session.framework == "mindspore"


def test_missing_and_wrong_tensor_files_are_reported_by_name(tmp_path):
    _, data_dir = tensor_dump(tmp_path, n=3)
    os.remove(os.path.join(data_dir, "Functional.op1.0.forward.output.0.npy"))
    np.save(os.path.join(data_dir, "Functional.op2.0.forward.output.0.npy"), np.zeros((5,), np.float32))
    with open(os.path.join(data_dir, "Functional.op0.0.forward.output.0.npy"), "wb") as f:
        f.write(b"\x93NUMPY garbage")
    with pytest.warns(UserWarning) as rec:
        off = nbdebug.load(tmp_path)
    assert "problem" in str(rec[0].message)
    files = {os.path.basename(p.file): p.message for p in off.problems}
    assert "missing" in files["Functional.op1.0.forward.output.0.npy"]
    assert "shape (5,)" in files["Functional.op2.0.forward.output.0.npy"]
    assert "not a readable .npy" in files["Functional.op0.0.forward.output.0.npy"]
    # statistics stay; values say why they are not there
    assert off.stats("Functional.op1.0.forward", "output.0", 0)["max"] is not None
    for node in ("Functional.op0.0.forward", "Functional.op1.0.forward", "Functional.op2.0.forward"):
        with pytest.raises(nbdebug.NotRetainedError):
            off.tensor(node, "output.0", 0)
    assert off.tensor("Functional.op1.0.forward", "input.0", 0).shape == (2, 3)  # the valid ones load


def test_lazy_loading_reports_a_bad_file_when_it_is_read(tmp_path):
    _, data_dir = tensor_dump(tmp_path, n=2)
    np.save(os.path.join(data_dir, "Functional.op1.0.forward.output.0.npy"), np.zeros((7,), np.float32))
    off = nbdebug.load(tmp_path, exact=False)
    assert off.problems == []
    assert "zero_count" in off.stats("Functional.op1.0.forward", "output.0")["unknown"]  # statistics only
    with pytest.raises(nbdebug.NotRetainedError, match="shape"):
        off.tensor("Functional.op1.0.forward", "output.0")
    assert [os.path.basename(p.file) for p in off.problems] == ["Functional.op1.0.forward.output.0.npy"]


def test_bad_side_files_and_entries(tmp_path):
    path, _ = tensor_dump(tmp_path, n=2)
    d = os.path.dirname(path)
    with open(os.path.join(d, "construct.json"), "w") as f:
        f.write("{not json")
    with open(os.path.join(d, "stack.json"), "w") as f:
        f.write("[1, 2")
    doc = json.load(open(path))
    doc["data"]["Functional.bad.0.forward"] = "oops"
    doc["data"]["Functional.op1.0.forward"]["output"][0]["shape"] = "2x3"
    json.dump(doc, open(path, "w"))
    os.makedirs(tmp_path / "step1" / "rank0")  # a step folder without dump.json
    with pytest.warns(UserWarning):
        off = nbdebug.load(tmp_path)
    msgs = [str(p) for p in off.problems]
    assert any("construct.json" in m and "invalid JSON" in m for m in msgs)
    assert any("stack.json" in m for m in msgs)
    assert any("'Functional.bad.0.forward' is not an object" in m for m in msgs)
    assert any("bad shape '2x3'" in m for m in msgs)
    assert any("step1/rank0/dump.json" in m and "missing" in m for m in msgs)
    assert off.steps == [0] and "Functional.op0.0.forward" in off.graph


def test_not_a_dump(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        nbdebug.load(tmp_path / "nothing")
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(ValueError, match="no dump found"):
        nbdebug.load(tmp_path)


def test_npy_folder_troubleshooter_style(tmp_path):
    np.save(tmp_path / "0_conv1.npy", np.ones((2, 2), np.float32))
    np.save(tmp_path / "1_relu.npy", np.array([0.0, np.nan], np.float32))
    np.save(tmp_path / "10_fc.npy", np.arange(3.0))
    np.save(tmp_path / "2_pool.npy", np.zeros(3, np.float32))
    assert detect_layout(str(tmp_path)) == "npy"
    off = nbdebug.load(tmp_path)
    assert [n.name for n in off.graph.in_order()] == ["0_conv1", "1_relu", "2_pool", "10_fc"]
    assert off.stats("1_relu", "output.0")["nan_count"] == 1
    assert off.stats("2_pool", "output.0")["zero_count"] == 3
    assert off.first_nonfinite() == ("1_relu", "output.0", 0)
    off.watch("TZ")
    assert [h.node for h in off.hits] == ["2_pool"]
    np.testing.assert_array_equal(off.tensor("10_fc", "output.0"), np.arange(3.0))


def test_kernel_dump_layout_is_detected(tmp_path):
    os.makedirs(tmp_path / "rank_0" / "Net" / "0" / "0")
    os.makedirs(tmp_path / "rank_0" / "graphs")
    os.makedirs(tmp_path / "rank_0" / "execution_order")
    assert detect_layout(str(tmp_path)) == "kernel"
    assert detect_layout(str(tmp_path / "rank_0")) == "kernel"


def test_progress_callback(tmp_path):
    for step in range(3):
        tensor_dump(tmp_path, n=2, step=step)
    seen = []
    off = nbdebug.load(tmp_path, progress=lambda done, total, what: seen.append((done, total, what)))
    assert off.steps == [0, 1, 2]
    assert seen[0][:2] == (0, 3) and seen[-1][0] == seen[-1][1]
    assert any("steps" in w for _, _, w in seen)


def test_ranks(tmp_path):
    for rank, mx in ((0, 1.0), (1, 5.0)):
        d = tmp_path / "step0" / f"rank{rank}"
        d.mkdir(parents=True)
        t = T(mx=mx)
        (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                 "data": {"Functional.relu.0.forward": {"input_args": [t],
                                                                                        "output": [t]}}}))
    off = nbdebug.load(tmp_path)
    assert off.meta["ranks"] == ["rank0", "rank1"] and off.meta["rank"] == "rank0"
    assert off.stats("Functional.relu.0.forward", "output.0")["max"] == 1.0
    assert nbdebug.load(tmp_path, rank=1).stats("Functional.relu.0.forward", "output.0")["max"] == 5.0
    with pytest.warns(UserWarning, match="no rank7"):
        assert nbdebug.load(tmp_path, rank=7).steps == []


def test_statistics_absent_from_the_dump_are_unknown_not_nan(tmp_path):
    # summary_mode "xor" writes only a checksum: nothing is known about the values
    d = tmp_path / "step0" / "rank0"
    d.mkdir(parents=True)
    t = {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [4], "md5": "0x00000000deadbeef"}
    i = {"type": "torch.Tensor", "dtype": "torch.int64", "shape": [4], "Max": 3, "Min": 0, "Mean": None, "Norm": None}
    (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                             "data": {"Torch.sum.0.forward": {"input_args": [i], "output": [t]}}}))
    off = nbdebug.load(tmp_path)
    s = off.stats("Torch.sum.0.forward", "output.0")
    assert s["max"] is None and "max" in s["unknown"]
    assert s["nan_count"] is None and "nan_count" in s["unknown"] and s["estimated"] == ()
    off.watch("TO")
    assert off.hits == []  # nothing known, nothing fires
    s = off.stats("Torch.sum.0.forward", "input.0")  # int tensor: Mean/Norm not recorded by msProbe
    assert (s["max"], s["min"], s["nan_count"]) == (3.0, 0.0, 0) and s["mean"] is None and "mean" in s["unknown"]
