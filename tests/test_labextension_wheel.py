"""The wheel carries the prebuilt lab extension and front end: ``pip install`` alone makes JupyterLab load it,
with no node anywhere."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from jupyterlab import __version__ as JUPYTERLAB_VERSION  # the clean venv gets the same JupyterLab

pytestmark = pytest.mark.slow  # a wheel built and installed with JupyterLab in a fresh venv (~60 s)

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "nbdebug" / "labextension"
FRONTEND = REPO / "nbdebug" / "ui" / "static" / "nbdebug-ui.js"
DATA = "share/jupyter/labextensions/nbdebug"
IGNORE = shutil.ignore_patterns(".git", ".venv*", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
                                "artifacts", ".pytest_cache", ".ruff_cache", "lib", "*.so")


def _run(cmd, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **{"timeout": 600, **kw})
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _listing(run: subprocess.CompletedProcess, labextensions: Path) -> str:
    """The part of ``jupyter labextension list`` about the extensions found in ``labextensions``."""
    listing = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    return listing.split(str(labextensions))[1] if str(labextensions) in listing else f"(not listed)\n{listing}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """``pip wheel --no-deps --no-build-isolation`` of a copy of this checkout with its built extension."""
    assert (BUILD / "package.json").is_file(), "build the lab extension first (`make labextension`)"
    assert FRONTEND.is_file() and (BUILD / "static" / FRONTEND.name).is_file(), "build the front end first"
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=IGNORE, symlinks=True)
    shutil.copytree(BUILD, src / "nbdebug" / "labextension", dirs_exist_ok=True)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", src, "-w", tmp / "dist"])
    (whl,) = (tmp / "dist").glob("nbdebug-*.whl")
    return whl


def test_wheel_ships_the_labextension_and_the_front_end(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        prefix = next((n.split(DATA)[0] for n in names if DATA in n), None)
        assert prefix is not None, f"no {DATA} in the wheel: {names}"
        shipped = sorted(n[len(prefix + DATA) + 1:] for n in names if n.startswith(prefix + DATA + "/"))
        built = sorted(p.relative_to(BUILD).as_posix() for p in BUILD.rglob("*") if p.is_file())
        assert shipped == sorted([*built, "install.json"])
        assert "static/nbdebug-ui.js" in shipped
        # the front end twice: in the package (export_html, the widget) and in the extension's static files
        assert zf.read("nbdebug/ui/static/nbdebug-ui.js") == FRONTEND.read_bytes()
        assert zf.read(prefix + DATA + "/static/nbdebug-ui.js") == FRONTEND.read_bytes()
    assert not [n for n in names if n.startswith("nbdebug/labextension/")], "shipped twice (package data too)"
    assert "nbdebug/lab/__init__.py" in names and "nbdebug/lab/channel.py" in names


def test_pip_install_into_a_prefix_is_found_by_jupyterlab(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "prefix"
    # --ignore-installed: never uninstall the dev venv's editable nbdebug while doing this
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q", "--prefix", target, wheel])
    installed = target / DATA
    assert json.loads((installed / "package.json").read_text())["name"] == "nbdebug"
    env = dict(os.environ, JUPYTER_PATH=str(target / "share" / "jupyter"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    run = _run([Path(sys.executable).parent / "jupyter", "labextension", "list"], env=env, timeout=120)
    assert re.search(r"nbdebug v\S+ enabled OK \(python, nbdebug\)", _listing(run, installed.parent)), run


def test_wheel_in_a_clean_venv_needs_no_node_and_jupyterlab_enables_it(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv (no system site-packages) with JupyterLab from PyPI, then the wheel with ``--no-deps``:
    node is off the PATH throughout."""
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", venv])
    bindir = venv / "bin"
    no_node = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "node").exists()]
    env = dict(os.environ, PATH=os.pathsep.join([str(bindir), *no_node]), JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
               JUPYTER_DATA_DIR=str(tmp_path / "data"))
    for k in ("JUPYTER_PATH", "PYTHONPATH", "VIRTUAL_ENV"):
        env.pop(k, None)
    assert shutil.which("node", path=env["PATH"]) is None
    # --no-compile: byte-compiling all of JupyterLab's dependencies is most of the install's time; the
    # modules `jupyter labextension list` imports are compiled when it imports them.
    pip = [bindir / "python", "-m", "pip", "install", "-q", "--no-compile"]
    _run([*pip, f"jupyterlab=={JUPYTERLAB_VERSION}"], env=env)
    _run([*pip, "--no-deps", wheel], env=env)

    where = _run([bindir / "python", "-c", "import importlib.util, pathlib; "
                  "print(pathlib.Path(importlib.util.find_spec('nbdebug').origin).parent)"], env=env, cwd=tmp_path)
    pkg = Path(where.stdout.strip())
    assert pkg.is_relative_to(venv), pkg
    assert (pkg / "ui" / "static" / "nbdebug-ui.js").read_bytes() == FRONTEND.read_bytes()
    labext = venv / DATA
    assert (labext / "static" / "nbdebug-ui.js").read_bytes() == FRONTEND.read_bytes()

    run = _run([bindir / "jupyter", "labextension", "list"], env=env, cwd=tmp_path, timeout=120)
    assert re.search(r"nbdebug v\S+ enabled OK \(python, nbdebug\)", _listing(run, labext.parent)), run
