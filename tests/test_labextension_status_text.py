"""The JupyterLab status item's words (labextension/src/status.ts, built to labextension/lib/status.js) use
the panel header's one meaning of "step" (#22 item 16): the step whose data is shown first, then the step
training is at when it is another one. Run in Node on the built module, with Lumino's Widget stubbed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[1] / "labextension" / "lib" / "status.js"

CASES = [
    ({"state": "finished", "step": 3, "shown_step": 2, "hits": 0}, "nbdebug: finished · step 2 · 0 hits"),
    ({"state": "running", "step": 3, "shown_step": 2, "hits": 1}, "nbdebug: running · step 2 · step 3 running · 1 hit"),
    ({"state": "running", "step": 3, "shown_step": 3, "hits": 1}, "nbdebug: running · step 3 · 1 hit"),
    ({"state": "paused", "step": 3, "shown_step": 2, "hits": 2}, "nbdebug: paused · step 2 · step 3 next · 2 hits"),
    ({"state": "paused", "step": 0, "shown_step": None, "hits": 0}, "nbdebug: paused · step 0 next · 0 hits"),
    ({"state": "running", "step": 5, "shown_step": 4, "hits": 0,
      "processes": [{"key": "0", "state": "running", "step": 5, "shown_step": 4, "hits": 0},
                    {"key": "1", "state": "running", "step": 5, "shown_step": 4, "hits": 0}]},
     "nbdebug: 2 processes · 2 running · step 4 · 0 hits"),
]


def test_status_item_names_the_header_step():
    node = shutil.which("node")
    if node is None or not LIB.is_file():
        pytest.fail(f"needs node and the built lab extension ({LIB}); run `make labextension`", pytrace=False)
    src = LIB.read_text()
    src = re.sub(r"^import .*?;$", "", src, flags=re.M)
    script = ("class Widget { constructor() { this.node = { dataset: {}, append() {} }; } addClass() {} }\n" + src
              + f"\nconsole.log(JSON.stringify({json.dumps([c for c, _ in CASES])}.map(describe)));\n")
    out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got == [want for _, want in CASES]
