"""The offline-analysis and PyTorch-vs-MindSpore compare notebooks run top to bottom in a real kernel
(nbclient); their cells assert on results."""

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("name", ["offline_dump_analysis.ipynb", "compare_torch_vs_mindspore.ipynb"])
def test_notebook_runs(name, tmp_path, monkeypatch):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs must be stripped"
    assert sum("assert " in c.source for c in nb.cells if c.cell_type == "code") >= 3
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    # the panels rendered as widgets
    views = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert views
