"""Binder's files agree with the project: same pins, and postBuild builds and checks the extension."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _names(lines):
    return {re.split(r"[<>=!\[ ]", ln.strip())[0].lower() for ln in lines if ln.strip() and not ln.startswith("#")}


def test_binder_requirements_cover_runtime_dependencies_and_pins():
    req = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    pins = [ln for ln in (ROOT / "constraints.txt").read_text().splitlines() if ln and not ln.startswith("#")]
    for pin in pins:
        assert pin in req, f"binder/requirements.txt lacks the pin {pin}"
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert _names(deps) <= _names(req)


def test_postbuild_builds_installs_and_checks_the_extension():
    post = ROOT / "binder" / "postBuild"
    text = post.read_text()
    assert post.stat().st_mode & 0o111, "postBuild must be executable"
    assert "npm run build" in text and "pip install" in text and "labextension list" in text
    assert (ROOT / "labextension" / "package-lock.json").exists()
