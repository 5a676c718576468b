"""Panel lifecycle and polish in real browsers: a kernel restart marks the old panel stale (JupyterLab);
the panel plus the lab extension's commands work in Jupyter Notebook 7; the watchpoint form shows every
field's error under it at full width; the quickstart's later cells run after its panel was used.

The stale banner comes from the lab extension (``labextension/src/stale.ts``): on a kernel restart or
shutdown every ``.nbdebug-panel`` of that notebook gets ``nbdebug-stale`` and a banner, and the CSS
greys it and makes it inert. Both tests check that the kernel's log (the server's log) shows no
exception while the panel is used.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from browser import LabPage

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "notebooks" / "quickstart.ipynb"
NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PANEL = f"{NB} .nbdebug-panel"
CELLS = [
    """\
import torch, nbdebug
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def train(steps=1000):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(2, 4)).pow(2).mean().backward()
        opt.step()""",
    """\
dbg = nbdebug.Debugger(model)
dbg.run(train, paused=True)
dbg""",
]


pytestmark = pytest.mark.usefixtures("built_extension")  # tests/browser.py


def header(lab: LabPage) -> dict[str, Any]:
    return lab.page.evaluate("""(sel) => {
        const p = document.querySelector(sel);
        if (!p) return null;
        const t = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : null; };
        const st = p.querySelector('.nbdebug-state [data-state]');
        return {state: st ? st.dataset.state : null, step: t('.nbdebug-step'), running: t('.nbdebug-step-running'),
                stale: p.classList.contains('nbdebug-stale'), banner: t('.nbdebug-stale-banner')};
    }""", PANEL)


def wait_state(lab: LabPage, state: str, timeout: float = 60.0) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        lab.wait_until("""([sel, state]) => {
            const e = document.querySelector(sel + ' .nbdebug-state [data-state]');
            return e && e.dataset.state === state;
        }""", arg=[PANEL, state], timeout=timeout)
    except PlaywrightTimeout:
        raise AssertionError(f"panel state {state!r} not seen; header: {header(lab)}; "
                             f"console errors: {lab.errors[-5:]}") from None


def log_since(lab: LabPage, offset: int) -> str:
    return lab.server.log_path.read_bytes()[offset:].decode(errors="replace")


def shot(lab: LabPage, name: str, selector: str | None = None) -> None:
    lab.assert_not_blank(lab.screenshot(name, selector))


def test_kernel_restart_marks_the_panel_stale(lab_page: LabPage) -> None:
    lab = lab_page
    lab.server.write_notebook("stale.ipynb", CELLS)
    lab.open_notebook("stale.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    lab.run_cell(1)
    wait_state(lab, "paused")
    assert header(lab)["stale"] is False
    assert "Traceback" not in log_since(lab, start), log_since(lab, start)[-3000:]

    lab.page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.restartKernel()")
    lab.wait_until("""(sel) => {
        const b = document.querySelector(sel + '.nbdebug-stale .nbdebug-stale-banner');
        return b && b.textContent.includes('kernel restarted');
    }""", arg=PANEL, timeout=60)
    facts = header(lab)
    assert facts["banner"] == "kernel restarted — this panel is no longer live; run the cell again", facts
    inert = lab.page.evaluate("""(sel) => {
        const b = document.querySelector(sel + ' button.nbdebug-continue');
        let e = b, pe = 'auto';
        while (e && pe !== 'none') { pe = getComputedStyle(e).pointerEvents; e = e.parentElement; }
        const st = getComputedStyle(document.querySelector(sel + ' > :not(.nbdebug-stale-banner)'));
        // ipywidgets' broken-link icon on each disconnected view is hidden in a stale panel
        const icons = Array.from(document.querySelectorAll(sel + ' .jupyter-widgets-disconnected'))
            .filter(e => !['none', ''].includes(getComputedStyle(e, '::before').content)).length;
        return {pointer: pe, opacity: Number(st.opacity), filter: st.filter, icons};
    }""", PANEL)
    assert inert["pointer"] == "none" and inert["opacity"] < 0.6 and "grayscale" in inert["filter"], inert
    assert inert["icons"] == 0, inert
    shot(lab, "ui-stale-panel", PANEL)

    # the cell run again in the new kernel: a live panel, not marked
    lab.wait_until("""() => {
        const k = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
        return k && k.status === 'idle';
    }""", timeout=60)
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    lab.run_cell(1)
    wait_state(lab, "paused")
    assert header(lab)["stale"] is False and lab.page.locator(f"{PANEL}.nbdebug-stale").count() == 0
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:terminate')")
    assert "Traceback" not in log_since(lab, start), log_since(lab, start)[-3000:]


def test_panel_and_commands_in_notebook_7(nb_page: LabPage) -> None:
    lab = nb_page
    lab.server.write_notebook("nb7.ipynb", CELLS)
    lab.open_notebook("nb7.ipynb")
    assert lab.page.evaluate("() => window.jupyterapp.name") == "Jupyter Notebook"
    assert lab.page.evaluate("() => window.jupyterapp.commands.hasCommand('nbdebug:pause')"), \
        f"the nbdebug plugin did not activate in Notebook 7; console errors: {lab.errors}"
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    lab.run_cell(1)
    wait_state(lab, "paused")
    assert header(lab)["step"] == "–"  # nothing recorded yet

    # the extension's step command (as the toolbar or a shortcut runs it): one step, then paused
    lab.wait_until("() => window.jupyterapp.commands.isEnabled('nbdebug:step')", timeout=60)
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:step')")
    lab.wait_until("""(sel) => {
        const p = document.querySelector(sel);
        return p && p.querySelector('.nbdebug-step').textContent.trim() === '0'
            && p.querySelector('.nbdebug-step-running').textContent.includes('step 1 next');
    }""", arg=PANEL, timeout=60)
    wait_state(lab, "paused")
    # continue, then pause while it trains: the panel follows the commands
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:continue')")
    wait_state(lab, "running")
    lab.wait_until("() => window.jupyterapp.commands.isEnabled('nbdebug:pause')", timeout=60)
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:pause')")
    wait_state(lab, "paused")
    shot(lab, "ui-notebook7-panel")
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:terminate')")
    wait_state(lab, "terminated")
    assert "Traceback" not in log_since(lab, start), log_since(lab, start)[-3000:]
    problems = [e for e in lab.errors if "nbdebug" in e.lower()]
    assert not problems, problems


def test_form_errors_under_each_field_at_full_width(lab_page: LabPage) -> None:
    lab = lab_page
    lab.server.write_notebook("form.ipynb", CELLS)
    lab.open_notebook("form.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    lab.run_cell(1)
    wait_state(lab, "paused")
    panel = lab.page.locator(PANEL).first
    panel.locator("button.nbdebug-wp-add").click()
    form = panel.locator(".nbdebug-wp-form")
    form.wait_for(state="visible")
    select = form.locator(".nbdebug-wp-condition select")
    labels = select.locator("option").all_text_contents()
    select.select_option(index=next(i for i, t in enumerate(labels) if " TL " in t.replace("\xa0", " ")))
    lab.wait_until("(sel) => document.querySelector(sel + ' .nbdebug-wp-param-max_gt input')", arg=PANEL)
    assert "Average of the absolute value >" in form.inner_text()
    form.locator(".nbdebug-wp-param-abs_mean_gt input").fill("-1")
    form.locator(".nbdebug-wp-param-max_gt input").fill("big")
    lab.page.wait_for_timeout(1000)  # ipywidgets holds a model's value updates while the kernel is busy
    form.locator("button.nbdebug-wp-create").click()
    geo = lab.wait_until("""(sel) => {
        const f = document.querySelector(sel + ' .nbdebug-wp-form');
        const errs = ['abs_mean_gt', 'max_gt'].map(n => f.querySelector('.nbdebug-wp-error-' + n));
        if (errs.some(e => !e || !e.textContent.trim())) return null;
        const fw = f.getBoundingClientRect().width;
        return errs.map(e => { const r = e.getBoundingClientRect(), s = getComputedStyle(e.firstElementChild || e);
            const lh = parseFloat(s.lineHeight || 16);
            return {text: e.textContent.trim(), ratio: r.width / fw, lines: r.height / lh}; });
    }""", arg=PANEL)
    for g in geo:  # as wide as the form (not a 20 px column), a line or two (not one word per line)
        assert g["ratio"] > 0.8 and g["lines"] <= 3.5, geo
    assert "must be >= 0" in geo[0]["text"] and "must be a number" in geo[1]["text"], geo
    assert form.is_visible() and form.locator(".nbdebug-wp-param-max_gt input").input_value() == "big"
    shot(lab, "ui-form-errors", f"{PANEL} .nbdebug-wp-form")
    lab.page.evaluate("() => window.jupyterapp.commands.execute('nbdebug:terminate')")
    assert "Traceback" not in log_since(lab, start), log_since(lab, start)[-3000:]


def test_quickstart_cells_run_after_using_its_panel(lab_page: LabPage) -> None:
    """As the quickstart's text suggests: TO in the form, CONTINUE into the hit, View; then the notebook's
    later cells (they raised KeyError after continuing past the hit and reading step 4)."""
    lab = lab_page
    shutil.copy(QUICKSTART, lab.server.root / QUICKSTART.name)
    lab.page.set_viewport_size({"width": 1440, "height": 2000})
    lab.open_notebook(QUICKSTART.name)
    cells = lab.cells()
    at = next(i for i, (kind, src) in enumerate(cells) if kind == "code" and src.strip() == "dbg")
    start = lab.server.log_path.stat().st_size
    for i, (kind, _src) in enumerate(cells[:at + 1]):
        if kind == "code":
            lab.run_cell(i)
    wait_state(lab, "paused")
    panel = lab.page.locator(PANEL).first
    panel.locator("button.nbdebug-wp-add").click()
    form = panel.locator(".nbdebug-wp-form")
    form.wait_for(state="visible")
    form.locator("button.nbdebug-wp-create").click()  # TO is the form's default condition
    lab.wait_until("(sel) => document.querySelectorAll(sel + ' .nbdebug-wp-row').length === 1", arg=PANEL)
    panel.locator("button.nbdebug-continue").click()
    lab.wait_until("(sel) => document.querySelector(sel + ' .nbdebug-hit-row')", arg=PANEL, timeout=60)
    wait_state(lab, "paused")
    facts = header(lab)
    assert facts["step"] == "3" and "step 4 next" in facts["running"], facts  # the hits' step
    read = """(sel) => [document.querySelector(sel + ' .nbdebug-hit-count').textContent.trim(),
        document.querySelector(sel + ' .nbdebug-hit-title').textContent.trim(),
        document.querySelectorAll(sel + ' .nbdebug-hit-row').length,
        (document.querySelector(sel + ' .nbdebug-hit-summary') || {textContent: ''}).textContent.trim()]"""
    # the browser applies each widget's update on its own: the header, the rows and the list's title may
    # land a moment apart (CI once read the rows before the title's update) — they must agree soon after
    agree = f"(sel) => {{ const h = ({read})(sel); return h[1] === `Hits (${{h[0]}})` ? h : null; }}"
    try:
        lab.wait_until(agree, arg=PANEL, timeout=10)
    except AssertionError:
        pass  # the assertion below shows what disagrees
    hits = lab.page.evaluate(read, PANEL)
    # hits are grouped by node and condition (a few rows each, paged): the count and the summary say them all
    assert hits[1] == f"Hits ({hits[0]})" and 1 <= hits[2] <= int(hits[0]), hits
    assert not hits[3] or f"TO {hits[0]} on" in hits[3], hits
    panel.locator(".nbdebug-hit-row").first.locator("button.nbdebug-hit-view").click()
    panel.locator(".nbdebug-tensor-view").wait_for(state="visible")
    shot(lab, "ui-quickstart-used", PANEL)
    for i, (kind, _src) in enumerate(cells[at + 1:], start=at + 1):
        if kind == "code":
            lab.run_cell(i)  # fails with the cell's output if it raised
    lab.wait_for_output("negative inputs to log: 1 at rows [5]")
    assert "Traceback" not in log_since(lab, start), log_since(lab, start)[-3000:]


def test_offline_panel_step_selector(lab_page: LabPage) -> None:
    """``%nbdebug load`` on a two-step dump: the header shows the dump (no PID) and the step selector
    switches the step every view shows."""
    import json

    lab = lab_page

    def tensor(mx, mn, mean, norm):
        return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2], "Max": mx, "Min": mn,
                "Mean": mean, "Norm": norm}

    dump = lab.server.root / "dump2"
    for step, out in ((0, tensor(1.0, 0.0, 0.5, 1.0)), (1, tensor(3.0, 2.0, 2.5, 3.6))):
        d = dump / f"step{step}" / "rank0"
        d.mkdir(parents=True, exist_ok=True)
        entry = {"input_args": [tensor(1.0, -1.0, 0.0, 1.4142135)], "input_kwargs": {}, "output": [out]}
        (d / "dump.json").write_text(json.dumps({"task": "statistics", "level": "L1", "framework": "pytorch",
                                                 "dump_data_dir": None,
                                                 "data": {"Functional.relu.0.forward": entry}}))
    lab.server.write_notebook("offline.ipynb", ["%load_ext nbdebug", "p = %nbdebug load dump2\n"
                                                "p.select('Functional.relu.0.forward')\np"])
    lab.open_notebook("offline.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    lab.run_cell(1)
    wait_state(lab, "offline")
    facts = lab.page.evaluate("""(sel) => {
        const p = document.querySelector(sel);
        const vis = c => { const e = p.querySelector(c);
                           return !!e && e.closest('.widget-hbox').offsetParent !== null; };
        return {dump: p.querySelector('.nbdebug-dump').textContent, pid: vis('.nbdebug-pid'),
                options: Array.from(p.querySelectorAll('.nbdebug-step-select option'))
                    .map(o => o.textContent.replace(/\u00a0/g, ' ')),
                step: p.querySelector('.nbdebug-step').textContent.trim(),
                details: p.querySelector('.nbdebug-details-table').textContent};
    }""", PANEL)
    assert "dump2" in facts["dump"] and "steps 0, 1" in facts["dump"] and facts["pid"] is False, facts
    assert facts["options"] == ["step 0", "step 1"] and facts["step"] == "1" and "2.5" in facts["details"], facts
    lab.page.locator(f"{PANEL} .nbdebug-step-select select").select_option(index=0)
    lab.wait_until("""(sel) => {
        const p = document.querySelector(sel);
        const t = p.querySelector('.nbdebug-details-table').textContent;
        return p.querySelector('.nbdebug-step').textContent.trim() === '0' && !t.includes('2.5') && t.includes('0.5');
    }""", arg=PANEL, timeout=30)
    shot(lab, "ui-offline-step-selector", PANEL)
    assert "Traceback" not in log_since(lab, start), log_since(lab, start)[-3000:]
