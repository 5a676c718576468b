"""nbdebug's front end in real JupyterLab + Chromium: the anywidget stub imports the one bundle from the
labextension's static files, once per page however many widgets there are."""

from __future__ import annotations

from browser import labextension_build


def test_widgets_share_one_bundle_fetch(lab_page):
    labextension_build()
    fetched: list[str] = []
    lab_page.page.on("request", lambda r: fetched.append(r.url) if "nbdebug-ui.js" in r.url else None)
    lab_page.server.write_notebook("fe.ipynb", [
        "from nbdebug.ui.frontend import FrontendWidget\n"
        "a = FrontendWidget(view='graph'); b = FrontendWidget(view='heatmap')\ndisplay(a, b)",
    ])
    lab_page.open_notebook("fe.ipynb")
    lab_page.run_all()
    lab_page.wait_until("() => document.querySelectorAll('.nbdebug-ui').length >= 2", timeout=60)
    kinds = lab_page.page.evaluate(
        "() => Array.from(document.querySelectorAll('.nbdebug-ui')).map(e => e.className)")
    assert any("nbdebug-ui-graph" in k for k in kinds) and any("nbdebug-ui-heatmap" in k for k in kinds)
    assert len(fetched) == 1, fetched
    assert not [e for e in lab_page.errors if "nbdebug" in e], lab_page.errors
