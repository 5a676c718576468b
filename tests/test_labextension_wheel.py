"""The wheel carries the prebuilt lab extension: ``pip install`` alone makes JupyterLab load it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "nbdebug" / "labextension"
DATA = "share/jupyter/labextensions/nbdebug"
IGNORE = shutil.ignore_patterns(".git", ".venv", "node_modules", "build", "dist", "*.egg-info", "__pycache__",
                                "artifacts", ".pytest_cache", ".ruff_cache", "lib", "*.so")


def test_wheel_ships_the_labextension_and_pip_install_enables_it(tmp_path: Path) -> None:
    assert (BUILD / "package.json").is_file(), "build the lab extension first (`make`)"
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=IGNORE, symlinks=True)
    shutil.copytree(BUILD, src / "nbdebug" / "labextension", dirs_exist_ok=True)
    dist = tmp_path / "dist"
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                          str(src), "-w", str(dist)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    (wheel,) = dist.glob("nbdebug-*.whl")

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    prefix = next(n.split(DATA)[0] for n in names if DATA in n) if any(DATA in n for n in names) else None
    assert prefix is not None, f"no {DATA} in the wheel: {names}"
    shipped = sorted(n[len(prefix + DATA) + 1:] for n in names if n.startswith(prefix + DATA + "/"))
    built = sorted(p.relative_to(BUILD).as_posix() for p in BUILD.rglob("*") if p.is_file())
    assert shipped == sorted([*built, "install.json"])
    assert not [n for n in names if n.startswith("nbdebug/labextension/")], "shipped twice (package data too)"
    assert "nbdebug/lab/__init__.py" in names and "nbdebug/lab/channel.py" in names

    # Install it into a fresh prefix and ask JupyterLab what it sees there.
    target = tmp_path / "prefix"
    # --ignore-installed: never uninstall the dev venv's editable nbdebug while doing this
    run = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--ignore-installed", "-q",
                          "--prefix", str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    installed = target / DATA
    assert json.loads((installed / "package.json").read_text())["name"] == "nbdebug"
    env = dict(os.environ, JUPYTER_PATH=str(target / "share" / "jupyter"),
               JUPYTER_CONFIG_DIR=str(tmp_path / "config"), JUPYTER_DATA_DIR=str(tmp_path / "data"))
    jupyter = Path(sys.executable).parent / "jupyter"
    run = subprocess.run([str(jupyter), "labextension", "list"], env=env, capture_output=True, text=True,
                         timeout=120)
    listing = re.sub(r"\x1b\[[0-9;]*m", "", run.stdout + run.stderr)
    section = listing.split(str(installed.parent))[1] if str(installed.parent) in listing else ""
    assert re.search(r"nbdebug v\S+ enabled OK \(python, nbdebug\)", section), listing
