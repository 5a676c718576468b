"""Our MindSpore PyNative dump next to real msProbe's, same model, weights and batch (issue #11 item 11).

msProbe runs in a subprocess (``tests/msprobe_runs.py``; on this CPU build its statistics need
``ops.norm`` in place of ``mint.norm``, see there). A Primitive's backward entry holds the gradients of
its inputs in the order they arrive, a trainable Parameter's included (``Primitive.matmul.MatMul.0.backward``
``output.0`` is the weight's gradient): ours must have the same slots, shapes and statistics. msProbe's own
``msprobe compare`` of the two dumps (its MindSpore compare), each way round, pairs every row and passes it.
"""

from __future__ import annotations

import csv
import glob
import json
import os

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from msprobe_runs import _port_arrays, mindspore_dump, msprobe_compare

import nbdebug

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # msProbe and nbdebug dumps, msProbe's compare


class PortNet(nn.Cell):  # msprobe_runs' PortNet ("port" variant)
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(self.act(self.fc1(x)))


def dump_ours(level: str, out: str, task: str = "statistics") -> str:
    """Our dump of msprobe_runs' first PortNet step; returns its step folder."""
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        net = PortNet()
        w, xs, ys = _port_arrays()
        for name, p in net.parameters_and_names():
            p.set_data(ms.Tensor(w[name]))
        opt = nn.SGD(net.trainable_params(), learning_rate=0.01)
        loss_fn = nn.MSELoss()
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, opt.parameters)
        pd = nbdebug.PrecisionDebugger(dump_path=out, task=task, level=level)
        pd.start(net)
        _loss, grads = grad_fn(ms.Tensor(xs[0]), ms.Tensor(ys[0]))
        opt(grads)
        pd.stop()
        pd.step()
        pd.close()
    finally:
        ms.set_context(mode=mode)
    return os.path.join(out, "step0")


def ours(level: str, out: str) -> dict:
    (path,) = glob.glob(os.path.join(dump_ours(level, out), "*", "dump.json"))
    with open(path) as f:
        return json.load(f)["data"]


def theirs(level: str) -> dict:
    (path,) = glob.glob(os.path.join(mindspore_dump("statistics", level, "port"), "dump", "step0", "*", "dump.json"))
    with open(path) as f:
        return json.load(f)["data"]


def _slots(entry: dict, key: str) -> list[tuple]:
    return [(tuple(x["shape"]), x["dtype"], *(round(float(x[s]), 5) for s in ("Max", "Min", "Norm")))
            for x in entry.get(key) or [] if isinstance(x, dict)]


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_primitive_backward_entries_equal_msprobe(level, tmp_path):
    got, want = ours(level, str(tmp_path)), theirs(level)
    prims = sorted(k for k in want if k.startswith("Primitive.") and k.endswith(".backward"))
    assert {"Primitive.matmul.MatMul.0.backward", "Primitive.bias_add.BiasAdd.0.backward"} <= set(prims)
    for name in prims:
        assert name in got, name
        for key in ("input", "output"):
            assert _slots(got[name], key) == _slots(want[name], key), (name, key)
    # the weight's gradient is output.0 of the first MatMul's backward (x is data: no gradient)
    (wgrad,) = _slots(got["Primitive.matmul.MatMul.0.backward"], "output")
    assert wgrad[0] == (16, 8)
    assert np.isfinite(wgrad[4])
    # forward entries of the Primitives, ``Shape`` included (its output is plain ints)
    fwd = [k for k in got if k.startswith("Primitive.") and k.endswith(".forward")]
    assert len(fwd) == 7 and "Primitive.shape_op.Shape.1.forward" in fwd
    for name in fwd:
        for key in ("input_args", "output"):
            assert _entries(got[name], key) == _entries(want[name], key), (name, key)


def _entries(entry: dict, key: str) -> list:
    """Tensors as (shape, dtype, Max, Min, Norm) rounded; plain values (a Shape's ints, None) as they are."""
    return [(tuple(x["shape"]), x["dtype"], *(round(float(x[s]), 5) for s in ("Max", "Min", "Norm")))
            if isinstance(x, dict) and "Max" in x else x for x in entry.get(key) or []]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_dump_entries_equal_msprobe(level, tmp_path):
    """The same entries as msProbe's dump of the same step (names, hence counters), and the same slots, shapes
    and statistics in each: ``Tensor.__sub__.0.backward`` has the gradient of the data operand ``y`` too
    (``output.1``), and ``Cell.fc1.Dense.backward.0`` (its input is the batch) has ``output`` ``[None]``."""
    got, want = ours(level, str(tmp_path)), theirs(level)
    assert sorted(got) == sorted(want)
    differ = {(name, key) for name in want for key in ("input_args", "input_kwargs", "input", "output")
              if _entries(got[name], key) != _entries(want[name], key)}
    assert not differ, differ
    if level != "L0":
        sub = _entries(got["Tensor.__sub__.0.backward"], "output")
        assert len(sub) == 2 and sub[1][2] == -sub[0][3]  # d(x - y)/dy = -d(x - y)/dx
    if level != "L1":
        assert got["Cell.fc1.Dense.backward.0"]["output"] == [None]


COMPARE_CASES = [("statistics", "mix"), ("tensor", "L0"), ("tensor", "L1"), ("tensor", "mix")]


@pytest.fixture(scope="module")
def compares(tmp_path_factory) -> dict:
    """``msprobe compare -tp target -gp golden`` (its MindSpore compare: the dumps say ``framework``
    ``mindspore``) of msProbe's dump and ours, each way round, for every case: ``{(task, level, way):
    (exit code, output, out folder)}``. The eight compares run in one msProbe process (msprobe_runs)."""
    root = tmp_path_factory.mktemp("msprobe_compare")
    jobs = {}
    for task, level in COMPARE_CASES:
        mine = dump_ours(level, str(root / f"{task}_{level}_ours"), task)
        (theirs_step,) = glob.glob(os.path.join(mindspore_dump(task, level, "port"), "dump", "step0"))
        for way, (target, golden) in {"theirs": (theirs_step, mine), "ours": (mine, theirs_step)}.items():
            jobs[(task, level, way)] = (target, golden, str(root / f"{task}_{level}_{way}"))
    results = msprobe_compare(list(jobs.values()))
    return {key: (code, output, job[2]) for (key, job), (code, output) in zip(jobs.items(), results, strict=True)}


def _compare_rows(code: int, output: str, out: str) -> list[dict]:
    """The result rows of one compare, which must have ended successfully."""
    assert code == 0 and "compare ends successfully" in output, output[-6000:]
    (path,) = glob.glob(os.path.join(out, "compare_result_*.csv"))
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(("task", "level"), COMPARE_CASES)
def test_msprobe_compare_of_the_two_dumps_passes(task, level, compares):
    """msProbe's own compare of its dump and ours, each way round: every row paired with the same name,
    ``pass``, no error message; tensors identical (cosine 1, no absolute error)."""
    names = []
    for way in ("theirs", "ours"):
        rows = _compare_rows(*compares[(task, level, way)])
        names.append({r["NPU Name"] for r in rows})
        for r in rows:
            assert r["Bench Name"] == r["NPU Name"], (way, r)
            assert r["Result"] == "pass" and r["Err_message"] in ("", "[]"), (way, r)
            if task == "tensor" and r["Cosine"] not in ("unsupported", "N/A"):
                assert float(r["Cosine"]) == pytest.approx(1.0) and float(r["MaxAbsErr"]) == 0.0, (way, r)
    assert names[0] == names[1]
    if level != "L0":
        assert "Tensor.__sub__.0.backward.output.1" in names[0]  # the label's gradient
    if level != "L1":
        assert "Cell.fc1.Dense.backward.0.output.0" in names[0]  # None: fc1 reads the batch
