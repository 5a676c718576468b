"""The run timeline in a real JupyterLab and Chromium: a small model trains 14 steps (step 9's input is ×100),
the panel's Timeline opens (plotly.js loaded from the labextension's static files), a click on step 9 in the
heatmap scrubs the panel: the header shows step 9 and the node details show step 9's statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from test_ui_browser import PANEL, expect, panel_facts, shot

if TYPE_CHECKING:
    from browser import LabPage

pytest_plugins = ["browser"]

CELLS = [
    """import torch, nbdebug
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Sequential(nn.Linear(5, 4), nn.Tanh()), nn.Linear(4, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
dbg = nbdebug.Debugger(model)
for i in range(14):
    opt.zero_grad()
    model(torch.randn(4, 3) * (100.0 if i == 9 else 1.0)).pow(2).mean().backward()
    opt.step()
node = "Module.0.Linear.forward.0"
from nbdebug.ui.tensor_math import stat_texts  # as the node details format it
want = stat_texts(dbg.stats(node, "output.0", 9), ["max"])["max"]
print("trained", dbg.session.latest_step(), "step-9-max", want)""",
    "panel = dbg.panel()\npanel.select(node)\npanel",
]

# the pixel position of (step, row) in the timeline's heatmap
CELL_XY = """([sel, step]) => {
    const gd = document.querySelector(sel + ' .nbdebug-timeline-plot.js-plotly-plot');
    const xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis, box = gd.getBoundingClientRect();
    return [box.left + xa._offset + xa.l2p(step), box.top + ya._offset + ya.l2p(0)];
}"""


def test_timeline_click_scrubs_the_panel(lab_page: LabPage) -> None:
    lab = lab_page
    lab.page.set_viewport_size({"width": 1440, "height": 2000})
    lab.server.write_notebook("timeline.ipynb", CELLS)
    lab.open_notebook("timeline.ipynb")
    lab.run_cell(0)
    lab.wait_for_output("trained 13")
    want = next(o for o in lab.outputs() if "step-9-max" in o).split("step-9-max ")[1].split()[0]
    lab.run_cell(1)
    expect(lab, "the panel at step 13", "(sel) => { const e = document.querySelector(sel + ' .nbdebug-step');"
           " return e && e.textContent.trim() === '13'; }", arg=PANEL, timeout=60)
    lab.page.locator(f"{PANEL} .nbdebug-timeline-toggle").first.click()
    expect(lab, "the timeline drawn by plotly", """(sel) => {
        const gd = document.querySelector(sel + ' .nbdebug-timeline-plot.js-plotly-plot');
        return gd && gd._fullData && gd._fullData.length > 3 && gd._fullData[0].z.length > 0; }""",
           arg=PANEL, timeout=60)
    info = lab.page.evaluate("""(sel) => { const gd = document.querySelector(sel + ' .nbdebug-timeline-plot');
        return {rows: gd.layout.annotations.map(a => a.text), x: Array.from(gd._fullData[0].x),
                title: document.querySelector(sel + ' .nbdebug-timeline-title').textContent}; }""", PANEL)
    assert info["x"] == list(range(14)), info
    assert any(r.endswith("0 (Linear)") for r in info["rows"]) and "showing step 13" in info["title"], info
    shot(lab, "timeline-open", f"{PANEL} .nbdebug-timeline")
    x, y = lab.page.evaluate(CELL_XY, [PANEL, 9])
    lab.page.mouse.move(x, y)
    lab.page.mouse.click(x, y)
    expect(lab, "the header at step 9 after the click", "(sel) => { const e = document.querySelector(sel + "
           "' .nbdebug-step'); return e && e.textContent.trim() === '9'; }", arg=PANEL, timeout=30)
    expect(lab, "the node details with step 9's max", """([sel, want]) => {
        const t = document.querySelector(sel + ' .nbdebug-details');
        return t && t.textContent.includes(want); }""", arg=[PANEL, want], timeout=30)
    expect(lab, "the timeline's line at step 9", """(sel) => {
        const gd = document.querySelector(sel + ' .nbdebug-timeline-plot');
        return gd._fullLayout.shapes.some(s => s.x0 === 9); }""", arg=PANEL, timeout=30)
    facts = panel_facts(lab)
    assert facts["step"] == "9" and not facts["error"], facts
    shot(lab, "timeline-scrubbed", PANEL)
    assert not [e for e in lab.errors if "plotly" in e.lower() or "timeline" in e.lower()], lab.errors
