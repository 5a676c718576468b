"""Dumps written by the real mindstudio-probe (PyTorch and MindSpore) load into offline sessions with
identical statistics, a graph, lazy tensors, and watchpoints/recheck/first_nonfinite that work on them."""

import glob
import json
import os

import numpy as np
import pytest
import torch
from msprobe_runs import mindspore_dump, torch_dump

import nbdebug
from nbdebug.dump.load import entry_slots, normalize_dtype
from nbdebug.offline import DumpSession, OfflineSession


def _dump_json(root: str, step: int) -> dict:
    (path,) = glob.glob(os.path.join(root, "dump", f"step{step}", "*", "dump.json"))
    with open(path) as f:
        return json.load(f)


def _check_identical_statistics(off: OfflineSession, root: str, steps: list[int]) -> int:
    n = 0
    for step in steps:
        doc = _dump_json(root, step)
        for name, entry in doc["data"].items():
            for slot, t in entry_slots(entry):
                s = off.stats(name, slot, step)
                assert s["shape"] == tuple(t["shape"]), (name, slot)
                assert s["dtype"] == normalize_dtype(t["dtype"])
                for ours, theirs in (("max", "Max"), ("min", "Min"), ("mean", "Mean"), ("norm", "Norm")):
                    want = t[theirs]
                    if want is None:
                        assert s[ours] is None or ours in s["unknown"], (name, slot, ours)
                    else:
                        assert s[ours] == float(want), (name, slot, ours, s[ours], want)
                n += 1
    return n


def test_torch_statistics_dump_loads_with_identical_statistics():
    root = torch_dump("statistics", "mix")
    off = nbdebug.load(os.path.join(root, "dump"))
    assert isinstance(off.session, DumpSession) and off.session.live is False
    assert off.steps == [0, 1] and off.problems == []
    assert off.session.framework == "pytorch"
    n = _check_identical_statistics(off, root, [0, 1])
    assert n > 80
    # msProbe records no abs_mean / zero counts: inferred where decided, else unknown
    s = off.stats("Functional.relu.0.forward", "output.0", 0)
    assert s["min"] == 0.0 and s["abs_mean"] == s["mean"]  # relu output is >= 0
    assert s["nan_count"] == 0 and s["pos_inf_count"] == 0
    s = off.stats("Functional.linear.0.forward", "output.0", 0)
    assert s["abs_mean"] is None and "abs_mean" in s["unknown"] and s["zero_count"] is None
    with pytest.raises(nbdebug.NotRetainedError, match="statistics only"):
        off.tensor("Functional.linear.0.forward", "output.0", 0)


def test_graph_from_construct_stack_and_inferred_data_flow():
    off = nbdebug.load(os.path.join(torch_dump("statistics", "mix"), "dump"))
    g = off.graph
    # scopes from construct.json, sections, pairs, stacks
    assert g["Functional.linear.1.forward"].scope == "block/lin"
    assert g["Module.block.lin.Linear.forward.0"].scope == "block"
    assert g["Module.fc1.Linear.parameters_grad.0"].section == "backward"
    assert g["Functional.linear.0.backward"].pair == "Functional.linear.0.forward"
    opt = [n for n in g if n.section == "optimizer"]
    assert opt and all(n.name.startswith("Tensor.add_") for n in opt)
    assert any("msprobe_runs.py" in f for f in g["Module.fc1.Linear.forward.0"].stack)
    # parameters listed by modules are nodes, feeding the ops that use them
    assert g["Parameter.fc1.weight"].kind == "parameter"
    assert ("Parameter.fc1.weight", "Functional.linear.0.forward") in g.edges
    # data flow inferred from identical statistics: fc1 -> relu -> lin (twice) -> add -> fc2 -> loss
    assert g.edges[("Functional.linear.0.forward", "Functional.relu.0.forward")] == [("output.0", "input.0")]
    assert ("Functional.linear.1.forward", "Functional.linear.2.forward") in g.edges
    assert ("Functional.linear.3.forward", "Functional.mse_loss.0.forward") in g.edges
    # the optimizer's update reads the parameter gradient
    assert any(src == "Module.fc1.Linear.parameters_grad.0" and g[dst].section == "optimizer"
               for src, dst in g.edges)
    assert "Functional.linear.0.forward" in {n for n in g.predecessors("Functional.relu.0.forward")}


def test_torch_tensor_dump_values_and_exact_statistics():
    root = torch_dump("tensor", "mix")
    off = nbdebug.load(os.path.join(root, "dump"))
    assert off.problems == []
    _check_identical_statistics(off, root, [0, 1])
    doc = _dump_json(root, 0)
    data_dir = doc["dump_data_dir"]
    t = doc["data"]["Functional.linear.0.forward"]["output"][0]
    want = torch.load(os.path.join(data_dir, t["data_name"])).numpy()
    got = off.tensor("Functional.linear.0.forward", "output.0", 0)
    np.testing.assert_array_equal(got, want)
    s = off.stats("Functional.linear.0.forward", "output.0", 0)
    assert s["abs_mean"] == pytest.approx(float(np.abs(want.astype(np.float64)).mean()))
    assert s["zero_count"] == int((want == 0).sum()) and s["unknown"] == () and s["estimated"] == ()
    # a parameter node reads the file of the module entry that listed it; "initial" is the first step's
    w0 = off.tensor("Parameter.fc1.weight", "output.0", "initial")
    np.testing.assert_array_equal(w0, off.tensor("Module.fc1.Linear.forward.0", "parameters.weight", 0))
    assert not np.array_equal(w0, off.tensor("Parameter.fc1.weight", "output.0", 1))  # SGD changed it


def test_watchpoints_recheck_on_a_tensor_dump():
    off = nbdebug.load(os.path.join(torch_dump("tensor", "mix"), "dump"))
    wp = off.watch("WCS", abs_mean_update_ratio_lt=10.0)  # every update is "too small" by this threshold
    hits = [h for h in off.hits if h.watchpoint == wp.id]
    assert {h.node for h in hits} == {n.name for n in off.graph if n.kind == "parameter" and n.section == "forward"}
    assert all(h.step == 1 for h in hits if h.hits)  # step 0 has no previous step
    assert not [h for h in hits if h.step == 0]  # nor a "could not check" notice for it
    off.update_watch(wp, abs_mean_update_ratio_lt=1e-12)
    assert not [h for h in off.hits if h.watchpoint == wp.id and h.hits]
    gl = off.watch("GL", max_gt=0.0)
    assert any(h.node.endswith("parameters_grad.0") for h in off.hits if h.watchpoint == gl.id)
    off.unwatch()
    assert off.hits == [] and off.recheck() == []


def test_overflow_dump_first_nonfinite_and_TO():
    off = nbdebug.load(os.path.join(torch_dump("statistics", "L1", "inf"), "dump"))
    assert off.problems == []
    assert off.first_nonfinite(0) is None
    node, slot, step = off.first_nonfinite(None)
    assert (node, slot, step) == ("Tensor.__mul__.1.forward", "output.0", 1)
    s = off.stats(node, slot, step)
    assert s["max"] == float("inf") and s["pos_inf_count"] >= 1 and "pos_inf_count" in s["estimated"]
    off.watch("TO")
    assert off.hits and off.hits[0].node == node and off.hits[0].step == 1
    assert all(h.step == 1 for h in off.hits)


def test_mindspore_dump_loads_with_identical_statistics():
    root = mindspore_dump("tensor", "L0", "port")
    off = nbdebug.load(os.path.join(root, "dump"))
    assert off.problems == [] and off.session.framework == "mindspore"
    assert _check_identical_statistics(off, root, [0]) > 15
    g = off.graph
    assert g["Cell.fc1.Dense.forward.0"].kind == "module" and g["Cell.fc1.Dense.forward.0"].op_type == "Dense"
    assert ("Cell.fc1.Dense.forward.0", "Cell.act.ReLU.forward.0") in g.edges
    a = off.tensor("Cell.fc1.Dense.forward.0", "parameters.weight", 0)
    assert isinstance(a, np.memmap) and a.shape == (16, 8)  # .npy files are memory-mapped


def test_dump_root_step_and_rank_folders_and_json_file_all_load():
    root = os.path.join(torch_dump("statistics", "mix"), "dump")
    (rank,) = glob.glob(os.path.join(root, "step1", "*"))
    for path, steps in ((root, [0, 1]), (os.path.join(root, "step1"), [1]), (rank, [1]),
                        (os.path.join(rank, "dump.json"), [1])):
        off = nbdebug.load(path)
        assert off.steps == steps, path
    assert nbdebug.load(root, steps=[1]).steps == [1]
    off = nbdebug.load(root)
    off.goto(0)
    assert off.current_step == 0
    with pytest.raises(AttributeError, match="no step in progress.*current_step"):
        off.step_index  # noqa: B018 - a dump has no step in progress
    assert off.stats("Functional.linear.0.forward", "output.0") == off.stats("Functional.linear.0.forward",
                                                                              "output.0", 0)
