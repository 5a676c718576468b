"""The debugger panel in a real JupyterLab, driven through real Chromium (issue 4).

The quickstart notebook runs cell by cell up to the cell that displays the panel (``dbg``); from there
on only the panel is used, as a user would: the graph's search reveals a node, a scope opens and closes,
a watchpoint through the "+" form (a bad value first, its error under its field, then TO), CONTINUE into
the hit on ``Torch.log.0.forward``, the hit's View button, a dimension selection in the tensor view,
previous step and comparison, TERMINATE, and at the end a kernel restart marks the panels stale (the
server's log has no traceback meanwhile). A second, slow training then shows that a button acts while the
worker thread trains (PAUSE while running). Screenshots of the panel, the hit and the tensor view go to
tests/artifacts/.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from browser import LabPage

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PANEL = f"{NB} .nbdebug-panel"
ORIGIN = "Torch.log.0.forward"
VIEWPORT = {"width": 1440, "height": 2400}

# A second training, slow enough to click into while it runs (quickstart's 8 steps take milliseconds).
SLOW_TRAINING = """\
import time
slow_model = nn.Linear(4, 1)
slow_opt = torch.optim.SGD(slow_model.parameters(), lr=0.01)

def slow_train(steps=3000):
    for _ in range(steps):
        slow_opt.zero_grad()
        slow_model(torch.randn(2, 4)).pow(2).mean().backward()
        slow_opt.step()
        time.sleep(0.01)

slow = nbdebug.Debugger(slow_model)
slow.run(slow_train)
slow"""


# Hit rows squeezed below their content (they overlapped), watchpoint buttons pushed out of their box.
LAYOUT_PROBLEMS = """(sel) => {
    const p = document.querySelector(sel), out = [];
    p.querySelectorAll('.nbdebug-hit-row, .nbdebug-hit-group').forEach((r, i) => {
        if (r.getBoundingClientRect().height < r.scrollHeight - 1) out.push(`hit row ${i} squeezed`);
    });
    const box = p.querySelector('.nbdebug-watchpoints').getBoundingClientRect();
    p.querySelectorAll('.nbdebug-wp-row button, .nbdebug-hit-row button').forEach(b => {
        const r = b.getBoundingClientRect();
        if (r.right > box.right + 1 || r.width < 10) out.push(`button ${b.textContent} cut off`);
    });
    return out;
}"""


def panel_facts(lab: LabPage, index: int = 0) -> dict[str, Any]:
    """What a user reads on panel ``index`` of the notebook (for assertions and failure messages)."""
    return lab.page.evaluate("""([sel, index]) => {
        const p = document.querySelectorAll(sel)[index];
        if (!p) return null;
        const text = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : null; };
        const st = p.querySelector('.nbdebug-state [data-state]');
        return {state: st ? st.dataset.state : null, step: text('.nbdebug-step'), hits: text('.nbdebug-hit-count'),
                reason: text('.nbdebug-pause-reason'), control: text('.nbdebug-control-status'),
                error: text('.nbdebug-panel-error'), wp_message: text('.nbdebug-wp-message'),
                hit_rows: Array.from(p.querySelectorAll('.nbdebug-hit-group')).map(r => r.textContent.trim())};
    }""", [PANEL, index])


def expect(lab: LabPage, what: str, predicate_js: str, arg: Any = None, timeout: float = 30.0,
           index: int = 0) -> Any:
    """Wait for ``predicate_js``; on timeout fail saying what was awaited and what the panel shows."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        return lab.wait_until(predicate_js, timeout=timeout, arg=arg)
    except PlaywrightTimeout:
        raise AssertionError(f"{what}: not seen within {timeout:.0f} s; the panel shows "
                             f"{panel_facts(lab, index)}; console errors: {lab.errors[-5:]}") from None


def expect_state(lab: LabPage, state: str, timeout: float = 30.0, index: int = 0) -> None:
    expect(lab, f"panel {index} state {state!r}", """([sel, index, state]) => {
        const p = document.querySelectorAll(sel)[index];
        const e = p && p.querySelector('.nbdebug-state [data-state]');
        return e && e.dataset.state === state;
    }""", arg=[PANEL, index, state], timeout=timeout, index=index)


def shot(lab: LabPage, name: str, selector: str | None = None) -> Path:
    path = lab.screenshot(name, selector)
    lab.assert_not_blank(path)
    return path


def test_panel_drives_quickstart_training(lab_page: LabPage) -> None:
    lab = lab_page
    shutil.copy(QUICKSTART, lab.server.root / QUICKSTART.name)
    lab.page.set_viewport_size(VIEWPORT)  # tall: the whole panel fits on screen (screenshots)
    lab.open_notebook(QUICKSTART.name)
    cells = lab.cells()
    shows_panel = [i for i, (kind, src) in enumerate(cells) if kind == "code" and src.strip() == "dbg"]
    assert shows_panel, "the quickstart has no cell that displays the panel (`dbg`)"
    for i, (kind, _src) in enumerate(cells[:shows_panel[0] + 1]):
        if kind == "code":
            lab.run_cell(i)

    panel = lab.page.locator(PANEL).first
    expect(lab, "the panel rendered (graph drawn by nbdebug's front end, loaded from the labextension)",
           """(sel) => {
               const g = document.querySelector(sel + ' .nbdebug-graph');
               const ui = g && (g.classList.contains('nbdebug-ui-graph') ? g : g.querySelector('.nbdebug-ui-graph'));
               return ui && g.clientWidth > 100 && !g.querySelector('.nbdebug-missing');
           }""",
           arg=PANEL, timeout=60)
    expect_state(lab, "paused")
    start_log = lab.server.log_path.stat().st_size
    shot(lab, "ui-panel", PANEL)

    # A TO watchpoint through the "+" form (another condition first: the form follows the choice).
    panel.locator("button.nbdebug-wp-add").click()
    form = panel.locator(".nbdebug-wp-form")
    form.wait_for(state="visible")
    choose_condition(form, "TL")
    expect(lab, "the TL form shows its parameter fields",
           "(sel) => document.querySelector(sel + ' .nbdebug-wp-param-max_gt input')", arg=PANEL)
    form.locator(".nbdebug-wp-param-max_gt input").fill("big")  # a bad value first: its error, under it
    lab.page.wait_for_timeout(800)
    form.locator("button.nbdebug-wp-create").click()
    expect(lab, "the error under the bad field", """(sel) => {
        const e = document.querySelector(sel + ' .nbdebug-wp-error-max_gt');
        return e && e.textContent.includes('must be a number');
    }""", arg=PANEL)
    choose_condition(form, "TO")
    expect(lab, "the TO form has no parameter fields",
           "(sel) => !document.querySelector(sel + ' .nbdebug-wp-param') && "
           "document.querySelector(sel + ' .nbdebug-wp-summary').textContent.includes('NaN')", arg=PANEL)
    form.locator("button.nbdebug-wp-create").click()
    expect(lab, "the TO watchpoint in the list", """(sel) => {
        const rows = document.querySelectorAll(sel + ' .nbdebug-wp-row');
        return rows.length === 1 && rows[0].textContent.includes('TO');
    }""", arg=PANEL)
    assert not form.is_visible(), "the form stays open after Create"

    # CONTINUE runs into the hit on torch.log (step 3, the bad batch).
    panel.locator("button.nbdebug-continue").click()
    row = panel.locator(".nbdebug-hit-group", has_text=ORIGIN).first  # hits grouped by node
    expect(lab, f"a hit group for {ORIGIN}", """([sel, name]) => Array.from(
        document.querySelectorAll(sel + ' .nbdebug-hit-group')).some(r => r.textContent.includes(name))""",
           arg=[PANEL, ORIGIN], timeout=60)
    expect_state(lab, "paused")
    facts = panel_facts(lab)
    assert ORIGIN in facts["hit_rows"][0] and "step 3" in facts["hit_rows"][0], facts
    assert int(facts["hits"]) >= 1, facts
    # (The graph's hit badges: tests/test_ui_panel.py checks the marks message; the drawing is graph.ts's.)
    problems = lab.page.evaluate(LAYOUT_PROBLEMS, PANEL)
    assert not problems, problems
    shot(lab, "ui-hit", PANEL)

    # The graph's search box reveals the log op (opening its scopes) and the panel selects it.
    graph = f"{PANEL} .nbdebug-ui-graph"
    lab.page.locator(f"{graph} .ng-bar input").first.fill("Torch.log")
    lab.page.locator(f"{graph} .ng-results div", has_text=ORIGIN).first.click()
    expect(lab, f"{ORIGIN} selected from the graph's search", """([sel, name]) => {
        const t = document.querySelector(sel + ' .nbdebug-details-title');
        return t && t.textContent.includes(name);
    }""", arg=[PANEL, ORIGIN])
    # A scope opens when clicked and closes again.
    g = f"document.querySelector({graph!r}).nbdebugGraph"
    lab.page.evaluate(f"() => {g}.idle()")
    key = lab.page.evaluate(f"() => {g}.scopes().find(k => k.startsWith('forward:') && k !== 'forward:' "
                            f"&& !{g}.traits().expanded.includes(k))")
    assert key, lab.page.evaluate(f"() => [{g}.scopes(), {g}.traits()]")
    box = lab.page.evaluate(f"(k) => {g}.scopeBox(k)", key)
    lab.page.evaluate(f"([x, y]) => {g}.click(x, y)", [box["x"] + box["w"] / 2, box["y"] + box["h"] / 2])
    expect(lab, f"scope {key} open", f"(k) => {g}.traits().expanded.includes(k)", arg=key)
    lab.page.evaluate(f"(k) => {g}.collapse(k)", key)
    assert key not in lab.page.evaluate(f"() => {g}.traits()")["expanded"]

    # The hit's View button opens the tensor view: the log's output, 16 x 1, NaN in row 5.
    row.locator("button.nbdebug-hit-view").click()
    view = panel.locator(".nbdebug-tensor-view")
    view.wait_for(state="visible")
    expect(lab, "the tensor view titled with the hit's tensor", """([sel, name]) => {
        const t = document.querySelector(sel + ' .nbdebug-tensor-title');
        return t && t.textContent.includes(name) && /step 3 .*\\(16, 1\\)/.test(t.textContent);
    }""", arg=[PANEL, ORIGIN])
    expect(lab, "the heatmap drawn as wide as its place, in sight", """(sel) => {
        const v = document.querySelector(sel + ' .nbdebug-tensor-view');
        const cv = v.querySelector('.nbdebug-tensor-heatmap canvas.nbdebug-heat-canvas');
        const r = v.querySelector('.nbdebug-tensor-heatmap').getBoundingClientRect();
        return cv && cv.dataset.rows === '16' && cv.clientWidth > 100 && r.top >= 0 && r.top < innerHeight;
    }""", arg=PANEL)
    gap = lab.page.evaluate("""(sel) => {
        const marks = document.querySelectorAll(sel + ' .nbdebug-tensor-graph .nbdebug-rel-mark');
        if (!marks.length) return null;
        return Math.max(...Array.from(marks, m => {
            const rect = m.parentNode.querySelector('rect').getBoundingClientRect();
            return Math.abs(m.getBoundingClientRect().bottom - rect.top);
        }));
    }""", PANEL)
    assert gap is not None and gap < 20, f"hit marks are {gap} px away from their nodes in the relationships"
    before = tensor_facts(lab)
    assert len(before["table"]) == 16 and before["rows"] == [str(i) for i in range(16)], before
    assert [r for r, (v,) in enumerate(before["table"]) if v == "nan"] == [5], before  # the bad sample
    assert [r for r, c in enumerate(before["cells"]) if c == "nan"] == [5], before  # drawn as NaN
    view.locator(".nbdebug-slice-0 input").fill("4:8")
    view.locator(".nbdebug-slice-0 input").press("Enter")
    expect(lab, "the heatmap and table follow the new slice", """(sel) => {
        const v = document.querySelector(sel + ' .nbdebug-tensor-view');
        const table = v.querySelector('.nbdebug-tensor-table table');
        const cv = v.querySelector('.nbdebug-tensor-heatmap canvas.nbdebug-heat-canvas');
        return table && table.rows.length === 5 && cv && cv.dataset.rows === '4';
    }""", arg=PANEL)
    after = tensor_facts(lab)
    assert after["table"] == before["table"][4:8], after
    assert after["rows"] == ["4", "5", "6", "7"] and after["cols"] == ["0"], after  # original indices
    assert after["cells"][1] == "nan" and "NaN 1" in after["legend"], after  # NaN marked, not a gap
    shot(lab, "ui-tensor-view", f"{PANEL} .nbdebug-tensor-view")
    for label, title in (("Previous step", "previous step 2"), ("Comparison", "difference step 3")):
        view.locator(".nbdebug-tensor-mode button", has_text=label).click()
        expect(lab, f"the heatmap of the {label.lower()}", """([sel, title]) => {
            const v = document.querySelector(sel + ' .nbdebug-tensor-view');
            return v && v.textContent.includes(title);
        }""", arg=[PANEL, title])
    view.locator(".nbdebug-tensor-mode button", has_text="Current step").click()
    # Clicking a producer in the relationship diagram selects it (the kernel answers the click).
    producer = lab.page.evaluate("""(sel) => document.querySelector(
        sel + ' .nbdebug-tensor-graph .nbdebug-rel-node[data-depth="-1"]').dataset.name""", PANEL)
    panel.locator(f".nbdebug-tensor-graph .nbdebug-rel-node[data-name='{producer}'] rect").click()
    expect(lab, f"{producer} selected from the relationship diagram", """([sel, name]) => {
        const t = document.querySelector(sel + ' .nbdebug-details-title');
        return t && t.textContent.includes(name);
    }""", arg=[PANEL, producer])

    # TERMINATE ends training.
    panel.locator("button.nbdebug-terminate").click()
    expect_state(lab, "terminated")
    expect(lab, "the control bar after TERMINATE", """(sel) => {
        const p = document.querySelector(sel);
        return p.querySelector('.nbdebug-control-status').textContent.includes('terminated')
            && ['continue', 'pause', 'terminate'].every(b => p.querySelector('button.nbdebug-' + b).disabled);
    }""", arg=PANEL)

    # A button acts while the worker thread trains: PAUSE on a slower training's panel.
    lab.append_and_run(SLOW_TRAINING)
    slow = lab.page.locator(PANEL).nth(1)
    expect_state(lab, "running", timeout=60, index=1)
    expect(lab, "the running training's step counter advancing", """(sel) => {
        const p = document.querySelectorAll(sel)[1];
        return Number(p.querySelector('.nbdebug-step').textContent) >= 3;
    }""", arg=PANEL, index=1)
    slow.locator("button.nbdebug-pause").click()
    expect_state(lab, "paused", index=1)
    paused_at = panel_facts(lab, 1)["step"]
    lab.page.wait_for_timeout(500)
    assert panel_facts(lab, 1)["step"] == paused_at, "training went on after PAUSE"
    shot(lab, "ui-paused-while-running", f"{PANEL} >> nth=1")
    slow.locator("button.nbdebug-terminate").click()
    expect_state(lab, "terminated", index=1)

    problems = [e for e in lab.errors if any(k in e.lower() for k in ("widget", "plotly", "nbdebug", "anywidget"))]
    assert not problems, f"console errors from the panel's widgets: {problems}"

    # A kernel restart: the panels say they are stale. Nothing raised in the kernel meanwhile.
    lab.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.restartKernel()")
    expect(lab, "the stale banner", """(sel) => {
        const b = document.querySelector(sel + '.nbdebug-stale .nbdebug-stale-banner');
        return b && b.textContent.includes('kernel restarted');
    }""", arg=PANEL)
    log = lab.server.log_path.read_bytes()[start_log:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]


def choose_condition(form: Any, abbr: str) -> None:
    """Pick the condition whose option reads "… · ABBR — …" in the form's dropdown."""
    select = form.locator(".nbdebug-wp-condition select")
    labels = select.locator("option").all_text_contents()
    matches = [i for i, t in enumerate(labels) if t.replace("\xa0", " ").split(" · ")[-1].startswith(f"{abbr} ")]
    assert len(matches) == 1, f"condition {abbr} not offered once in {labels}"
    select.select_option(index=matches[0])


def tensor_facts(lab: LabPage) -> dict[str, Any]:
    """The value table (cell texts, row by row), the heatmap's tick labels and legend, and what its first
    column's cells are drawn as ("nan", "+inf", "-inf" by their colours, else "finite")."""
    return lab.page.evaluate("""(sel) => {
        const v = document.querySelector(sel + ' .nbdebug-tensor-view');
        const table = v.querySelector('.nbdebug-tensor-table table');
        const heat = v.querySelector('.nbdebug-tensor-heatmap');
        const cv = heat.querySelector('canvas.nbdebug-heat-canvas');
        const texts = c => Array.from(heat.querySelectorAll(c), e => e.textContent);
        const kinds = {'150,150,150': 'nan', '255,0,255': '+inf', '0,229,255': '-inf'};
        const cells = [];
        if (cv) {
            const nr = Number(cv.dataset.rows), nc = Number(cv.dataset.cols), ctx = cv.getContext('2d');
            for (let r = 0; r < nr; r++) {
                const y = Math.floor((r + 0.5) * cv.height / nr);
                const px = ctx.getImageData(Math.floor(0.5 * cv.width / nc), y, 1, 1);
                cells.push(kinds[Array.from(px.data.slice(0, 3)).join(',')] || 'finite');
            }
        }
        return {table: table ? Array.from(table.rows).slice(1).map(r => Array.from(r.cells).slice(1)
                                  .map(c => c.textContent.trim())) : null,
                rows: texts('.nbdebug-heat-ytick'), cols: texts('.nbdebug-heat-xtick'), cells,
                legend: texts('.nbdebug-heat-legend-item').join(' '),
                selection: Array.from(v.querySelectorAll('.nbdebug-slice input')).map(i => i.value)};
    }""", PANEL)
