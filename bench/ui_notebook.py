"""The panel as a user meets it, measured in real JupyterLab + Chromium (not kernel-side).

For the quickstart model, a 6-layer GPT-2 (``transformers`` from a config, random weights) and the same
GPT-2 after 5,000+ TO hits (a NaN weight, five steps):

* time to first panel: from asking the kernel to run ``dbg.panel()`` to the panel drawn in the page
  (panel root present and its graph drawn), the first panel of a page, then the next ones;
* bytes over the kernel websocket while that cell runs and the panel draws (every frame received);
* notebook metadata growth per saved panel: ``metadata.widgets`` of the saved ``.ipynb``, with
  "save widget state" on (the setting that stored 5 MB per plotly figure).

Run: ``.venv/bin/python bench/ui_notebook.py`` (or through ``bench/ui_browser.py``). Prints one line a figure.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from browser import CHROMIUM, CHROMIUM_ARGS, LabPage, LabServer  # noqa: E402

QUICKSTART_SETUP = """\
import torch, torch.nn as nn, nbdebug
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dbg = nbdebug.Debugger(model, level="mix")
for _ in range(2):
    opt.zero_grad(); model(torch.randn(16, 4)).pow(2).mean().backward(); opt.step()
"""

GPT2_SETUP = """\
import torch, nbdebug
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=64, n_head=4, vocab_size=100, n_positions=32))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
dbg = nbdebug.Debugger(model, level="mix")
ids = torch.randint(0, 100, (2, 16))
for _ in range(2):
    opt.zero_grad(); model(ids, labels=ids).loss.backward(); opt.step()
print(len(dbg.graph), "nodes")
"""

# The same GPT-2 after 5,000+ watchpoint hits: one NaN weight, a TO watchpoint, five steps (every later
# tensor is non-finite, so the hit list, the graph's badges and the snapshot carry thousands of hits).
MANY_HITS_SETUP = GPT2_SETUP + """\
dbg.watch("TO")
with torch.no_grad():
    model.transformer.h[1].mlp.c_fc.weight[0, 0] = float("nan")
def train(steps):
    for _ in range(steps):
        opt.zero_grad(); model(ids, labels=ids).loss.backward(); opt.step()
dbg.run(train, 5)
while dbg.wait(300).value == "paused":
    dbg.cont()
from nbdebug.watch.watchpoints import count_hits
print(count_hits(dbg.hits), "hits")
"""

PANEL_CELL = "p = dbg.panel(); p"

# The panel drawn: its root is in the page and its graph has drawn (our canvas front end, or the old
# plotly figure's SVG), counted per panel.
PANELS_DRAWN = """(n) => {
    const panels = document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .nbdebug-panel');
    let drawn = 0;
    for (const p of panels) {
        const g = p.querySelector('.nbdebug-ui-graph');
        const ok = g ? (g.nbdebugGraph ? g.nbdebugGraph.isReady?.() ?? !!g.querySelector('canvas')
                                        : !!g.querySelector('canvas'))
                     : !!p.querySelector('.nbdebug-graph .main-svg');
        if (ok) drawn++;
    }
    return drawn >= n;
}"""

WIDGET_SETTINGS = {"saveState": True}


class Meter:
    """Bytes of websocket frames received by the page (kernel → browser)."""

    def __init__(self, page: Any) -> None:
        self.bytes = 0
        page.on("websocket", self._attach)

    def _attach(self, ws: Any) -> None:
        ws.on("framereceived", self._frame)

    def _frame(self, payload: Any) -> None:
        self.bytes += len(payload) if payload is not None else 0


def _enable_widget_state(server: LabServer) -> None:
    d = server.base / "settings" / "@jupyter-widgets" / "jupyterlab-manager"
    d.mkdir(parents=True, exist_ok=True)
    (d / "plugin.jupyterlab-settings").write_text(json.dumps(WIDGET_SETTINGS))


def _metadata_bytes(path: Path) -> int:
    nb = json.loads(path.read_text())
    return len(json.dumps(nb.get("metadata", {}).get("widgets", {})))


def measure(server: LabServer, browser: Any, name: str, setup: str, panels: int = 3) -> dict[str, Any]:
    """Open a notebook, run ``setup``, then ``panels`` panel cells one after another in the same page."""
    nb = f"bench_{name}.ipynb"
    server.write_notebook(nb, [setup] + [PANEL_CELL] * panels)
    lab = LabPage(server, browser, f"bench-{name}")
    meter = Meter(lab.page)
    out: dict[str, Any] = {"first_s": None, "next_s": [], "bytes": [], "meta": [], "file": []}
    try:
        lab.open_notebook(nb)
        lab.run_cell(0, timeout=900)
        out["setup_output"] = lab.page.evaluate("""() => window.jupyterapp.shell.currentWidget.content.widgets[0]
            .node.querySelector('.jp-OutputArea')?.textContent ?? ''""").strip()[-200:]
        lab.command("docmanager:save")
        time.sleep(1.0)
        meta0 = _metadata_bytes(server.root / nb)
        file0 = (server.root / nb).stat().st_size
        for k in range(panels):
            b0 = meter.bytes
            t0 = time.perf_counter()
            lab.run_cell(k + 1, timeout=300)
            lab.wait_until(PANELS_DRAWN, timeout=300, arg=k + 1)
            dt = time.perf_counter() - t0
            time.sleep(0.5)  # late frames of this panel (deltas, marks)
            if k == 0:
                out["first_s"] = dt
            else:
                out["next_s"].append(dt)
            out["bytes"].append(meter.bytes - b0)
            lab.command("docmanager:save")
            time.sleep(1.0)
            meta = _metadata_bytes(server.root / nb)
            out["meta"].append(meta - meta0)
            meta0 = meta
            size = (server.root / nb).stat().st_size  # widget state and the outputs (the panel's snapshot)
            out["file"].append(size - file0)
            file0 = size
        lab.screenshot(f"bench-{name}")
        out["errors"] = [e for e in lab.errors if "favicon" not in e]
    finally:
        lab.close()
    return out


def notebook_metrics(panels: int = 3) -> dict[str, dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = LabServer(Path(tmp))
        _enable_widget_state(server)
        server.start()
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
                try:
                    for name, setup in (("quickstart", QUICKSTART_SETUP), ("gpt2_6layer", GPT2_SETUP),
                                        ("gpt2_5000_hits", MANY_HITS_SETUP)):
                        results[name] = measure(server, browser, name, setup, panels)
                finally:
                    browser.close()
        finally:
            server.stop()
    return results


def report(results: dict[str, dict[str, Any]]) -> None:
    for name, r in results.items():
        nxt = statistics.median(r["next_s"]) if r["next_s"] else float("nan")
        if r.get("setup_output"):
            print(f"{name:12s} setup printed: {r['setup_output']!r}")
        print(f"{name:12s} first panel {r['first_s']:.2f} s (target ≤ 2 s); next panels {nxt:.2f} s (≤ 1 s)")
        print(f"{name:12s} websocket per panel {statistics.median(r['bytes']) / 1e6:.3f} MB (≤ 1 MB) "
              f"[{', '.join(f'{b / 1e6:.3f}' for b in r['bytes'])}]")
        print(f"{name:12s} saved metadata per panel {statistics.median(r['meta']) / 1e3:.1f} KB (≤ 300 KB) "
              f"[{', '.join(f'{m / 1e3:.1f}' for m in r['meta'])}]")
        if r.get("file"):
            print(f"{name:12s} saved notebook per panel {statistics.median(r['file']) / 1e3:.1f} KB (≤ 300 KB) "
                  f"[{', '.join(f'{m / 1e3:.1f}' for m in r['file'])}]")
        if r.get("errors"):
            print(f"{name:12s} page errors: {r['errors'][:3]}")


if __name__ == "__main__":
    report(notebook_metrics())
