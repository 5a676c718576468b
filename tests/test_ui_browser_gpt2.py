"""The whole panel flow on a GPT-2-sized model, in real JupyterLab + Chromium, as a user drives it.

A 6-layer GPT-2 (``transformers`` from a config, random weights) trains at ``mix`` on the kernel's worker
thread; a forward hook of the user's puts a huge value (1e8) into layer 2's MLP input projection (``c_fc``)
at step 3, which a TL (tensor too large) watchpoint catches.
Through the panel only: search a node and reveal it, open and close scopes, create a watchpoint through
the form (a bad value first), CONTINUE into the hit, view the tensor, slice it, previous step and
difference, PAUSE while training runs, TERMINATE; then the saved notebook shows the panel's last state
without a kernel, and a kernel restart marks the panel stale. The server's log (kernel included) has no
traceback from start to end; every screenshot is checked to be non-blank.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from browser import ARTIFACTS

if TYPE_CHECKING:
    from browser import LabPage

NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PANEL = f"{NB} .nbdebug-panel"
GRAPH = f"{PANEL} .nbdebug-ui-graph"
SETUP = """\
import torch, nbdebug
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                   bos_token_id=0, eos_token_id=0))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ids = torch.randint(0, 100, (2, 16))
BAD_STEP, done = 3, [0]

def poison(module, inputs, output):      # the bug to find: a huge value in layer 2's c_fc at BAD_STEP
    if done[0] == BAD_STEP:
        output = output.clone()
        output[0, 0, 0] = 1e8
        return output

model.transformer.h[2].mlp.c_fc.register_forward_hook(poison)

def train(steps=60):
    for _ in range(steps):
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
        done[0] += 1"""
PANEL_CELL = """\
dbg = nbdebug.Debugger(model, level="mix")
dbg.run(train, steps=1)
dbg"""


pytestmark = pytest.mark.usefixtures("built_extension")  # tests/browser.py


def facts(lab: LabPage) -> dict[str, Any]:
    return lab.page.evaluate("""(sel) => {
        const p = document.querySelector(sel);
        if (!p) return null;
        const t = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : null; };
        const st = p.querySelector('.nbdebug-state [data-state]');
        return {state: st ? st.dataset.state : null, step: t('.nbdebug-step'), hits: t('.nbdebug-hit-count'),
                details: t('.nbdebug-details-title'), reason: t('.nbdebug-pause-reason'),
                groups: Array.from(p.querySelectorAll('.nbdebug-hit-group')).map(r => r.textContent.trim())};
    }""", PANEL)


def expect(lab: LabPage, what: str, predicate_js: str, arg: Any = None, timeout: float = 60.0) -> Any:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        return lab.wait_until(predicate_js, timeout=timeout, arg=arg)
    except PlaywrightTimeout:
        raise AssertionError(f"{what}: not seen within {timeout:.0f} s; the panel shows {facts(lab)}; "
                             f"console errors: {lab.errors[-5:]}") from None


def expect_state(lab: LabPage, state: str, timeout: float = 120.0) -> None:
    expect(lab, f"state {state!r}", """([sel, state]) => {
        const e = document.querySelector(sel + ' .nbdebug-state [data-state]');
        return e && e.dataset.state === state;
    }""", arg=[PANEL, state], timeout=timeout)


def graph(lab: LabPage, expr: str, arg: Any = None) -> Any:
    """Evaluate ``expr`` with ``g`` = the panel graph's test API (awaited)."""
    return lab.page.evaluate(f"""async (arg) => {{
        const g = document.querySelector({json.dumps(GRAPH)}).nbdebugGraph;
        return await ({expr});
    }}""", arg)


def shot(lab: LabPage, name: str, selector: str | None = None) -> Path:
    path = lab.screenshot(name, selector)
    lab.assert_not_blank(path)
    return path


def check_details(lab: LabPage, name: str) -> None:
    """The details of ``name`` (a module call, drawn as its scope's box): the consumers and producers listed are
    the nodes at the other end of the edges the graph view has out of / into it, and some are; the graph draws
    the box's edge to its first consumer; every value preview is readable: its cell takes most of the pane's
    width (the old layout left the value column about 40 px of a 650 px pane)."""
    expect(lab, f"the details of {name}", """([sel, name]) => {
        const t = document.querySelector(sel + ' .nbdebug-details-title');
        return t && t.textContent.includes(name) && document.querySelector(sel + ' .nbdebug-details-value');
    }""", arg=[PANEL, name])
    lab.page.wait_for_timeout(500)  # the links come in the same refresh as the title, one message each
    listed = lab.page.evaluate("""(sel) => Object.fromEntries(['consumers', 'producers'].map(k => [k,
        Array.from(document.querySelectorAll(sel + ' .nbdebug-details-' + k + ' .nbdebug-details-link'))
            .map(b => b.textContent.trim()).sort()]))""", PANEL)
    sent = {"consumers": graph(lab, "g.edgesFrom(arg)", name), "producers": graph(lab, "g.edgesTo(arg)", name)}
    assert listed == sent and sent["consumers"] and sent["producers"], (name, listed, sent)
    assert name in graph(lab, "g.hiddenModuleCalls()")
    graph(lab, "g.idle()")
    key = "forward:" + "/".join(name.split(".")[1:-3])
    assert graph(lab, "g.scopeBox(arg)", key) is not None, key
    drawn = [e for e in graph(lab, "g.edgePaths()") if e["a"] in (f"s{key}", f"out:{key}")]
    assert drawn, f"no edge drawn out of the box of {key}"
    widths = lab.page.evaluate("""(sel) => {
        const pane = document.querySelector(sel + ' .nbdebug-details').getBoundingClientRect().width;
        return {pane, values: Array.from(document.querySelectorAll(sel + ' .nbdebug-details-value'))
            .map(c => c.getBoundingClientRect().width)};
    }""", PANEL)
    assert widths["pane"] > 300 and widths["values"], widths
    assert min(widths["values"]) >= 0.6 * widths["pane"], widths


def test_gpt2_panel_flow(lab_page: LabPage) -> None:
    lab = lab_page
    lab.page.set_viewport_size({"width": 1440, "height": 2000})
    lab.server.write_notebook("gpt2.ipynb", [SETUP, PANEL_CELL])
    lab.open_notebook("gpt2.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0, timeout=300)
    lab.run_cell(1, timeout=300)
    expect_state(lab, "paused")
    expect(lab, "the graph drawn", "(sel) => { const e = document.querySelector(sel); "
           "return e && e.nbdebugGraph && e.nbdebugGraph.stats().visibleItems > 0; }", arg=GRAPH)
    graph(lab, "g.ready")
    assert lab.page.locator(f"{PANEL} .nbdebug-missing").count() == 0
    labels = graph(lab, "g.labelBoxes()")
    overlaps = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]
                if a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"]
                and b["y"] < a["y"] + a["h"]]
    assert labels and not overlaps, overlaps[:3]
    shot(lab, "gpt2-panel", PANEL)

    # Search: the graph's search box finds c_fc of layer 2; choosing it opens the scopes on the way,
    # selects the node and the rest of the panel (details) follows.
    search = lab.page.locator(f"{GRAPH} .ng-bar input").first
    search.fill("h.2.mlp.c_fc")
    expect(lab, "search results", f"() => document.querySelectorAll({json.dumps(GRAPH + ' .ng-results div')})"
           ".length > 0")
    lab.page.locator(f"{GRAPH} .ng-results div", has_text="Module.transformer.h.2.mlp.c_fc").first.click()
    expect(lab, "the revealed node selected in the details", """(sel) => {
        const t = document.querySelector(sel + ' .nbdebug-details-title');
        return t && t.textContent.includes('h.2.mlp.c_fc');
    }""", arg=PANEL)
    graph(lab, "g.idle()")
    traits = graph(lab, "g.traits()")
    assert "h.2.mlp.c_fc" in traits["selected"], traits
    assert "forward:transformer/h/2/mlp" in traits["expanded"], traits
    if traits["selected"] in graph(lab, "g.hiddenModuleCalls()"):  # at mix a module call is its scope's box
        assert graph(lab, "g.scopeBox(arg)", "forward:transformer/h/2/mlp/c_fc") is not None
    else:
        assert graph(lab, "g.screenBox(arg)", traits["selected"]) is not None  # drawn, in the open scopes
    shot(lab, "gpt2-revealed", GRAPH)

    # Open and close a scope by clicking it, as a user does.
    key = "forward:transformer/h/4"
    assert key not in graph(lab, "g.traits()")["expanded"] and key in graph(lab, "g.scopes()")
    box = graph(lab, "g.scopeBox(arg)", key)
    assert box is not None, "layer 4 is not drawn as a collapsed box"
    before = graph(lab, "g.stats().visibleNodes")
    graph(lab, "g.click(arg[0], arg[1])", [box["x"] + box["w"] / 2, box["y"] + box["h"] / 2])
    expect(lab, "layer 4 open", f"() => document.querySelector({json.dumps(GRAPH)}).nbdebugGraph.traits()"
           f".expanded.includes({json.dumps(key)})")
    graph(lab, "g.idle()")
    assert graph(lab, "g.stats().visibleNodes") > before
    graph(lab, "g.collapse(arg)", key)
    assert key not in graph(lab, "g.traits()")["expanded"]
    assert graph(lab, "g.stats().visibleNodes") == before

    # A watchpoint through the form: a bad value first (its error under its field), then a good one.
    panel = lab.page.locator(PANEL).first
    panel.locator("button.nbdebug-wp-add").click()
    form = panel.locator(".nbdebug-wp-form")
    form.wait_for(state="visible")
    select = form.locator(".nbdebug-wp-condition select")
    options = select.locator("option").all_text_contents()
    select.select_option(index=next(i for i, t in enumerate(options) if " TL " in t.replace("\xa0", " ")))
    expect(lab, "the TL fields", "(sel) => document.querySelector(sel + ' .nbdebug-wp-param-max_gt input')",
           arg=PANEL)
    form.locator(".nbdebug-wp-param-max_gt input").fill("huge")
    lab.page.wait_for_timeout(800)
    form.locator("button.nbdebug-wp-create").click()
    expect(lab, "the error under max >", """(sel) => {
        const e = document.querySelector(sel + ' .nbdebug-wp-error-max_gt');
        return e && e.textContent.includes('must be a number');
    }""", arg=PANEL)
    form.locator(".nbdebug-wp-param-max_gt input").fill("1e6")
    lab.page.wait_for_timeout(800)
    form.locator("button.nbdebug-wp-create").click()
    expect(lab, "the TL watchpoint listed", """(sel) => Array.from(document.querySelectorAll(
        sel + ' .nbdebug-wp-row')).some(r => r.textContent.includes('TL'))""", arg=PANEL)

    # CONTINUE into the hit: step 3, first at layer 2's c_fc.
    panel.locator("button.nbdebug-continue").click()
    expect(lab, "a hit", "(sel) => document.querySelectorAll(sel + ' .nbdebug-hit-group').length > 0",
           arg=PANEL, timeout=180)
    expect_state(lab, "paused")
    f = facts(lab)
    assert "h.2.mlp.c_fc" in f["groups"][0] and "step 3" in f["groups"][0], f
    assert f["step"] == "3", f  # one step convention: the header shows the step the hits are in
    graph(lab, "g.idle()")
    assert graph(lab, "g.badgeBoxes()"), "no hit badge drawn on the graph"
    shot(lab, "gpt2-hit", PANEL)
    check_details(lab, "Module.transformer.h.2.mlp.c_fc.Conv1D.forward.0")
    shot(lab, "gpt2-details", f"{PANEL} .nbdebug-details")
    # its consumer, the activation's module call (a box too), through the details' link
    act = "Module.transformer.h.2.mlp.act.NewGELUActivation.forward.0"
    panel.locator(".nbdebug-details-consumers .nbdebug-details-link", has_text=act).first.click()
    check_details(lab, act)

    # View the hit's tensor, slice it, previous step, difference.
    panel.locator(".nbdebug-hit-group").first.locator("button.nbdebug-hit-view").first.click()
    view = panel.locator(".nbdebug-tensor-view")
    view.wait_for(state="visible")
    expect(lab, "the heatmap in sight", """(sel) => {
        const v = document.querySelector(sel + ' .nbdebug-tensor-view');
        const cv = v && v.querySelector('canvas.nbdebug-heat-canvas');
        const r = v && v.getBoundingClientRect();
        return cv && cv.clientWidth > 100 && r.top < innerHeight && r.bottom > 0;
    }""", arg=PANEL)
    view.locator(".nbdebug-slice-2 input").fill("8:16")
    view.locator(".nbdebug-slice-2 input").press("Enter")
    expect(lab, "columns 8…15 after slicing", """(sel) => {
        const cv = document.querySelector(sel + ' .nbdebug-tensor-view canvas.nbdebug-heat-canvas');
        return cv && cv.dataset.cols === '8';
    }""", arg=PANEL)
    ticks = lab.page.evaluate("""(sel) => Array.from(document.querySelectorAll(
        sel + ' .nbdebug-tensor-view .nbdebug-heat-xtick')).map(e => e.textContent)""", PANEL)
    assert ticks and all(8 <= int(t) <= 15 for t in ticks), ticks
    for label, title in (("Previous step", "previous step 2"), ("Comparison", "difference step 3")):
        view.locator(".nbdebug-tensor-mode button", has_text=label).click()
        expect(lab, f"the heatmap of the {label.lower()}", """([sel, title]) => {
            const v = document.querySelector(sel + ' .nbdebug-tensor-view');
            return v && v.textContent.includes(title);
        }""", arg=[PANEL, title])
    shot(lab, "gpt2-tensor-difference", f"{PANEL} .nbdebug-tensor-view")

    # PAUSE while training runs (the watchpoint off, so nothing else stops it), then TERMINATE.
    panel.locator(".nbdebug-wp-row .nbdebug-wp-enabled input").first.uncheck()
    lab.page.wait_for_timeout(800)
    panel.locator("button.nbdebug-continue").click()
    expect_state(lab, "running")
    expect(lab, "training advancing", "(sel) => Number(document.querySelector(sel + ' .nbdebug-step')"
           ".textContent) >= 5", arg=PANEL, timeout=120)
    panel.locator("button.nbdebug-pause").click()
    expect_state(lab, "paused")
    paused_at = facts(lab)["step"]
    lab.page.wait_for_timeout(1500)
    assert facts(lab)["step"] == paused_at, "training went on after PAUSE"
    panel.locator("button.nbdebug-terminate").click()
    expect_state(lab, "terminated")
    shot(lab, "gpt2-terminated", PANEL)

    # The saved notebook shows the panel's last state without a kernel: its static snapshot is hidden
    # while the live panel is drawn, and is what a kernel-less renderer (nbconvert's HTML) shows.
    snap = lab.page.locator(f"{NB} .nbdebug-snapshot")
    expect(lab, "the snapshot output present", f"() => document.querySelector({json.dumps(NB + ' .nbdebug-snapshot')})")
    assert not snap.first.is_visible(), "the static snapshot shows next to the live panel"
    lab.page.wait_for_timeout(2500)  # the snapshot is rewritten at most every 2 s
    lab.command("docmanager:save")
    lab.page.wait_for_timeout(1500)
    saved = json.loads((lab.server.root / "gpt2.ipynb").read_text())
    html_out = [o for o in saved["cells"][1]["outputs"] if "text/html" in o.get("data", {})]
    assert html_out and "nbdebug-snapshot" in "".join(html_out[-1]["data"]["text/html"])
    text = "".join(html_out[-1]["data"]["text/html"])
    assert "terminated" in text and "h.2.mlp.c_fc" in text, text[:500]
    meta = len(json.dumps(saved["metadata"].get("widgets", {})))
    assert meta < 300_000, f"{meta} bytes of widget state saved for one panel"
    out = lab.server.root / "gpt2.html"
    res = lab.server.jupyter("nbconvert", "--to", "html", "--output", str(out), str(lab.server.root / "gpt2.ipynb"))
    assert res.returncode == 0, res.stderr[-2000:]
    page = lab.context.new_page()
    page.goto(out.as_uri())
    page.locator(".nbdebug-snapshot").first.wait_for(state="visible")
    assert "h.2.mlp.c_fc" in page.locator(".nbdebug-snapshot").first.inner_text()
    saved_shot = ARTIFACTS / "gpt2-saved-snapshot.png"
    page.locator(".nbdebug-snapshot").first.screenshot(path=str(saved_shot))
    lab.assert_not_blank(saved_shot)
    page.close()

    # A kernel restart: the old panel says it is stale.
    lab.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.restartKernel()")
    expect(lab, "the stale banner", """(sel) => {
        const b = document.querySelector(sel + '.nbdebug-stale .nbdebug-stale-banner');
        return b && b.textContent.includes('kernel restarted');
    }""", arg=PANEL)
    shot(lab, "gpt2-stale", PANEL)
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    problems = [e for e in lab.errors if any(k in e.lower() for k in ("widget", "nbdebug", "anywidget"))]
    assert not problems, problems
