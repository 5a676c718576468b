"""The graph view inside real JupyterLab: the anywidget stub loads the bundle, a ``FrontendWidget`` posts
graph messages from the kernel, two views of the widget draw it, and a view's clicks reach the kernel."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser import labextension_build

TESTS = Path(__file__).resolve().parent
VIEWS = "Array.from(document.querySelectorAll('.nbdebug-ui-graph')).map(e => e.nbdebugGraph).filter(Boolean)"


@pytest.mark.timeout(400)
def test_graph_view_in_jupyterlab(lab_page):
    labextension_build()
    lab_page.server.write_notebook("graph.ipynb", [
        f"import sys; sys.path.insert(0, {str(TESTS)!r})\n"
        "import graph_fixtures as fx\n"
        "from nbdebug.ui.frontend import FrontendWidget\n"
        "g = fx.gpt2()\n"
        "w = FrontendWidget(view='graph', height=480)\n"
        "clicks = []\n"
        "w.handle('click', lambda c, b: clicks.append(c['name']))\n"
        "w.post(g.message(rev=1))\n"
        "display(w)",
        "display(w)",
    ])
    lab_page.open_notebook("graph.ipynb")
    lab_page.run_cell(0)
    page = lab_page.page
    lab_page.wait_until(f"() => {VIEWS}.length >= 1 && {VIEWS}[0].stats().visibleItems > 0", timeout=60)
    lab_page.run_cell(1)
    # the second view asks the kernel (hello) and draws the same graph
    lab_page.wait_until(f"() => {VIEWS}.length >= 2 && {VIEWS}[1].stats().visibleItems > 0", timeout=60)
    s0, s1 = page.evaluate(f"() => {VIEWS}.map(v => v.stats())")
    assert s0["visibleItems"] == s1["visibleItems"]
    # reveal in the first view, then click the node: the kernel gets the click message
    name = "transformer.h.0.ln_1.LayerNorm.7"
    page.evaluate(f"(n) => {VIEWS}[0].reveal(n)", name)
    sb = page.evaluate(f"(n) => {VIEWS}[0].screenBox(n)", name)
    assert sb is not None
    canvas = page.locator(".nbdebug-ui-graph canvas.ng-main").first.bounding_box()
    page.mouse.click(canvas["x"] + sb["x"] + sb["w"] / 2, canvas["y"] + sb["y"] + sb["h"] / 2)
    lab_page.append_and_run("print('clicks:', clicks)")
    lab_page.wait_for_output(f"clicks: ['{name}']")
    path = lab_page.screenshot("graph_lab", ".nbdebug-ui-graph")
    lab_page.assert_not_blank(path)
    assert not [e for e in lab_page.errors if "nbdebug" in e or "pageerror" in e], lab_page.errors
