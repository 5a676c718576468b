"""The test suite in tiers (issue #24 item 8): markers browser / subprocess / slow, ``make test-fast`` runs
what carries none, and conftest.py needs no torch for a numpy-only test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import playwright  # noqa: F401 - the tier test collects the browser tests (tests/torch_only.py reads this)
import pytest

ROOT = Path(__file__).resolve().parents[1]
FAST = "not browser and not subprocess and not slow"

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(600)]


PLUGIN = """
import json, os
def pytest_collection_finish(session):
    tiers = {}
    for item in session.items:
        marks = {m.name for m in item.iter_markers()} & {"browser", "subprocess", "slow"}
        tiers.setdefault(item.nodeid.split("::")[0], set()).update(marks)
    with open(os.environ["TIERS_OUT"], "w") as f:
        json.dump({k: sorted(v) for k, v in tiers.items()}, f)
"""


def test_modules_get_their_tiers_and_the_fast_tier_leaves_them_out(tmp_path):
    (tmp_path / "tiers_plugin.py").write_text(PLUGIN)
    out = tmp_path / "tiers.json"
    mods = ["tests/test_ui_browser.py", "tests/test_notebooks.py", "tests/test_run_output.py",
            "tests/test_notebook_scratch.py", "tests/test_compare_metrics.py", "tests/test_argument_checks.py"]
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TIERS_OUT": str(out)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider",
                        "-p", "tiers_plugin", *mods], cwd=ROOT, capture_output=True, text=True, timeout=500, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tiers = json.loads(out.read_text())
    assert tiers == {
        "tests/test_ui_browser.py": ["browser"],  # by its fixtures (tests/browser.py)
        "tests/test_notebooks.py": ["subprocess"],  # starts kernels (nbclient)
        "tests/test_run_output.py": ["subprocess"],
        "tests/test_notebook_scratch.py": ["slow", "subprocess"],
        "tests/test_compare_metrics.py": [],  # the fast tier
        "tests/test_argument_checks.py": [],
    }


def test_markers_are_registered_and_make_has_test_fast():
    r = subprocess.run([sys.executable, "-m", "pytest", "--markers", "-p", "no:cacheprovider"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    for name in ("browser", "subprocess", "slow"):
        assert f"@pytest.mark.{name}:" in r.stdout
    dry = subprocess.run(["make", "-n", "test-fast"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0 and f'-m "{FAST}"' in dry.stdout, dry.stdout + dry.stderr


def test_a_numpy_only_test_runs_where_torch_cannot_be_imported(tmp_path):
    blocker = tmp_path / "torch"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('torch is blocked for this test')\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_compare_metrics.py"], cwd=ROOT, capture_output=True, text=True, timeout=240,
                       env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})  # `import torch` fails there
    assert r.returncode == 0 and " passed" in r.stdout, r.stdout[-3000:] + r.stderr[-2000:]
    assert "torch is blocked" not in r.stdout + r.stderr
