"""A NaN that no recorded op made — a weight set to NaN between steps, a NaN in the batch — has an origin
offline too.

Live, the value's ``Parameter`` / ``Input`` node is the origin. A dump at L1 has no such node (msProbe's L1
records APIs only): the NaN first shows as an *input* of the first op that reads it, and offline
``first_nonfinite`` names that op and input slot. At L0 and mix the dump's modules list their parameters and
the offline origin is the live one. Checked on the Debugger's own dumps (statistics and tensor tasks; HF GPT-2
from a config, 2 layers, d=32, AdamW; a small CNN with SGD) and on msProbe's own dumps of a small MLP, each
against a live nbdebug session of the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
import transformers  # noqa: E402 - the numpy-2 run leaves this module out (tests/torch_only.py)

import nbdebug

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_WEIGHT = "transformer.h.0.mlp.c_fc.weight"


def _gpt2(level: str, dump_dir: str, task: str) -> nbdebug.Debugger:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 100, (2, 8))
    dbg = nbdebug.Debugger(model, level=level, dump_dir=dump_dir, task=task)
    for i in range(2):
        if i == 1:
            with torch.no_grad():
                model.get_parameter(GPT2_WEIGHT)[0, 0] = float("nan")
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return dbg


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3)
        self.fc = torch.nn.Linear(4 * 3 * 3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(h.flatten(1))


def _cnn(level: str, dump_dir: str, poison: str) -> nbdebug.Debugger:
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = torch.randn(2, 2, 1, 8, 8), torch.randint(0, 3, (2, 2))
    dbg = nbdebug.Debugger(model, level=level, dump_dir=dump_dir, task="statistics")
    for i in range(2):
        x = xs[i].clone()
        if i == 1 and poison == "weight":
            with torch.no_grad():
                model.conv.weight[0, 0, 0, 0] = float("nan")
        elif i == 1:
            x[0, 0, 0, 0] = float("nan")
        torch.nn.functional.cross_entropy(model(x), ys[i]).backward()
        opt.step()
        opt.zero_grad()
    return dbg


def _check_same_origin(dbg: nbdebug.Debugger, off, kind: str) -> tuple:
    """Live and offline name the same origin, or offline names the input slot the live origin feeds."""
    live, found = dbg.first_nonfinite(), off.first_nonfinite()
    assert dbg.first_nonfinite(step=0) is None and off.first_nonfinite(step=0) is None
    assert live is not None and live[2] == 1 and dbg.graph.nodes[live[0]].kind == kind, live
    assert found is not None and found[2] == 1, found
    assert off.first_nonfinite(step=None) == found
    if found[0] == live[0]:  # the dump has the parameter's / input's own node
        assert found == live
        return found
    node, slot, _ = found
    assert slot.startswith(("input.", "parameters.")) and off.stats(node, slot, 1)["nan_count"] > 0
    # the live origin's edge into that op carries the slot offline names (by its live name or the dump's)
    fed = [d for s, d in dbg.graph.edges.get((live[0], node), ())]
    assert fed and off.session.slot_of(node, fed[0]) == slot, (live, found, fed)
    assert dbg.stats(node, fed[0], 1)["nan_count"] == off.stats(node, slot, 1)["nan_count"]
    # and nothing the dump recorded before that op holds a NaN
    table = off.session.table(1)
    before = {n for n, _ in table.keys[:table.index[(node, slot)]]} - {node}
    assert all(off.stats(n, s, 1)["nan_count"] == 0 for n, s in table.keys if n in before)
    return found


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_nan_gpt2_weight_has_its_origin_offline(level, tmp_path):
    task = "tensor" if level == "L1" else "statistics"
    dbg = _gpt2(level, str(tmp_path), task)
    try:
        off = nbdebug.load(str(tmp_path), warn=False)
        node, slot, _ = _check_same_origin(dbg, off, "parameter")
        if level == "L1":  # no Parameter node in an L1 dump: the weight is the first op's input
            assert node.startswith("Torch.addmm.") and slot == "input.2"
            assert np.isnan(off.tensor(node, slot, 1)[0, 0]) and off.tensor(node, slot, 1).shape == (32, 128)
            assert off.first_nonfinite(benign=False) == (node, slot, 1)
        else:
            assert node == f"Parameter.{GPT2_WEIGHT}"
    finally:
        dbg.close()


@pytest.mark.parametrize("poison", ["weight", "input"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_a_nan_cnn_weight_or_batch_has_its_origin_offline(level, poison, tmp_path):
    dbg = _cnn(level, str(tmp_path), poison)
    try:
        off = nbdebug.load(str(tmp_path), warn=False)
        node, slot, _ = _check_same_origin(dbg, off, "parameter" if poison == "weight" else "input")
        first_conv = "Module.conv.Conv2d.forward.0" if level == "L0" else "Functional.conv2d.0.forward"
        if poison == "input":  # no dump has the batch's own node: the first op reading it
            assert (node, slot) == (first_conv, "input.0")
        elif level == "L1":
            assert (node, slot) == (first_conv, "input.1")
        else:
            assert node == "Parameter.conv.weight"
    finally:
        dbg.close()


_MSPROBE = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {here!r})
    import torch
    from msprobe.pytorch import PrecisionDebugger
    from msprobe_runs import _config, torch_setup, torch_train

    level, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "config.json")
    _config(cfg, "statistics", level, os.path.join(out, "dump"))
    model, batches = torch_setup("base")
    dbg, calls = PrecisionDebugger(config_path=cfg), []

    def start():
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                model.fc1.weight[0, 0] = float("nan")
        dbg.start(model)

    def stop():
        dbg.stop()
        dbg.step()

    torch_train(model, batches, 2, "base", start, stop)
""")


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_an_msprobe_dump_with_a_nan_weight_has_its_origin(level, tmp_path):
    """msProbe's own dump of the same run as a live nbdebug session: the same answer as nbdebug's dump."""
    from msprobe_runs import torch_setup, torch_train

    out = str(tmp_path / "msprobe")
    proc = subprocess.run([sys.executable, "-c", _MSPROBE.format(here=HERE), level, out], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    off = nbdebug.load(os.path.join(out, "dump"), warn=False)

    model, batches = torch_setup("base")
    dbg, calls = nbdebug.Debugger(model, level=level), []

    def start():
        calls.append(1)
        if len(calls) == 2:
            with torch.no_grad():
                model.fc1.weight[0, 0] = float("nan")

    try:
        torch_train(model, batches, 2, "base", start, lambda: None)
        node, slot, _ = _check_same_origin(dbg, off, "parameter")
        if level == "L1":
            assert (node, slot) == ("Functional.linear.0.forward", "input.1")
        else:
            assert node == "Parameter.fc1.weight"
    finally:
        dbg.close()
