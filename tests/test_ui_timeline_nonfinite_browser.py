"""The run timeline in a real JupyterLab and Chromium shows a NaN the model computed: step 6 of a small model
gets a NaN input (its optimizer step skipped, as a GradScaler would), so every module's output_norm is NaN at
step 6 only; the heatmap marks step 6's column in every row in the tensor heatmap's NaN colour, with "NaN" on
hover, and the line chart marks it too — while the steps around it stay finite, unmarked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from test_ui_browser import PANEL, expect, shot

if TYPE_CHECKING:
    from browser import LabPage

pytest_plugins = ["browser"]

CELLS = [
    """import torch, nbdebug
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)
dbg = nbdebug.Debugger(model)
for i in range(10):
    opt.zero_grad()
    x = torch.randn(4, 3)
    if i == 6:
        x[0, 0] = float("nan")
    model(x).pow(2).mean().backward()
    if i != 6:
        opt.step()
print("trained", dbg.session.latest_step())""",
    "panel = dbg.panel()\npanel",
]

MARKS = """(sel) => {
    const gd = document.querySelector(sel + ' .nbdebug-timeline-plot.js-plotly-plot');
    if (!gd || !gd._fullData) return null;
    const t = gd._fullData.find(d => d.name === 'NaN / ±Inf');
    const l = gd._fullData.find(d => d.name === 'NaN / ±Inf (line)');
    const cells = gd._fullData.find(d => d.name === 'NaN / ±Inf cells');
    return t && l ? {x: Array.from(t.x), y: Array.from(t.y), color: Array.from(t.marker.color),
                     text: Array.from(t.text), lx: Array.from(l.x), ltext: Array.from(l.text),
                     rows: gd.layout.annotations.length, cells: cells ? cells.z.map(r => [r[5], r[6], r[7]]) : null,
                     z6: gd._fullData[0].z.map(r => r[6]), z5: gd._fullData[0].z.map(r => r[5])} : null;
}"""


def test_timeline_marks_a_computed_nan(lab_page: LabPage) -> None:
    lab = lab_page
    lab.page.set_viewport_size({"width": 1440, "height": 1600})
    lab.server.write_notebook("timeline_nan.ipynb", CELLS)
    lab.open_notebook("timeline_nan.ipynb")
    lab.run_cell(0)
    lab.wait_for_output("trained")
    lab.run_cell(1)
    expect(lab, "the panel", "(sel) => !!document.querySelector(sel + ' .nbdebug-timeline-toggle')", arg=PANEL,
           timeout=60)
    lab.page.locator(f"{PANEL} .nbdebug-timeline-toggle").first.click()
    expect(lab, "the timeline drawn with its NaN marks", f"(sel) => !!({MARKS})(sel)", arg=PANEL, timeout=60)
    marks = lab.page.evaluate(MARKS, PANEL)
    assert marks["rows"] == 3 and marks["x"] == [6, 6, 6] and marks["y"] == [0, 1, 2], marks  # step 6, each row
    assert set(marks["color"]) == {"#969696"}, marks  # the tensor heatmap's NaN colour
    assert all("step 6" in t and "NaN" in t for t in marks["text"]), marks
    assert marks["z6"] == [None, None, None] and None not in marks["z5"], marks  # no number there: the mark tells
    assert marks["cells"] == [[None, 0, None]] * 3, marks  # step 6's cells filled (0: NaN), not 5's nor 7's
    assert marks["lx"] == [6] and marks["ltext"] == ["NaN"], marks  # the line chart too
    shot(lab, "timeline-nan", f"{PANEL} .nbdebug-timeline")
    assert not [e for e in lab.errors if "plotly" in e.lower() or "timeline" in e.lower()], lab.errors
