"""Running a notebook where a user runs it (its own folder) leaves nothing behind there (issue #22 item 20):
remote_and_ranks.ipynb writes its job's script, log and go-file into a temporary folder it removes."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"

pytestmark = [pytest.mark.subprocess, pytest.mark.slow, pytest.mark.timeout(600)]


def _listing() -> set[str]:
    return {str(p.relative_to(NOTEBOOKS)) for p in NOTEBOOKS.rglob("*")}


def test_remote_and_ranks_leaves_no_scratch_in_notebooks():
    nb = nbformat.read(NOTEBOOKS / "remote_and_ranks.ipynb", as_version=4)
    before = _listing()
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    left = sorted(_listing() - before)
    assert not left, f"running the notebook left {left} in notebooks/"
