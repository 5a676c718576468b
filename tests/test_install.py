"""nbdebug installs like a library: numpy 2 is kept unless MindSpore is asked for, and importing it is silent.

The resolution checks use ``pip install --dry-run --report`` in a fresh venv that has numpy 2: pip says what
it would install without installing MindSpore (or anything) there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.slow  # a fresh venv and two pip resolutions (~75 s)

REPO = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(".git", ".venv*", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
                                "artifacts", ".pytest_cache", ".ruff_cache", "lib", "*.so", "labextension",
                                "notebooks", "bench", "static")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **{"timeout": 600, **kw})
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def test_import_nbdebug_prints_nothing():
    r = subprocess.run([sys.executable, "-c", "import nbdebug; nbdebug.Debugger; nbdebug.compare"],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (r.stdout, r.stderr) == ("", "")


def test_dependencies_leave_numpy_to_the_frameworks():
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "numpy>=1.26" in meta["dependencies"]
    assert not [d for d in meta["dependencies"] if d.startswith(("torch", "mindspore", "jupyterlab"))]
    extras = meta["optional-dependencies"]
    assert extras["torch"] == ["torch==2.13.0"]
    assert set(extras["mindspore"]) == {"mindspore==2.10.0", "numpy<2"}
    assert {"jupyterlab>=4", "notebook>=7"} <= set(extras["lab"])
    assert {"transformers", "notebook>=7", "numpy<2", "mindspore==2.10.0", "torch==2.13.0"} <= set(extras["dev"])
    assert not [e for e, deps in extras.items() if e not in ("mindspore", "dev") and "numpy<2" in deps]


def test_readme_install_section_shows_the_extras():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Install", 1)[1].split("\n## ", 1)[0]
    for extra in ("torch", "mindspore", "lab"):
        assert f'pip install "nbdebug[{extra}]"' in section


@pytest.fixture(scope="module")
def numpy2_venv(tmp_path_factory):
    """A fresh venv with numpy 2 installed, and a copy of this checkout's packaging."""
    tmp = tmp_path_factory.mktemp("np2")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", venv])
    py = venv / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", "--no-compile", "numpy>=2"])
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    return py, src


def _would_install(py: Path, target: str, tmp: Path) -> dict[str, str]:
    report = tmp / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    _run([py, "-m", "pip", "install", "-q", "--dry-run", "--report", report, target], env=env)
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


def _major(version: str) -> int:
    return int(version.split(".")[0])


@pytest.mark.own_environment  # a venv of its own, from the base interpreter: run once, by the main run
def test_pip_install_keeps_numpy_2_and_the_mindspore_extra_brings_numpy_1(numpy2_venv, tmp_path):
    py, src = numpy2_venv
    have = _run([py, "-c", "import numpy; print(numpy.__version__)"]).stdout.strip()
    assert _major(have) == 2

    plain = _would_install(py, str(src), tmp_path)
    assert "nbdebug" in plain
    assert "numpy" not in plain, f"pip would replace numpy {have} by {plain.get('numpy')}"
    assert not {"torch", "mindspore"} & set(plain)

    ms = _would_install(py, f"{src}[mindspore]", tmp_path)
    assert ms.get("mindspore") == "2.10.0"
    assert "numpy" in ms and _major(ms["numpy"]) == 1, ms.get("numpy")
