"""Smoke test of bench/overhead.py: it runs and writes the JSON it promises (no timing assertion)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "bench" / "overhead.py"


@pytest.fixture(scope="module")
def overhead():
    spec = importlib.util.spec_from_file_location("nbdebug_bench_overhead", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is created
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)


@pytest.mark.timeout(60)  # ~3 s on an idle 2-core machine; the limit only catches a hang
def test_overhead_bench_smoke(overhead, tmp_path, capsys):
    out = tmp_path / "overhead.json"
    threads = torch.get_num_threads()
    overhead.main(["--models", "mlp", "--quick", "--no-msprobe", "--no-mindspore", "--rounds", "1", "--steps", "2",
                   "--warmup", "2", "--out", str(out)])
    assert torch.get_num_threads() == threads  # the bench restores the thread count

    data = json.loads(out.read_text())
    assert set(data) >= {"meta", "models", "targets"}
    assert data["meta"]["rounds"] == 1 and data["meta"]["steps"] == 2
    cfgs = data["models"]["mlp"]["configs"]
    assert cfgs["baseline"]["ratio"] == 1.0
    for name in overhead.NBDEBUG_CONFIGS:
        entry = cfgs[name]
        assert math.isfinite(entry["ratio"]) and entry["ratio"] > 0, (name, entry)
        assert math.isfinite(entry["median_ms"]) and entry["median_ms"] > 0
        assert len(entry["rounds_ms"]) == 1
    assert not any(k.startswith("msprobe") for k in cfgs)
    assert data["targets"] == {}  # targets are for the transformer, which was not run
    assert "nbdebug-L1" in capsys.readouterr().out
