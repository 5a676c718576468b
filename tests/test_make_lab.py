"""``make lab``, the README's first command, tested as a user runs it (issue #22 item 0): as root (this
machine's user in CI and containers) and with no display, it starts JupyterLab on the port and token it was
given, prints the URL, serves the quickstart notebook through the REST API, and stops cleanly. JupyterLab
serves notebooks/ (the folder of the notebook it opens), so the quickstart is ``/api/contents/quickstart.ipynb``."""

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(600)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, bytes]:
    req = urllib.request.Request(url, method=method)
    if token is not None:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_make_lab_as_root_without_display_serves_the_quickstart_and_stops():
    up_to_date = subprocess.run(["make", "-q", "setup"], cwd=ROOT).returncode == 0
    port, token = _free_port(), "nbdebug-test-" + os.urandom(8).hex()
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "CI")}
    proc = subprocess.Popen(["make", "lab", f"LAB_PORT={port}", f"LAB_TOKEN={token}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + (90 if up_to_date else 540)
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, body = _get(f"{base}/api/contents/quickstart.ipynb", token)
                break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.5)
        out = "".join(lines)
        assert status == 200, f"JupyterLab did not serve the quickstart (rc {proc.poll()}):\n{out[-3000:]}"
        nb = json.loads(body)
        assert nb["type"] == "notebook" and nb["name"] == "quickstart.ipynb"
        assert any("nbdebug" in "".join(c["source"]) for c in nb["content"]["cells"])
        assert _get(f"{base}/api/contents/quickstart.ipynb")[0] == 403  # the token is required
        assert f"http://localhost:{port}/lab/tree/quickstart.ipynb?token={token}" in out
        command = next(line for line in out.splitlines() if line.startswith("jupyter lab "))
        assert "--no-browser" in command  # no display here
        assert ("--allow-root" in command) == (os.geteuid() == 0)
        if up_to_date:
            assert "pip install" not in out, "make lab reinstalled an up-to-date .venv"
        assert _get(f"{base}/api/shutdown", token, method="POST")[0] == 200
        assert proc.wait(60) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    reader.join(10)
    assert "Running as root is not recommended" not in "".join(lines)
