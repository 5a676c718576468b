"""The graph pane in Chromium (#22 item 11): badges that never cover one another nor a section's title at
Fit, a pane that can be made taller by its grip and goes full screen, a module call at ``mix`` drawn as its
scope (not a node beside its own ops), and a search that matches op types and aliases and says when
nothing matches. Drawn by the built bundle on the harness page (graph_fixtures.py)."""

from __future__ import annotations

import graph_fixtures as fx
import pytest
import torch
import torch.nn as nn

import nbdebug
from nbdebug.ui.graph_data import GraphFeed

G = "document.getElementById('g').nbdebugGraph"

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def page(chromium):
    if not fx.BUNDLE.is_file():
        pytest.fail(f"front end not built: {fx.BUNDLE} (make frontend)")
    with fx.harness_page(browser=chromium) as p:
        yield p


@pytest.fixture(autouse=True)
def no_page_errors(page):
    page.errors.clear()
    yield
    assert not page.errors, page.errors


def _meet(a: dict, b: dict) -> bool:
    return (a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"]
            and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"])


def test_badges_never_overlap_nor_cover_a_section_title_at_fit(page):
    g = fx.gpt2()
    # TO on every optimizer and backward node, GE on every forward parameter: hundreds of badges
    badges = {str(i): ("TO" if row[3].startswith(("optimizer", "backward")) else "GE")
              for i, row in enumerate(g.nodes)
              if row[2] in ("parameter", "optimizer") or row[3].startswith("optimizer")}
    assert len(badges) > 100
    fx.draw(page, g.widget(marks={"badges": badges}))
    page.evaluate(f"() => {G}.fit()")
    drawn = page.evaluate(f"() => {G}.badgeBoxes()")
    assert drawn, "badges drawn"
    clashes = [(a["text"], b["text"]) for i, a in enumerate(drawn) for b in drawn[i + 1:] if _meet(a, b)]
    assert not clashes, clashes[:5]
    titles = [lb for lb in page.evaluate(f"() => {G}.labelBoxes()")
              if lb["text"] in ("FORWARD", "BACKWARD", "OPTIMIZER")]
    assert {t["text"] for t in titles} >= {"OPTIMIZER"}
    covered = [(b["text"], t["text"]) for b in drawn for t in titles if _meet(b, t)]
    assert not covered, covered
    # badges folded into a neighbour say how many more they stand for
    assert any("+" in b["text"] for b in drawn)
    (fx.REPO / "tests" / "artifacts").mkdir(exist_ok=True)
    page.locator("#g").screenshot(path=str(fx.REPO / "tests" / "artifacts" / "graph_badges_fit.png"))


def test_grip_makes_the_pane_taller_and_full_screen_covers_the_window(page):
    g = fx.gpt2()
    fx.draw(page, g.widget(sections=["forward"]))
    canvas = page.locator("#g canvas.ng-main")
    h0 = canvas.bounding_box()["height"]
    grip = page.locator("#g .ng-grip").bounding_box()
    page.mouse.move(grip["x"] + 50, grip["y"] + 4)
    page.mouse.down()
    page.mouse.move(grip["x"] + 50, grip["y"] + 204, steps=5)
    page.mouse.up()
    assert abs(canvas.bounding_box()["height"] - (h0 + 200)) <= 2
    page.click("#g .ng-full")
    assert page.evaluate(f"() => {G}.isFull()")
    vp = page.viewport_size
    root = page.evaluate("() => { const r = document.querySelector('.nbdebug-graph').getBoundingClientRect(); "
                         "return {x: r.x, y: r.y, w: r.width, h: r.height}; }")
    assert root["x"] == 0 and root["y"] == 0 and root["w"] == vp["width"] and root["h"] >= vp["height"] - 1
    assert page.evaluate(f"() => {G}.camera().H") > vp["height"] - 80
    page.screenshot(path=str(fx.REPO / "tests" / "artifacts" / "graph_fullscreen.png"))
    page.keyboard.press("Escape")
    assert not page.evaluate(f"() => {G}.isFull()")
    assert abs(canvas.bounding_box()["height"] - (h0 + 200)) <= 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.block(x))


def _mix_message():
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        model(torch.randn(2, 4)).sum().backward()
        dbg.step()
        return GraphFeed().full(dbg.graph)
    finally:
        dbg.close()


def test_a_module_call_at_mix_is_its_scope_not_a_node_beside_its_ops(page):
    msg = _mix_message()
    call = next(r[0] for r in msg["nodes"] if r[0].startswith("Module.block.Block.forward"))
    assert next(r[3] for r in msg["nodes"] if r[0] == call) == "forward:block"  # the kernel puts it in its box
    state = {"view": "graph", "height": 560, "expanded": ["forward:block"], "selected": "",
             "sections": ["forward"], "status": "offline"}
    fx.draw(page, {"state": state, "messages": [msg]})
    assert call in page.evaluate(f"() => {G}.hiddenModuleCalls()")
    drawn = page.evaluate(f"() => {G}.nodeBoxes()")
    assert call not in drawn, "the module call is drawn as a node inside (or beside) its own box"
    ops = [n for n in drawn if n.startswith(("Functional.linear", "Functional.relu", "Torch.relu"))]
    assert ops, drawn.keys()
    # no edge of the open box goes to the hidden call; the call's consumer (head) is fed by the box
    paths = page.evaluate(f"() => {G}.edgePaths()")
    assert not [p for p in paths if call in (p["a"], p["b"])]
    inner = next(r[0] for r in msg["nodes"] if r[0].startswith("Module.block.fc.Linear.forward"))
    assert inner not in page.evaluate(f"() => {G}.nodeBoxes()")  # nested: the fc box stands for its call too
    page.evaluate(f"() => {G}.collapse('forward:block')")
    assert page.evaluate(f"() => {G}.screenBox('{call}')") is None
    # the input's edge to the call is the box's edge
    assert page.evaluate(f"() => {G}.edgePath('Input.0', '{call}')") is not None
    # revealing the call selects it and leaves its box closed (the box stands for it)
    page.evaluate(f"(n) => {G}.reveal(n)", call)
    assert "forward:block" not in page.evaluate(f"() => {G}.traits()")["expanded"]


def _sdpa() -> fx.GraphBuilder:
    g = fx.GraphBuilder()
    x = g.node("input.x", "x", "input", "forward:", "input")
    q = g.node("attn.q.Linear.0", "Linear q", "op", "forward:attn", "linear", inputs=(x,))
    a = g.node("Functional.scaled_dot_product_attention.0.forward", "scaled_dot_product_attention", "op",
               "forward:attn", "scaled_dot_product_attention", inputs=(q, q, q))
    g.node("attn.o.Linear.0", "Linear o", "op", "forward:attn", "linear", inputs=(a,))
    return g


def test_search_matches_op_types_and_aliases_and_says_when_nothing_matches(page):
    g = _sdpa()
    fx.draw(page, g.widget(sections=["forward"]))
    page.fill("#g .ng-search", "softmax")
    page.wait_for_selector("#g .ng-results div[data-i]")
    first = page.locator("#g .ng-results div[data-i]").first.text_content()
    assert "scaled_dot_product_attention" in first
    page.press("#g .ng-search", "Enter")
    page.evaluate(f"() => {G}.idle()")
    assert page.evaluate(f"() => {G}.traits().selected") == "Functional.scaled_dot_product_attention.0.forward"
    page.fill("#g .ng-search", "nosuchop")
    page.wait_for_selector("#g .ng-results .ng-nomatch")
    assert page.locator("#g .ng-results").is_visible()
    assert "no node matches “nosuchop”" in page.locator("#g .ng-results").text_content()
