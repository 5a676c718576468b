"""nbdebug.compare agrees with the real ``msprobe compare`` CLI on the same pair of real msProbe dumps:
tensor metrics within 1e-6, statistics differences within 1e-6 (relative)."""

import csv
import glob
import math
import os
import subprocess
import sys

import pytest
from msprobe_runs import torch_dump

import nbdebug

MSPROBE = os.path.join(os.path.dirname(sys.executable), "msprobe")
METRICS = (("Cosine", "cosine"), ("EucDist", "euc_dist"), ("MaxAbsErr", "max_abs_err"),
           ("MaxRelativeErr", "max_rel_err"), ("One Thousandth Err Ratio", "one_thousandth"),
           ("Five Thousandths Err Ratio", "five_thousandths"))


def _step_dir(root: str, step: int = 0) -> str:
    return os.path.join(root, "dump", f"step{step}")


def _msprobe_compare(target: str, golden: str, out: str) -> list[dict]:
    proc = subprocess.run([MSPROBE, "compare", "-tp", target, "-gp", golden, "-o", out], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = glob.glob(os.path.join(out, "compare_result_*.csv"))
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


@pytest.fixture(scope="module")
def tensor_pair(tmp_path_factory):
    target, golden = _step_dir(torch_dump("tensor", "mix", "perturbed")), _step_dir(torch_dump("tensor", "mix"))
    return target, golden, _msprobe_compare(target, golden, str(tmp_path_factory.mktemp("cmp_tensor")))


def test_tensor_metrics_equal_msprobe_cli(tensor_pair):
    target, golden, theirs = tensor_pair
    res = nbdebug.compare(target, golden)
    ours = {r.name: r for r in res.rows}
    compared = 0
    for row in theirs:
        name = row["NPU Name"]
        values = {col: _num(row[col]) for col, _ in METRICS}
        if all(v is None for v in values.values()):
            continue  # a non-tensor argument or a None gradient: msProbe writes "unsupported"
        r = ours[name]
        assert r.golden_name == row["Bench Name"] and r.mode == "tensor"
        for col, attr in METRICS:
            want, got = values[col], getattr(r, attr)
            if want is None:
                assert math.isnan(got), (name, col, got)
            else:
                assert abs(got - want) <= 1e-6 * max(1.0, abs(want)), (name, col, got, want)
        compared += 1
    assert compared >= 90  # every tensor of the mix dump
    # the perturbation is in fc2's weight: everything before it agrees, fc2's output does not
    assert ours["Functional.linear.0.forward.output.0"].max_abs_err == 0.0
    assert ours["Module.fc2.Linear.forward.0.parameters.weight"].diverged
    assert res.first_divergence is not None and res.first_divergence.node == "Parameter.fc2.weight"


def test_statistics_differences_equal_msprobe_cli(tmp_path):
    target = _step_dir(torch_dump("statistics", "mix", "perturbed"))
    golden = _step_dir(torch_dump("statistics", "mix"))
    theirs = _msprobe_compare(target, golden, str(tmp_path))
    res = nbdebug.compare(target, golden)
    ours = {r.name: r for r in res.rows}
    assert all(r.mode == "statistics" for r in res.rows)
    cols = (("Max diff", "MaxRelativeErr"), ("Min diff", "MinRelativeErr"), ("Mean diff", "MeanRelativeErr"),
            ("L2norm diff", "NormRelativeErr"))
    compared = 0
    for row in theirs:
        if row["NPU Dtype"].startswith("<class") or _num(row["NPU max"]) is None:
            continue  # a non-tensor argument, or a None gradient
        r = ours[row["NPU Name"]]
        for k, (dcol, rcol) in enumerate(cols):
            want_d = float(row[dcol])
            assert abs(r.stat_diff[k] - want_d) <= 1e-6 * max(1.0, abs(want_d)), (row["NPU Name"], dcol)
            want_r = row[rcol].rstrip("%")
            want_r = math.inf if want_r.strip().lower() == "inf" else float(want_r)
            got_r = r.stat_rel_pct[k]
            assert got_r == want_r or abs(got_r - want_r) <= 1e-6 * max(1.0, abs(want_r)), (row["NPU Name"], rcol)
        compared += 1
    assert compared >= 90
