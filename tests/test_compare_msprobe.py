"""nbdebug.compare agrees with the real ``msprobe compare`` CLI on the same pair of real msProbe dumps:
tensor metrics within 1e-6, statistics differences within 1e-6 (relative)."""

import csv
import glob
import math
import os

import pytest
from msprobe_runs import msprobe_compare, torch_dump

import nbdebug

pytestmark = pytest.mark.slow  # four msProbe dumps and its compare in subprocesses (~60 s)

METRICS = (("Cosine", "cosine"), ("EucDist", "euc_dist"), ("MaxAbsErr", "max_abs_err"),
           ("MaxRelativeErr", "max_rel_err"), ("One Thousandth Err Ratio", "one_thousandth"),
           ("Five Thousandths Err Ratio", "five_thousandths"))


def _step_dir(root: str, step: int = 0) -> str:
    return os.path.join(root, "dump", f"step{step}")


def _rows(code: int, output: str, out: str) -> list[dict]:
    assert code == 0, output[-4000:]
    (path,) = glob.glob(os.path.join(out, "compare_result_*.csv"))
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _num(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


@pytest.fixture(scope="module")
def msprobe_pairs(tmp_path_factory) -> dict:
    """``msprobe compare -tp target -gp golden`` of the tensor pair and of the statistics pair (one msProbe
    process for both, msprobe_runs): ``{task: (target, golden, result rows)}``."""
    pairs = {task: (_step_dir(torch_dump(task, "mix", "perturbed")), _step_dir(torch_dump(task, "mix")),
                    str(tmp_path_factory.mktemp(f"cmp_{task}"))) for task in ("tensor", "statistics")}
    done = msprobe_compare(list(pairs.values()))
    return {task: (target, golden, _rows(*result, out))
            for (task, (target, golden, out)), result in zip(pairs.items(), done, strict=True)}


@pytest.fixture(scope="module")
def tensor_pair(msprobe_pairs):
    return msprobe_pairs["tensor"]


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


def test_statistics_differences_equal_msprobe_cli(msprobe_pairs):
    target, golden, theirs = msprobe_pairs["statistics"]
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
