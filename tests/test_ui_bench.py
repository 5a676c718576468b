"""Smoke test of bench/ui.py: it runs and writes the numbers it promises (no timing assertion)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "ui.py"


@pytest.mark.timeout(120)
def test_ui_bench_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("nbdebug_bench_ui", BENCH)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        out = tmp_path / "ui.json"
        mod.main(["--quick", "--out", str(out)])
    finally:
        sys.modules.pop(spec.name, None)
    data = json.loads(out.read_text())
    assert data["nodes_5k"] == 5000 and data["nodes_50k"] == 50000
    assert data["visible_5k_collapsed"] < 50 and data["visible_50k_collapsed"] < 200  # scopes start collapsed
    assert 1900 <= data["visible_after_expand"] <= 2000
    for key in ("panel_5k_s", "expand_2k_s", "collapse_2k_s", "panel_50k_s", "graph_message_50k_s", "click_pause_ms",
                "pause_effect_ms"):
        assert data[key] > 0, key
    assert set(data["targets"]) == {"panel_5k_s", "expand_2k_s", "panel_50k_s", "click_pause_ms"}
