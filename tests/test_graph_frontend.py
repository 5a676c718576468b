"""The graph view of nbdebug's front end in Chromium: graph messages built in Python (graph_fixtures.py)
drawn by the built bundle on a harness page (``nbdebugUI.renderStatic``, or a scripted model), checked
through ``el.nbdebugGraph`` (see frontend/src/graph.ts) and screenshots in tests/artifacts/."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import graph_fixtures as fx
import pytest

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
G = "document.getElementById('g').nbdebugGraph"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def page(chromium):
    if not fx.BUNDLE.is_file():
        pytest.fail(f"front end not built: {fx.BUNDLE} (cd frontend && node build.mjs)")
    with fx.harness_page(browser=chromium) as p:
        yield p


@pytest.fixture(autouse=True)
def no_page_errors(page):
    page.errors.clear()
    yield
    assert not page.errors, page.errors


def shot(page, name: str) -> Path:
    from PIL import Image, ImageStat

    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"graph_{name}.png"
    page.locator("#g").screenshot(path=str(path))
    with Image.open(path) as img:
        rgb = img.convert("RGB")
        colors = rgb.getcolors(maxcolors=1 << 16)
        stddev = ImageStat.Stat(rgb.convert("L")).stddev[0]
    assert (len(colors) if colors else 1 << 16) >= 8 and stddev >= 6, f"{path.name} looks blank"
    return path


def stats(page) -> dict:
    return page.evaluate(f"() => {G}.stats()")


def overlaps(boxes: list[dict]) -> list[tuple[str, str]]:
    bad = []
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            if (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
                    and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]):
                bad.append((a["text"], b["text"]))
    return bad


def gpt2_open(g: fx.GraphBuilder, layer: int = 0) -> list[str]:
    return ["forward:transformer", "forward:transformer/h", f"forward:transformer/h/{layer}",
            f"forward:transformer/h/{layer}/attn", f"forward:transformer/h/{layer}/mlp"]


@pytest.mark.parametrize("case", ["residual", "gpt2_forward", "gpt2_all", "synthetic_5k"])
def test_labels_never_overlap_at_default_zoom(page, case):
    if case == "residual":
        w = fx.residual().widget(expanded=["forward:block"])
    elif case == "gpt2_forward":
        g = fx.gpt2()
        w = g.widget(sections=["forward"], expanded=gpt2_open(g))
    elif case == "gpt2_all":
        g = fx.gpt2()
        w = g.widget(expanded=[*gpt2_open(g), "backward:transformer", "optimizer:transformer.h.0.attn.c_attn.weight"])
    else:
        g = fx.synthetic(5000)
        w = g.widget(sections=["forward"], expanded=["forward:stage0", "forward:stage0/block0",
                                                     "forward:stage0/block0/attn"])
    fx.draw(page, w)
    boxes = page.evaluate(f"() => {G}.labelBoxes()")
    assert len(boxes) >= 5, boxes
    assert overlaps(boxes) == []
    # and the labels sit inside the canvas
    cam = page.evaluate(f"() => {G}.camera()")
    assert all(b["x"] + b["w"] > 0 and b["x"] < cam["W"] for b in boxes)
    shot(page, f"labels_{case}")


def test_labels_appear_as_you_zoom_in_and_stay_apart(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"], expanded=gpt2_open(g)))
    n0 = len(page.evaluate(f"() => {G}.labelBoxes()"))
    page.evaluate(f"() => {G}.zoom(0.25)")
    far = page.evaluate(f"() => {G}.labelBoxes()")
    page.evaluate(f"() => {G}.zoom(16)")
    near = page.evaluate(f"() => {G}.labelBoxes()")
    assert len(far) < n0, (len(far), n0)
    assert overlaps(far) == [] and overlaps(near) == []
    names = {b["text"] for b in near}
    assert names, "zoomed in, some node names are drawn"


def _segment_hits_rect(p, q, r, shrink=1.0) -> bool:
    x0, y0, x1, y1 = r["x"] + shrink, r["y"] + shrink, r["x"] + r["w"] - shrink, r["y"] + r["h"] - shrink
    (ax, ay), (bx, by) = p, q
    # Liang-Barsky clipping of the segment against the rectangle
    t0, t1 = 0.0, 1.0
    dx, dy = bx - ax, by - ay
    for pp, qq in ((-dx, ax - x0), (dx, x1 - ax), (-dy, ay - y0), (dy, y1 - ay)):
        if pp == 0:
            if qq < 0:
                return False
        else:
            t = qq / pp
            if pp < 0:
                t0 = max(t0, t)
            else:
                t1 = min(t1, t)
            if t0 > t1:
                return False
    return True


def test_residual_skip_edge_goes_beside_the_branch(page):
    fx.draw(page, fx.residual().widget(expanded=["forward:block"]))
    path = page.evaluate(f"() => {G}.edgePath('input.x', 'block.add.0')")
    assert path and len(path) >= 2, path
    boxes = {n: page.evaluate(f"(n) => {G}.nodeBox(n)", n) for n in fx.RESIDUAL_BRANCH}
    assert all(boxes.values()), boxes
    for a, b in zip(path, path[1:], strict=False):
        for name, r in boxes.items():
            assert not _segment_hits_rect(a, b, r), f"skip edge segment {a}->{b} crosses {name} {r}"
    # the branch is drawn between the two ends: the edge really runs alongside it
    ys = [r["y"] for r in boxes.values()]
    assert min(p[1] for p in path) < min(ys) and max(p[1] for p in path) > max(ys)
    # every other edge ends on its nodes (routes are ELK's, not straight lines through nodes)
    x_box = page.evaluate(f"() => {G}.nodeBox('input.x')")
    ln_path = page.evaluate(f"() => {G}.edgePath('input.x', 'block.ln.LayerNorm.0')")
    assert ln_path and abs(ln_path[0][1] - (x_box["y"] + x_box["h"])) < 1.5
    shot(page, "residual")


def test_expand_and_collapse_change_what_is_visible(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"]))
    s0 = stats(page)
    assert "forward:transformer" in page.evaluate(f"() => {G}.scopes()")
    page.evaluate(f"() => {G}.expand('forward:transformer')")
    page.evaluate(f"() => {G}.expand('forward:transformer/h')")
    page.evaluate(f"() => {G}.idle()")
    s1 = stats(page)
    assert s1["visibleItems"] > s0["visibleItems"] and s1["visibleBoxes"] > s0["visibleBoxes"]
    assert page.evaluate(f"() => {G}.traits().expanded").count("forward:transformer/h") == 1
    page.evaluate(f"() => {G}.expand('forward:transformer/h/2')")
    s2 = stats(page)
    assert s2["visibleNodes"] > s1["visibleNodes"]
    # only the opened scope and its ancestors were laid out again
    assert s2["computedScopes"] <= 4, s2
    shot(page, "gpt2_expanded")
    page.evaluate(f"() => {G}.collapse('forward:transformer')")
    s3 = stats(page)
    assert s3["visibleItems"] == s0["visibleItems"] and s3["visibleNodes"] == s0["visibleNodes"]
    assert "forward:transformer" not in page.evaluate(f"() => {G}.traits().expanded")


def test_reveal_opens_the_scopes_selects_and_centres(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"]))
    name = next(n for n in g.ids if n.startswith("transformer.h.3.attn.softmax"))
    assert page.evaluate(f"(n) => {G}.nodeBox(n)", name) is None
    page.evaluate(f"(n) => {G}.reveal(n)", name)
    t = page.evaluate(f"() => {G}.traits()")
    for k in ("forward:transformer", "forward:transformer/h", "forward:transformer/h/3",
              "forward:transformer/h/3/attn"):
        assert k in t["expanded"], t
    assert t["selected"] == name
    sb = page.evaluate(f"(n) => {G}.screenBox(n)", name)
    cam = page.evaluate(f"() => {G}.camera()")
    assert sb is not None
    assert abs(sb["x"] + sb["w"] / 2 - cam["W"] / 2) < 2 and abs(sb["y"] + sb["h"] / 2 - cam["H"] / 2) < 2
    assert any(b["text"] == "softmax" for b in page.evaluate(f"() => {G}.labelBoxes()"))
    shot(page, "reveal")


def test_reveal_of_an_optimizer_node_shows_its_section(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"]))
    name = "transformer.h.0.mlp.c_fc.weight.adamw.3"
    page.evaluate(f"(n) => {G}.reveal(n)", name)
    t = page.evaluate(f"() => {G}.traits()")
    assert "optimizer" in t["sections"] and "optimizer:transformer.h.0.mlp.c_fc.weight" in t["expanded"]
    assert page.evaluate(f"(n) => {G}.nodeBox(n)", name) is not None


def test_search_box_reveals_the_first_match(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"]))
    page.fill("#g .ng-search", "h.4.mlp.act")
    page.wait_for_selector("#g .ng-results div")
    page.press("#g .ng-search", "Enter")
    page.evaluate(f"() => {G}.idle()")
    name = next(n for n in g.ids if n.startswith("transformer.h.4.mlp.act"))
    assert page.evaluate(f"() => {G}.traits().selected") == name
    assert page.evaluate(f"(n) => {G}.nodeBox(n)", name) is not None


def test_clicks_select_nodes_and_toggle_scopes(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"], expanded=["forward:transformer"]))
    canvas = page.locator("#g canvas.ng-main").bounding_box()
    sb = page.evaluate(f"() => {G}.screenBox('input_ids')")
    page.mouse.click(canvas["x"] + sb["x"] + sb["w"] / 2, canvas["y"] + sb["y"] + sb["h"] / 2)
    assert page.evaluate(f"() => {G}.traits().selected") == "input_ids"
    # a collapsed scope box opens where it is
    before = stats(page)["visibleNodes"]
    # click the drop scope box (from its node's representative: use the edge from the add node)
    path = page.evaluate(f"() => {G}.edgePath('transformer.add.5', 'transformer.drop.Dropout.6')")
    assert path, "edge from the add node to the drop scope"
    x, y = path[-1]
    cam = page.evaluate(f"() => {G}.camera()")
    sx, sy = x * cam["k"] + cam["tx"], y * cam["k"] + cam["ty"] + 8
    page.mouse.click(canvas["x"] + sx, canvas["y"] + sy)
    page.evaluate(f"() => {G}.idle()")
    assert "forward:transformer/drop" in page.evaluate(f"() => {G}.traits().expanded")
    assert stats(page)["visibleNodes"] == before + 1
    # clicking the open scope's header closes it
    fr = page.evaluate(f"() => {G}.scopeBox('forward:transformer/drop')")
    assert fr["open"]
    k = page.evaluate(f"() => {G}.camera().k")
    page.mouse.click(canvas["x"] + fr["x"] + fr["w"] / 2, canvas["y"] + fr["y"] + 15 * k)
    page.evaluate(f"() => {G}.idle()")
    assert "forward:transformer/drop" not in page.evaluate(f"() => {G}.traits().expanded")


def test_sections_toggle(page):
    g = fx.gpt2()
    fx.draw(page, g.widget())
    assert any(k == "optimizer:" for k in page.evaluate(f"() => {G}.scopes()"))
    page.click("#g .ng-secs button:text('Forward')")
    page.evaluate(f"() => {G}.idle()")
    assert page.evaluate(f"() => {G}.traits().sections") == ["forward"]
    scopes = page.evaluate(f"() => {G}.scopes()")
    assert "optimizer:" not in scopes and "backward:" not in scopes
    page.click("#g .ng-secs button:text('+ Backward')")
    page.evaluate(f"() => {G}.idle()")
    assert "backward:" in page.evaluate(f"() => {G}.scopes()")
    shot(page, "sections_fb")


def test_marks_badges_paused_ring_and_path(page):
    g = fx.gpt2()
    soft = next(i for n, i in g.ids.items() if n.startswith("transformer.h.1.attn.softmax"))
    lnf = next(i for n, i in g.ids.items() if n.startswith("transformer.ln_f"))
    marks = {"badges": {str(soft): "TO GE", str(g.ids["input_ids"]): "NAN"}, "paused": g.ids["input_ids"],
             "path": [g.ids["input_ids"], soft], "error": lnf}
    fx.draw(page, g.widget(sections=["forward"], marks=marks))
    badges = page.evaluate(f"() => {G}.badgeBoxes()")
    texts = {b["text"]: b["ref"] for b in badges}
    assert texts.get("NAN") == f"n{g.ids['input_ids']}"
    # the hidden softmax's badge sits on the collapsed scope holding it
    assert texts.get("TO GE") == "sforward:transformer", texts
    # the paused node has a red ring: sample pixels just outside its box
    sb = page.evaluate(f"() => {G}.screenBox('input_ids')")
    rgb = page.evaluate("""(b) => { const c = document.querySelector('#g canvas.ng-main');
        const d = window.devicePixelRatio || 1; const ctx = c.getContext('2d');
        const px = ctx.getImageData(Math.round((b.x + b.w / 2) * d), Math.round((b.y + b.h + 4) * d), 1, 1).data;
        return [px[0], px[1], px[2]]; }""", sb)
    assert rgb[0] > 180 and rgb[1] < 90 and rgb[2] < 90, rgb
    # the path's edge (input_ids → the scope holding the softmax) is drawn in orange
    pts = page.evaluate(f"(n) => {G}.edgePath('input_ids', n)", g.nodes[soft][0])
    cam = page.evaluate(f"() => {G}.camera()")
    (x0, y0), (x1, y1) = pts[0], pts[1]
    mx, my = ((x0 + x1) / 2) * cam["k"] + cam["tx"], ((y0 + y1) / 2) * cam["k"] + cam["ty"]
    rgb = page.evaluate("""([x, y]) => { const c = document.querySelector('#g canvas.ng-main');
        const d = window.devicePixelRatio || 1;
        const px = c.getContext('2d').getImageData(Math.round(x * d), Math.round(y * d), 1, 1).data;
        return [px[0], px[1], px[2]]; }""", [mx, my])
    assert rgb[0] > 200 and 80 < rgb[1] < 170 and rgb[2] < 80, rgb
    shot(page, "marks")
    page.evaluate(f"() => {G}.reveal('{g.nodes[soft][0]}')")
    badges = page.evaluate(f"() => {G}.badgeBoxes()")
    assert any(b["text"] == "TO GE" and b["ref"] == f"n{soft}" for b in badges)


SCRIPTED = """(graph) => {
  const handlers = {};
  const state = {view: 'graph', height: 400, expanded: [], selected: '', sections: ['forward'], status: 'live'};
  const model = { sent: [], get: k => state[k],
    set: (k, v) => { state[k] = v; (handlers['change:' + k] || []).forEach(f => f()); },
    save_changes() {}, on: (e, f) => { (handlers[e] = handlers[e] || []).push(f); },
    off: (e, f) => { handlers[e] = (handlers[e] || []).filter(x => x !== f); },
    send(m) { this.sent.push(m); if (m.type === 'hello') setTimeout(() => model.emit(graph), 0); },
    emit: (m) => (handlers['msg:custom'] || []).forEach(f => f(m, [])) };
  window.model = model;
  const el = document.getElementById('g'); if (window.cleanup) window.cleanup();
  window.cleanup = nbdebugUI.render({ model, el });
  return el.nbdebugGraph.ready.then(() => model.sent.map(m => m.type));
}"""


def test_delta_applies_incrementally_and_a_gap_asks_for_the_graph(page):
    g = fx.residual()
    sent = page.evaluate(SCRIPTED, g.message(rev=3))
    assert sent == ["hello"]
    page.evaluate(f"() => {G}.expand('forward:block')")
    n0 = stats(page)["visibleNodes"]
    n = len(g.nodes)
    delta = {"type": "delta", "rev": 4, "base": 3,
             "nodes": [["block.extra.0", "extra", "op", "forward:block", "relu", n, "4×8", "float32"]],
             "changed": [[0, ["input.x", "x renamed", "input", "forward:block", "input", 0, "4×8", "float32"]]],
             "scopes": [], "edges": [g.ids["block.add.0"], n]}
    page.evaluate("(d) => window.model.emit(d)", delta)
    page.evaluate(f"() => {G}.idle()")
    assert stats(page)["visibleNodes"] == n0 + 1
    assert page.evaluate(f"() => {G}.edgePath('block.add.0', 'block.extra.0')")
    page.evaluate(f"() => {G}.zoom(3)")
    # a delta on another base: the view asks for the whole graph again
    page.evaluate("(d) => window.model.emit(d)", {**delta, "rev": 9, "base": 7})
    assert page.evaluate("() => window.model.sent.map(m => m.type)") == ["hello", "hello"]


def test_second_view_of_a_model_draws_from_the_cache(page):
    g = fx.residual()
    page.evaluate(SCRIPTED, g.message(rev=1))
    res = page.evaluate("""async () => { const el2 = document.createElement('div'); document.body.appendChild(el2);
        const t = performance.now(); const c = nbdebugUI.render({ model: window.model, el: el2 });
        await el2.nbdebugGraph.ready; const ms = performance.now() - t;
        const out = { ms, sent: window.model.sent.map(m => m.type), nodes: el2.nbdebugGraph.stats().visibleItems };
        c(); el2.remove(); return out; }""")
    assert res["sent"] == ["hello"], res  # no second hello: the graph came from the model's cache
    assert res["nodes"] > 0


def test_hover_card_shows_the_row_at_once(page):
    g = fx.residual()
    fx.draw(page, g.widget(expanded=["forward:block"]))
    canvas = page.locator("#g canvas.ng-main").bounding_box()
    sb = page.evaluate(f"() => {G}.screenBox('block.fc1.Linear.0')")
    page.mouse.move(canvas["x"] + sb["x"] + sb["w"] / 2, canvas["y"] + sb["y"] + sb["h"] / 2)
    page.wait_for_selector("#g .ng-card", state="visible")
    text = page.inner_text("#g .ng-card")
    assert "block.fc1.Linear.0" in text and "linear" in text and "4×32" in text and "float32" in text


def test_status_label(page):
    w = fx.residual().widget(status="closed")
    fx.draw(page, w)
    assert "closed" in page.inner_text("#g .ng-status")


def _bench():
    spec = importlib.util.spec_from_file_location("nbdebug_bench_ui_browser",
                                                  Path(__file__).resolve().parents[1] / "bench" / "ui_browser.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_timings_within_loose_bounds(page):
    """Targets: 5k open ≤ 1 s, 50k ≤ 3 s, expanding a scope ≤ 300 ms; bounds here 3× (shared machine)."""
    b = _bench()
    assert b.open_collapsed(page, 5000, runs=1)["open_ms"] < 3000
    assert b.open_collapsed(page, 50000, runs=1)["open_ms"] < 9000
    ex = b.expand_scope(page, 5000)
    assert ex["visible_after"] > ex["visible_before"] and ex["expand_ms"] < 900
    pan = b.pan_frames(page, 5000, steps=30)
    assert pan["median_ms"] < 50


def test_protocol_messages_hover_click_commands_marks_and_status(page):
    g = fx.gpt2()
    page.evaluate(SCRIPTED, g.message(rev=1))
    canvas = page.locator("#g canvas.ng-main").bounding_box()
    sb = page.evaluate(f"() => {G}.screenBox('input_ids')")
    page.mouse.move(canvas["x"] + sb["x"] + sb["w"] / 2, canvas["y"] + sb["y"] + sb["h"] / 2)
    page.wait_for_selector("#g .ng-card", state="visible")
    page.evaluate("() => window.model.emit({type: 'card', name: 'input_ids', "
                  "rows: [['max', '0.389687'], ['nan', '0']]})")
    assert "0.389687" in page.inner_text("#g .ng-card")
    page.mouse.click(canvas["x"] + sb["x"] + sb["w"] / 2, canvas["y"] + sb["y"] + sb["h"] / 2)
    sent = page.evaluate("() => window.model.sent")
    assert {"type": "hover", "name": "input_ids"} in sent and {"type": "click", "name": "input_ids"} in sent
    # the kernel's reveal command opens the scopes, selects and centres
    name = next(n for n in g.ids if n.startswith("transformer.h.5.mlp.act"))
    page.evaluate("(n) => window.model.emit({type: 'command', action: 'reveal', name: n})", name)
    page.evaluate(f"() => {G}.idle()")
    assert page.evaluate(f"() => {G}.traits().selected") == name
    assert page.evaluate(f"(n) => {G}.nodeBox(n)", name) is not None
    page.evaluate("() => window.model.emit({type: 'command', action: 'fit'})")
    cam = page.evaluate(f"() => {G}.camera()")
    assert cam["k"] < 0.5  # the whole (tall) forward section fits
    # marks replace the previous ones
    i = g.ids[name]
    page.evaluate("(i) => window.model.emit({type: 'marks', badges: {[i]: 'NAN'}, paused: i, error: -1, path: []})", i)
    page.evaluate("() => window.model.emit({type: 'command', action: 'fit-selection'})")
    assert [b["text"] for b in page.evaluate(f"() => {G}.badgeBoxes()")] == ["NAN"]
    page.evaluate("() => window.model.emit({type: 'marks', badges: {}, paused: -1, error: -1, path: []})")
    page.evaluate(f"() => {G}.frame()")
    assert page.evaluate(f"() => {G}.badgeBoxes()") == []
    # the kernel changes traits: the view follows
    page.evaluate("() => window.model.set('sections', ['forward', 'backward'])")
    page.evaluate(f"() => {G}.idle()")
    assert "backward:" in page.evaluate(f"() => {G}.scopes()")
    page.evaluate("() => window.model.set('status', 'closed')")
    assert "closed" in page.inner_text("#g .ng-status")
    shot(page, "protocol")


def test_a_big_flat_scope_opens_fast_with_edges_beside_the_nodes(page):
    """Scopes of more than 300 direct children take the fast layered layout (layout-fast.ts)."""
    g = fx.flat(1900)
    fx.draw(page, g.widget())
    ms = page.evaluate(f"async () => {{ const t = performance.now(); await {G}.expand('forward:big'); "
                       "return performance.now() - t; }")
    assert stats(page)["visibleNodes"] >= 1900
    assert ms < 900, ms  # target 300 ms; 3x on the shared machine
    boxes = page.evaluate(f"() => {G}.nodeBoxes()")
    edges = page.evaluate(f"() => {G}.edgePaths()")
    # a window of the graph: its nodes never overlap and no edge runs through a node it does not touch
    window = {k: b for k, b in boxes.items() if b["y"] < boxes["big.op150"]["y"]}
    assert len(window) > 100
    items = sorted(window.items(), key=lambda kv: kv[1]["y"])
    for i, (na, a) in enumerate(items):
        for nb, b in items[i + 1:i + 12]:
            assert not (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"]
                        and b["y"] < a["y"] + a["h"]), (na, nb)
    crossing = []
    for e in edges:
        if e["a"] not in window and e["b"] not in window:
            continue
        for p, q in zip(e["pts"], e["pts"][1:], strict=False):
            for name, r in window.items():
                if name not in (e["a"], e["b"]) and _segment_hits_rect(p, q, r, shrink=1.5):
                    crossing.append((e["a"], e["b"], name))
    assert crossing == []
    # skip edges (every fifth op reads the op five back) exist and are drawn
    assert any(e["a"] == "big.op4" and e["b"] == "big.op9" and len(e["pts"]) > 2 for e in edges)
    page.evaluate("(n) => document.getElementById('g').nbdebugGraph.reveal(n)", "big.op40")
    assert overlaps(page.evaluate(f"() => {G}.labelBoxes()")) == []
    shot(page, "flat_1900")


def test_a_view_rendered_before_it_is_in_the_page_frames_itself_when_shown(page):
    g = fx.residual()
    res = page.evaluate("""async (data) => {
        const el = document.createElement('div'); el.style.width = '900px';
        const cleanup = nbdebugUI.renderStatic(el, data);
        await el.nbdebugGraph.ready;
        document.body.appendChild(el);
        await new Promise(r => setTimeout(r, 300));
        const api = el.nbdebugGraph, cam = api.camera();
        const boxes = Object.keys(api.nodeBoxes()).map(n => api.screenBox(n));
        cleanup(); el.remove();
        return { W: cam.W, H: cam.H, boxes };
    }""", g.widget(expanded=["forward:block"]))
    assert 880 <= res["W"] <= 900
    assert len(res["boxes"]) == len(g.nodes)
    for b in res["boxes"]:
        assert 0 <= b["x"] and b["x"] + b["w"] <= res["W"] and 0 <= b["y"] and b["y"] + b["h"] <= res["H"], b
    # centred in the width it has now, not the width it guessed while out of the page
    x0 = min(b["x"] for b in res["boxes"])
    x1 = max(b["x"] + b["w"] for b in res["boxes"])
    assert abs((x0 + x1) / 2 - res["W"] / 2) < 40, (x0, x1, res["W"])


def test_wheel_zooms_at_the_pointer_drag_pans_and_fit_buttons(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"], expanded=gpt2_open(g), selected="input_ids"))
    canvas = page.locator("#g canvas.ng-main").bounding_box()
    c0 = page.evaluate(f"() => {G}.camera()")
    px, py = canvas["x"] + 300, canvas["y"] + 200
    page.mouse.move(px, py)
    page.mouse.wheel(0, -300)
    page.wait_for_function(f"(k) => {G}.camera().k > k * 1.2", arg=c0["k"])
    c1 = page.evaluate(f"() => {G}.camera()")
    # the graph point under the pointer stays under it
    wx0, wy0 = (300 - c0["tx"]) / c0["k"], (200 - c0["ty"]) / c0["k"]
    assert abs(wx0 * c1["k"] + c1["tx"] - 300) < 1 and abs(wy0 * c1["k"] + c1["ty"] - 200) < 1
    page.mouse.move(px, py)
    page.mouse.down()
    page.mouse.move(px + 120, py + 60, steps=5)
    page.mouse.up()
    c2 = page.evaluate(f"() => {G}.camera()")
    assert abs(c2["tx"] - c1["tx"] - 120) < 1 and abs(c2["ty"] - c1["ty"] - 60) < 1
    assert page.evaluate(f"() => {G}.traits().selected") == "input_ids"  # a drag is not a click
    page.click("#g .ng-fit")
    c3 = page.evaluate(f"() => {G}.camera()")
    boxes = page.evaluate(f"() => Object.keys({G}.nodeBoxes()).map(n => {G}.screenBox(n))")
    assert all(0 <= b["x"] and b["x"] + b["w"] <= c3["W"] and 0 <= b["y"] and b["y"] + b["h"] <= c3["H"] for b in boxes)
    page.click("#g .ng-fitsel")
    sb = page.evaluate(f"() => {G}.screenBox('input_ids')")
    c4 = page.evaluate(f"() => {G}.camera()")
    assert abs(sb["x"] + sb["w"] / 2 - c4["W"] / 2) < 2 and c4["k"] > c3["k"]


def test_height_trait_and_rows_without_labels(page):
    g = fx.residual()
    msg = g.message(rev=1)
    msg["nodes"][g.ids["block.act.GELU.0"]][1] = ""
    page.evaluate(SCRIPTED, msg)
    page.evaluate(f"() => {G}.reveal('block.act.GELU.0')")
    assert "GELU.0" in [b["text"] for b in page.evaluate(f"() => {G}.labelBoxes()")]
    h0 = page.locator("#g canvas.ng-main").bounding_box()["height"]
    page.evaluate("() => window.model.set('height', 600)")
    page.wait_for_function(
        "(h) => document.querySelector('#g canvas.ng-main').getBoundingClientRect().height > h + 150", arg=h0)
    assert page.evaluate(f"() => {G}.camera().H") > h0 + 150


def test_opening_hundreds_of_scopes_at_once_takes_the_fast_layout(page):
    """A saved state that opens 1,300 scopes of a 50k graph (ELK alone: ~15 s here)."""
    g = fx.synthetic(50000)
    keys = [k for k in g.scopes
            if any(k == f"forward:stage{i}" or k.startswith(f"forward:stage{i}/") for i in range(3))]
    r = fx.draw(page, g.widget(sections=["forward"], expanded=keys))
    st = stats(page)
    assert st["visibleNodes"] > 9000 and st["computedScopes"] > 1000
    assert r["openMs"] < 3000, r
    boxes = page.evaluate(f"() => {G}.nodeBoxes()")
    items = sorted(boxes.items(), key=lambda kv: (kv[1]["y"], kv[1]["x"]))[:1500]
    for i, (na, a) in enumerate(items):
        for nb, b in items[i + 1:i + 20]:
            assert not (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"]
                        and b["y"] < a["y"] + a["h"]), (na, nb)
    assert overlaps(page.evaluate(f"() => {G}.labelBoxes()")) == []
    shot(page, "bulk_open_50k")
