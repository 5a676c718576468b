"""The heatmap and relationship views of nbdebug's front end in a real Chromium, without JupyterLab: a
harness page loads the built bundle (``nbdebug/ui/static/nbdebug-ui.js``) and draws snapshots of a real
tensor view's widgets with ``nbdebugUI.renderStatic`` (the path ``export_html`` and saved notebooks use).
Screenshots go to tests/artifacts/ (heat-*.png, relations.png)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import playwright  # noqa: F401  (Chromium through the shared `chromium` fixture)
import pytest
import torch
import torch.nn as nn
from browser import ARTIFACTS

import nbdebug
from nbdebug.ui.frontend import bundle_source
from nbdebug.ui.panel import Panel

pytest_plugins = ["browser"]

LOG = "Torch.log.0.forward"
ORIGIN = "http://nbdebug.test"
HARNESS = """<!doctype html><html><body style="margin:8px;background:#fff">
<div id="heat" style="width:720px"></div><div id="single" style="width:360px"></div>
<div id="rel" style="width:720px"></div>
<script type="module">
import * as ui from './nbdebug-ui.js';
window.nbdebugUI = ui;
window.ready = true;
</script></body></html>"""
# the special cells' colours (frontend/src/heatmap-colour.ts SPECIAL)
NAN, POS_INF, NEG_INF = [150, 150, 150], [255, 0, 255], [0, 229, 255]


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


@pytest.fixture(scope="module")
def snapshots() -> dict[str, Any]:
    """Snapshots of a tensor view on ``log`` of a 10 × 6 input: NaN at [5, 1], +Inf at [6, 2], −Inf at [4, 3];
    the heatmap sliced to rows 4:8, and a single column 4:8, 2."""
    x = torch.linspace(0.05, 2.0, 60).reshape(10, 6)  # log changes sign in rows 4..7
    x[5, 1], x[6, 2], x[4, 3] = -1.0, float("inf"), 0.0
    model = Log()
    dbg = nbdebug.Debugger(model, level="mix")
    model(x)
    dbg.watch("TO")
    dbg.recheck()
    panel = Panel(dbg, recommend=False)
    try:
        tv = panel.tensor_view
        tv.open(LOG, "output.0")
        tv.set_selection(["4:8", ":"])
        heat = tv.heatmap.snapshot()
        tv.set_selection(["4:8", "2:3"])  # a single column kept as a column
        single = tv.heatmap.snapshot()
        rel = tv.relations.snapshot()
        return {"heat": heat, "single": single, "rel": rel}
    finally:
        panel.close()
        dbg.close()


@pytest.fixture
def page(chromium: Any) -> Iterator[Any]:
    bundle = bundle_source()
    ctx = chromium.new_context(viewport={"width": 800, "height": 1000})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)

    def serve(route: Any) -> None:
        if route.request.url.endswith("/nbdebug-ui.js"):
            route.fulfill(body=bundle, content_type="text/javascript")
        else:
            route.fulfill(body=HARNESS, content_type="text/html")

    pg.route(f"{ORIGIN}/**", serve)
    pg.goto(f"{ORIGIN}/harness.html")
    pg.wait_for_function("() => window.ready === true")
    pg.errors = errors
    try:
        yield pg
    finally:
        ctx.close()


def render(pg: Any, target: str, snap: dict[str, Any]) -> None:
    pg.evaluate("([id, snap]) => { window.nbdebugUI.renderStatic(document.getElementById(id), snap); }",
                [target, snap])


def cell_pixel(pg: Any, target: str, r: int, c: int) -> list[int]:
    """The RGB at the centre of cell (r, c) (positions in the drawn selection) of the heatmap in ``target``."""
    return pg.evaluate("""([id, r, c]) => {
        const cv = document.querySelector('#' + id + ' canvas.nbdebug-heat-canvas');
        const [nr, nc] = [Number(cv.dataset.rows), Number(cv.dataset.cols)];
        const x = Math.floor((c + 0.5) * cv.width / nc), y = Math.floor((r + 0.5) * cv.height / nr);
        return Array.from(cv.getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3));
    }""", [target, r, c])


def texts(pg: Any, selector: str) -> list[str]:
    return pg.evaluate("(sel) => Array.from(document.querySelectorAll(sel), e => e.textContent)", selector)


def test_heatmap_labels_original_indices_and_marks_nan_and_infinities(page, snapshots):
    render(page, "heat", snapshots["heat"])
    assert texts(page, "#heat .nbdebug-heat-ytick") == ["4", "5", "6", "7"]
    assert texts(page, "#heat .nbdebug-heat-xtick") == ["0", "1", "2", "3", "4", "5"]
    assert "current step 0" in texts(page, "#heat .nbdebug-heat-title")[0]
    # rows 4..7 of the tensor are rows 0..3 of the drawing
    assert cell_pixel(page, "heat", 1, 1) == NAN
    assert cell_pixel(page, "heat", 2, 2) == POS_INF
    assert cell_pixel(page, "heat", 0, 3) == NEG_INF
    finite = cell_pixel(page, "heat", 0, 0)
    assert finite not in (NAN, POS_INF, NEG_INF)
    legend = " ".join(texts(page, "#heat .nbdebug-heat-legend-item"))
    assert "NaN 1" in legend and "+Inf 1" in legend and "−Inf 1" in legend
    # a diverging scale centred on 0 (log of values below and above 1): the colour bar is labelled ±m and 0
    bar = texts(page, "#heat .nbdebug-heat-bartick")
    assert bar[2] == "0" and bar[0] == bar[1].replace("-", "")
    # hover readout with the original indices
    box = page.locator("#heat canvas.nbdebug-heat-canvas").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 1.5 / 6, box["y"] + box["height"] * 1.5 / 4)
    assert texts(page, "#heat .nbdebug-heat-readout") == ["[5, 1] = NaN"]
    page.mouse.move(box["x"] + box["width"] * 2.5 / 6, box["y"] + box["height"] * 2.5 / 4)
    assert texts(page, "#heat .nbdebug-heat-readout") == ["[6, 2] = +Inf"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator("#heat").screenshot(path=str(ARTIFACTS / "heat-slice.png"))

    render(page, "single", snapshots["single"])
    assert texts(page, "#single .nbdebug-heat-xtick") == ["2"]  # one integer tick, not −0.4…0.4
    assert texts(page, "#single .nbdebug-heat-ytick") == ["4", "5", "6", "7"]
    assert cell_pixel(page, "single", 2, 0) == POS_INF
    page.locator("#single").screenshot(path=str(ARTIFACTS / "heat-single-column.png"))
    assert page.errors == []


def test_relations_diagram_draws_nodes_and_hit_marks(page, snapshots):
    render(page, "rel", snapshots["rel"])
    (msg,) = snapshots["rel"]["messages"]
    names = page.evaluate("() => Array.from(document.querySelectorAll('#rel .nbdebug-rel-node'), "
                          "g => g.dataset.name)")
    assert names == [n[0] for n in msg["nodes"]] and LOG in names
    assert texts(page, "#rel .nbdebug-rel-center .nbdebug-rel-mark") == ["TO"]
    assert page.evaluate("() => document.querySelectorAll('#rel .nbdebug-rel-edge').length") == len(msg["edges"]) // 2
    # upstream left of the node, downstream right
    xs = page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll('#rel .nbdebug-rel-node'),
        g => [g.dataset.name, g.getBoundingClientRect().x]))""")
    for name, _label, _cls, depth, _marks in msg["nodes"]:
        assert (xs[name] > xs[LOG]) == (depth > 0) and (xs[name] < xs[LOG]) == (depth < 0)
    page.locator("#rel").screenshot(path=str(ARTIFACTS / "relations.png"))
    assert page.errors == []


# A model the page drives itself: the kernel's messages arrive after the view rendered (as live ones do).
LIVE_RENDER = """(id) => {
    const handlers = [];
    const model = {get: k => ({view: 'heatmap', height: 420})[k], set() {}, save_changes() {},
                   on: (e, cb) => { if (e === 'msg:custom') handlers.push(cb); }, off() {}, send() {}};
    window.nbdebugUI.render({model, el: document.getElementById(id)});
    window['handlers_' + id] = handlers;
}"""
LIVE_MESSAGE = """([id, msg, b64]) => {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const t0 = performance.now();
    for (const cb of window['handlers_' + id]) cb(msg, [new DataView(bytes.buffer)]);
    return performance.now() - t0;
}"""


def live_render(pg: Any, target: str, msg: dict[str, Any], plane: Any) -> float:
    """Render ``target`` with a live model, then (a kernel's message a while later) send it ``msg``."""
    import base64

    pg.evaluate(LIVE_RENDER, target)
    pg.wait_for_timeout(1100)  # later than the answer to a view's hello (which never scrolls)
    return pg.evaluate(LIVE_MESSAGE, [target, msg, base64.b64encode(plane.tobytes()).decode("ascii")])


def test_a_new_tensor_scrolls_into_view_and_large_ones_are_cut(page):
    import numpy as np

    from nbdebug.ui.heatmap_data import MAX_HEAT, heatmap_message

    page.evaluate("""() => { const s = document.createElement('div'); s.style.height = '3000px';
        const el = document.createElement('div'); el.id = 'far'; el.style.width = '720px';
        document.body.append(s, el); window.scrollTo(0, 0); }""")
    x = np.random.default_rng(0).standard_normal((1000, 700)).astype(np.float32)
    msg, plane = heatmap_message(x, ["100:", ":"], title="big", step="current step 1", reveal=True)
    ms = live_render(page, "far", msg, plane)
    page.wait_for_function("() => window.scrollY > 2000")  # the view scrolled itself into sight
    title = texts(page, "#far .nbdebug-heat-title")[0]
    assert f"showing the first {MAX_HEAT}×{MAX_HEAT} of 900×700" in title
    rows = [int(t) for t in texts(page, "#far .nbdebug-heat-ytick")]
    cols = [int(t) for t in texts(page, "#far .nbdebug-heat-xtick")]
    assert rows[0] == 100 and all(b > a for a, b in zip(rows, rows[1:]))  # noqa: B905
    assert cols[0] == 0 and cols[-1] < MAX_HEAT and len(cols) < 40
    boxes = page.evaluate("() => Array.from(document.querySelectorAll('#far .nbdebug-heat-xtick'), "
                          "e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; })")
    assert all(a[1] <= b[0] for a, b in zip(boxes, boxes[1:])), "x tick labels overlap"  # noqa: B905
    assert ms < 1000, f"drawing 512×512 cells took {ms:.0f} ms"
    page.locator("#far").screenshot(path=str(ARTIFACTS / "heat-large.png"))
    # a 1-D tensor: one row, column ticks only
    msg, plane = heatmap_message(np.linspace(-1, 1, 9), [":"], title="vector", step="current step 1")
    live_render(page, "heat", msg, plane)
    assert texts(page, "#heat .nbdebug-heat-ytick") == []
    assert texts(page, "#heat .nbdebug-heat-xtick") == [str(i) for i in range(9)]
    page.locator("#heat").screenshot(path=str(ARTIFACTS / "heat-vector.png"))
    # nothing to draw: a value that is not retained (the reason is shown), an empty selection
    from nbdebug.ui.heatmap_data import empty_message

    why = "step 0 has statistics but no retained value"
    live_render(page, "single", empty_message("gone", "current step 0", why), np.zeros(0, np.float32))
    assert texts(page, "#single .nbdebug-heat-readout") == [why]
    msg, plane = heatmap_message(np.zeros((3, 0), np.float32), [":", ":"], title="none", step="s")
    live_render(page, "rel", msg, plane)
    assert texts(page, "#rel .nbdebug-heat-readout") == ["nothing to draw: the selection has 3×0 elements"]
    assert page.errors == []
