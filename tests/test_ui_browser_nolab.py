"""The panel where nbdebug's lab extension is not there, and in Notebook 7 (issue 22: items 14, 17).

Item 17: outside JupyterLab (VS Code, Colab, a Jupyter front end without the extension) the front end's
bundle cannot come from the extension's static files. A JupyterLab server with the extension disabled
(its page config) and its static files not served (the page's requests for them answered 404) must still
draw the graph: the widget's stub asks the kernel for the bundle, once per page however many panels.

Item 14: Notebook 7 turns on output scrolling (a 24em box) for a cell whose outputs grow tall — the
panel's saved-state snapshot, shown until the widget draws, is tall — and the panel was squeezed into it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from browser import DISABLED_PLUGINS, LabPage, LabServer

NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PANELS = f"{NB} .nbdebug-panel"
SETUP = """\
import torch, nbdebug
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                   bos_token_id=0, eos_token_id=0))
ids = torch.randint(0, 50, (2, 8))
dbg = nbdebug.Debugger(model, level="mix")
model(ids, labels=ids).loss.backward()"""
GRAPHS_DRAWN = """([sel, n]) => { const gs = document.querySelectorAll(sel + ' .nbdebug-ui-graph');
    return gs.length === n && Array.from(gs).every(g => g.nbdebugGraph && g.nbdebugGraph.stats().visibleItems > 0); }"""


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """JupyterLab with nbdebug's lab extension disabled (``jupyter labextension disable`` writes the same
    page config)."""
    server = LabServer(tmp_path_factory.mktemp("nolab"))
    cfg = server.base / "config" / "labconfig" / "page_config.json"
    cfg.write_text(json.dumps({"disabledExtensions": {**{p: True for p in DISABLED_PLUGINS}, "nbdebug": True}}))
    try:
        server.start()
        yield server
    finally:
        server.stop()


def test_graph_draws_without_the_lab_extension(bare_server: LabServer, chromium: Any) -> None:
    lab = LabPage(bare_server, chromium, "nolab")
    fetched: list[str] = []
    bundles: list[int] = []

    def not_served(route: Any) -> None:
        fetched.append(route.request.url)
        route.fulfill(status=404, body="not found")

    def on_ws(ws: Any) -> None:
        def frame(payload: Any) -> None:
            data = payload if isinstance(payload, bytes) else str(payload).encode()
            if b'"nbdebug-bundle"' in data and len(data) > 100_000:
                bundles.append(len(data))
        ws.on("framereceived", frame)

    lab.page.route("**/nbdebug/static/nbdebug-ui.js*", not_served)
    lab.page.on("websocket", on_ws)
    try:
        bare_server.write_notebook("nolab.ipynb", [SETUP, "dbg", "dbg"])
        lab.open_notebook("nolab.ipynb")
        assert not lab.page.evaluate("() => window.jupyterapp.commands.hasCommand('nbdebug:pause')"), \
            "the lab extension is active: this test needs it disabled"
        lab.run_cell(0, timeout=300)
        lab.run_cell(1)
        lab.run_cell(2)
        lab.wait_until(GRAPHS_DRAWN, arg=[PANELS, 2], timeout=180)
        assert lab.page.locator(f"{PANELS} .nbdebug-missing").count() == 0
        assert lab.page.evaluate("() => window.nbdebugUISource") == "kernel"
        assert fetched, "the stub did not try the lab extension's copy first"
        assert len(bundles) == 1, f"the bundle was sent {len(bundles)} times for 2 panels"
        path = lab.screenshot("nolab-panel", PANELS)
        lab.assert_not_blank(path)
    finally:
        lab.close()


def test_panel_not_squeezed_in_notebook_7(nb_page: LabPage) -> None:
    lab = nb_page
    lab.server.write_notebook("tall.ipynb", [SETUP, "dbg"])
    lab.open_notebook("tall.ipynb")
    lab.run_cell(0, timeout=300)
    lab.run_cell(1)
    lab.wait_until(GRAPHS_DRAWN, arg=[PANELS, 1], timeout=180)
    lab.page.wait_for_timeout(1500)
    scrolled = lab.page.evaluate("""() => Array.from(document.querySelectorAll('.jp-CodeCell'))
        .some(c => c.classList.contains('jp-mod-outputsScrolled') && c.querySelector('.nbdebug-panel'))""")
    if not scrolled:  # Notebook 7 did not turn scrolling on by itself here: as the user's "scroll outputs"
        lab.page.evaluate("""() => { const nb = window.jupyterapp.shell.currentWidget.content;
            nb.activeCellIndex = 1; return window.jupyterapp.commands.execute('notebook:enable-output-scrolling'); }""")
    box = lab.page.evaluate("""() => {
        const c = Array.from(document.querySelectorAll('.jp-CodeCell')).find(c => c.querySelector('.nbdebug-panel'));
        const area = c.querySelector('.jp-Cell-outputArea');
        const p = c.querySelector('.nbdebug-panel');
        return {scrolled: c.classList.contains('jp-mod-outputsScrolled'), area: area.clientHeight,
                overflow: getComputedStyle(area).overflowY, panel: p.getBoundingClientRect().height};
    }""")
    lab.screenshot("notebook7-tall-panel")
    assert box["scrolled"], box
    # the whole panel in the output area (not a 24em = 312 px box) and no inner scroll bar
    assert box["panel"] > 400 and box["area"] >= box["panel"] and box["overflow"] == "visible", (box, scrolled)
