"""Every notebook runs top to bottom in a real kernel (nbclient); their last cells assert on results."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ["quickstart.ipynb", "overflow_detection.ipynb", "remote_and_ranks.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, tmp_path):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "outputs must be stripped"
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
