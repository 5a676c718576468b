"""Smoke test of bench/zoo.py: the zoo builds, nbdebug and msProbe run side by side, ratios come out
(no timing assertion: speed is measured by running the bench, not by tests)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
import transformers  # noqa: F401  (half the zoo is built from its configs)

BENCH = Path(__file__).resolve().parent.parent / "bench" / "zoo.py"


@pytest.fixture(scope="module")
def zoo():
    spec = importlib.util.spec_from_file_location("nbdebug_bench_zoo", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    threads = torch.get_num_threads()
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)
        torch.set_num_threads(threads)


def test_every_zoo_model_trains_finite(zoo):
    for name in zoo.MODELS:
        wl = zoo.make_zoo_workload(name)
        opt = wl.reset()
        losses = [wl.step(opt) for _ in range(2)]
        assert all(math.isfinite(x) for x in losses), (name, losses)


@pytest.mark.timeout(300)
def test_zoo_bench_side_by_side_with_msprobe(zoo, tmp_path, capsys):
    out = tmp_path / "zoo.json"
    zoo.main(["--models", "resnet", "--levels", "mix", "--quick", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"resnet"}
    assert rows["resnet"]["baseline_ms"] > 0
    for cfg in ("nbdebug-mix", "msprobe-mix"):
        assert math.isfinite(rows["resnet"][cfg]) and rows["resnet"][cfg] > 0.2, rows
    printed = capsys.readouterr().out
    assert "target mix: median" in printed and "worst at mix: resnet" in printed


# the published parameter counts of the configurations ``--size real`` follows
PUBLISHED_M = {"gpt2": 81.9, "gpt2_ckpt": 81.9, "bert": 28.8, "t5": 60.5, "llama_amp": 68.0, "vit": 5.72,
               "resnet": 11.69, "mobilenet": 2.54}


def test_real_size_zoo_has_the_published_sizes(zoo):
    for name in zoo.MODELS:
        wl = zoo.make_zoo_workload(name, size="real")
        n = sum(p.numel() for p in wl.model.parameters()) / 1e6
        assert abs(n - PUBLISHED_M[name]) / PUBLISHED_M[name] < 0.01, (name, n)
        del wl
    wl = zoo.make_zoo_workload("mobilenet", size="real")
    opt = wl.reset()
    assert math.isfinite(wl.step(opt))
    with pytest.raises(ValueError, match="unknown size"):
        zoo.make_zoo_workload("gpt2", size="huge")
