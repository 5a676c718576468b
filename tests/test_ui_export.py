"""export_html: one self-contained HTML file (graph drawn by the inlined front end, hits, statistics) that
opens in Chromium from disk with no server and fetches nothing."""

import base64
import json
import re

import playwright  # noqa: F401  (Chromium through the shared `chromium` fixture)
import pytest
import torch
from conftest import Net, train_steps

import nbdebug
from nbdebug.ui.frontend import bundle_source
from nbdebug.ui.graph_view import GraphView


@pytest.fixture(scope="module")
def trained():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    train_steps(model, 2)
    dbg.watch("TL", "Functional.relu.0.forward", max_gt=0)
    dbg.recheck()
    yield dbg
    dbg.close()


def embedded(text, id_):
    m = re.search(rf'<script type="application/json" id="{id_}">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def assert_self_contained(text):
    assert not re.search(r"https?://", text), re.search(r".{60}https?://.{60}", text).group(0)
    assert not re.search(r"<script[^>]*\bsrc=", text) and not re.search(r"<link[^>]*\bhref=", text)
    src = re.search(r'<script type="text/plain" id="nbdebug-ui-src">(.*?)</script>', text, re.S).group(1)
    assert base64.b64decode(src).decode("utf-8") == bundle_source()  # the front end itself, inlined


def test_export_html_is_self_contained(trained, tmp_path):
    path = trained.export_html(tmp_path / "report.html")
    text = path.read_text()
    assert_self_contained(text)
    snap = embedded(text, "nbdebug-graph-data")
    assert snap["state"]["view"] == "graph" and snap["state"]["status"] == "live"
    graph = next(m for m in snap["messages"] if m["type"] == "graph")
    assert sorted(r[0] for r in graph["nodes"]) == sorted(trained.graph.nodes)
    marks = next(m for m in snap["messages"] if m["type"] == "marks")
    assert list(marks["badges"].values()) == ["TL"]
    # hits and statistics as plain tables
    assert "<h2>Hits (1)</h2>" in text and "Functional.relu.0.forward" in text
    st = trained.stats("Functional.linear.0.forward", "output.0")
    row = re.search(r"<tr><td>Functional\.linear\.0\.forward</td><td>output\.0</td>(.*?)</tr>", text).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row)
    assert cells[:5] == ["5×16", "float32", f"{st['max']:.6g}", f"{st['min']:.6g}", f"{st['mean']:.6g}"]
    with pytest.raises(ValueError, match=r"\.html"):
        trained.export_html(tmp_path / "report.pdf")


def test_graph_export_keeps_open_scopes_and_refuses_svg(trained, tmp_path):
    gv = GraphView(trained)
    gv.expand("forward:block/lin")
    gv.select("Functional.linear.1.forward")
    text = gv.export(tmp_path / "graph.html").read_text()
    assert_self_contained(text)
    state = embedded(text, "nbdebug-graph-data")["state"]
    assert state["expanded"] == ["forward:block", "forward:block/lin"]
    assert state["selected"] == "Functional.linear.1.forward"
    for bad in ("graph.svg", "graph.png"):
        with pytest.raises(ValueError, match=r"exports to \.html"):
            gv.export(tmp_path / bad)


def test_panel_export_keeps_the_viewed_slice(trained, tmp_path):
    from nbdebug.ui.panel import Panel

    p = Panel(trained, recommend=False)
    try:
        p.view("Functional.relu.0.forward", "output.0")
        p.tensor_view.set_selection(["1:3", "2:5"])
        text = p.export_html(tmp_path / "panel.html").read_text()
    finally:
        p.close()
    assert_self_contained(text)
    assert embedded(text, "nbdebug-graph-data")["state"]["selected"] == "Functional.relu.0.forward"
    assert "<h2>Viewed tensors (1)</h2>" in text and "[1:3, 2:5]" in text
    cur = trained.tensor("Functional.relu.0.forward", "output.0")[1:3, 2:5]
    table = text[text.index("<h2>Viewed tensors"):text.index("<h2>Node statistics")]
    cells = [re.findall(r"<td class=num>(.*?)</td>", r) for r in re.findall(r"<tr>(<td.*?)</tr>", table)]
    assert cells == [[f"{v:.6g}" for v in row] for row in cur.tolist()]


def test_offline_session_export(tmp_path, trained):
    from nbdebug.offline import OfflineSession
    from nbdebug.session.session import Session

    live = trained.session
    s = Session(framework=live.framework, framework_version=live.framework_version, live=False)
    s.graph, s.steps, s.step_index, s.store, s.store_step = (live.graph, dict(live.steps), live.step_index,
                                                             live.store, live.store_step)
    off = OfflineSession(s, path=str(tmp_path))
    text = off.export_html(tmp_path / "offline.html").read_text()
    assert_self_contained(text)
    assert embedded(text, "nbdebug-graph-data")["state"]["status"] == "offline"
    assert f"{len(trained.graph)} nodes" in text


def test_export_opens_in_chromium_with_no_server(trained, tmp_path, chromium):
    path = trained.export_html(tmp_path / "report.html")
    ctx = chromium.new_context()
    page = ctx.new_page()
    errors, requests = [], []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("request", lambda r: requests.append(r.url))
    try:
        page.goto(path.as_uri())
        # every view of the export drew: the graph and the run timeline, nothing else
        page.wait_for_function("window.nbdebugRendered && window.nbdebugRendered.length === "
                               "document.querySelectorAll('[data-nbdebug-snapshot]').length", timeout=20000)
        assert sorted(page.evaluate("window.nbdebugRendered")) == ["nbdebug-graph", "nbdebug-timeline"]
        assert errors == []
        assert all(u.startswith(("file:", "blob:", "data:")) for u in requests), requests
        assert page.evaluate("typeof window.nbdebugUI.renderStatic") == "function"
        # renderStatic ran on our element: the graph view's renderer took it
        assert page.evaluate("document.getElementById('nbdebug-graph').classList.contains('nbdebug-ui-graph')")
        assert page.evaluate("document.getElementById('nbdebug-graph').textContent.length") > 0
        n = page.evaluate("JSON.parse(document.getElementById('nbdebug-graph-data').textContent)"
                          ".messages.find(m => m.type === 'graph').nodes.length")
        assert n == len(trained.graph)
        assert page.locator("table").count() == 2
    finally:
        ctx.close()
