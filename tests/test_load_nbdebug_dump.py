"""nbdebug's own dumps (the dump writer on a live Debugger) load offline like msProbe's, and agree with
the real msProbe dump of the same model and data."""

import glob
import json
import os

import numpy as np
from msprobe_runs import torch_dump, torch_setup, torch_train

import nbdebug
from nbdebug.dump import attach_dump
from nbdebug.dump.load import entry_slots


def _write(tmp_path, task):
    model, batches = torch_setup("base")
    dbg = nbdebug.Debugger(model, level="mix")
    writer = attach_dump(dbg, str(tmp_path), task=task)
    torch_train(model, batches, 2, "base", lambda: None, dbg.step)
    writer.close()
    dbg.close()
    return str(tmp_path)


def test_nbdebug_tensor_dump_loads(tmp_path):
    root = _write(tmp_path, "tensor")
    off = nbdebug.load(root)
    assert off.problems == [] and off.steps == [0, 1] and off.session.framework == "pytorch"
    for step in (0, 1):
        (path,) = glob.glob(os.path.join(root, f"step{step}", "*", "dump.json"))
        doc = json.load(open(path))
        for name, entry in doc["data"].items():
            for slot, t in entry_slots(entry):
                s = off.stats(name, slot, step)
                assert (s["max"], s["min"]) == (t["Max"], t["Min"]) and s["shape"] == tuple(t["shape"])
                if "data_name" in t:
                    value = off.tensor(name, slot, step)
                    assert value.shape == tuple(t["shape"])
                    assert float(np.max(value)) == t["Max"]
    assert off.graph["Functional.linear.1.forward"].scope == "block/lin"
    assert ("Functional.linear.0.forward", "Functional.relu.0.forward") in off.graph.edges
    assert {n.section for n in off.graph} == {"forward", "backward", "optimizer"}


def test_nbdebug_dump_agrees_with_msprobe_forward(tmp_path):
    ours = _write(tmp_path, "statistics")
    theirs = os.path.join(torch_dump("statistics", "mix"), "dump")
    for step in (0, 1):
        res = nbdebug.compare(ours, theirs, step=step)
        fwd = [r for r in res.matched if res.target.graph[r.target].section == "forward"]
        assert len(fwd) >= 40
        assert all(r.status == "pass" for r in fwd), [(r.name, r.messages) for r in fwd if r.status != "pass"]
        for r in fwd:
            assert r.stat_rel_pct[3] < 1e-4  # Norm within float rounding of msProbe's
