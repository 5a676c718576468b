"""The watch panel's "+" form makes a SPIKE watchpoint in a real JupyterLab and Chromium (issue 20, item 2):
the condition picked from the dropdown's "Over time" group, the series field typed, a bad window refused under
its field, then the watchpoint in the list and in the kernel with the typed parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from browser import LabPage

NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
PANEL = f"{NB} .nbdebug-panel"
CELLS = [
    """\
import torch, nbdebug
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
dbg = nbdebug.Debugger(model)
model(torch.randn(2, 4)).pow(2).mean().backward()
dbg""",
]

pytestmark = pytest.mark.usefixtures("built_extension")  # tests/browser.py


def test_form_adds_a_spike_watchpoint(lab_page: LabPage) -> None:
    lab = lab_page
    lab.server.write_notebook("spike.ipynb", CELLS)
    lab.open_notebook("spike.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    panel = lab.page.locator(PANEL).first
    panel.locator("button.nbdebug-wp-add").wait_for(state="visible", timeout=60_000)
    panel.locator("button.nbdebug-wp-add").click()
    form = panel.locator(".nbdebug-wp-form")
    form.wait_for(state="visible")
    select = form.locator(".nbdebug-wp-condition select")
    labels = [t.replace("\xa0", " ") for t in select.locator("option").all_text_contents()]
    spike = [i for i, t in enumerate(labels) if t.startswith("Over time · SPIKE ")]
    assert len(spike) == 1 and not any("ODD_RANK" in t for t in labels), labels
    select.select_option(index=spike[0])
    lab.wait_until("(sel) => document.querySelector(sel + ' .nbdebug-wp-param-window input')", arg=PANEL)
    assert form.locator(".nbdebug-wp-param-field input").input_value() == "norm"
    assert form.locator(".nbdebug-wp-param-window input").input_value() == "50"
    form.locator(".nbdebug-wp-param-field input").fill("loss")
    form.locator(".nbdebug-wp-param-window input").fill("2")  # too short a window: its error, under it
    lab.page.wait_for_timeout(800)  # ipywidgets sends a text's value after a short debounce
    form.locator("button.nbdebug-wp-create").click()
    lab.wait_until("""(sel) => { const e = document.querySelector(sel + ' .nbdebug-wp-error-window');
        return e && e.textContent.includes('whole number >= 3'); }""", arg=PANEL)
    assert form.is_visible()
    form.locator(".nbdebug-wp-param-window input").fill("20")
    lab.page.wait_for_timeout(800)
    form.locator("button.nbdebug-wp-create").click()
    lab.wait_until("""(sel) => { const rows = document.querySelectorAll(sel + ' .nbdebug-wp-row');
        return rows.length === 1 && rows[0].textContent.includes('SPIKE')
            && rows[0].textContent.includes('field=loss') && rows[0].textContent.includes('window=20'); }""",
                   arg=PANEL)
    assert not form.is_visible()
    lab.append_and_run("print('made', [(w.condition, w.params) for w in dbg.watchpoints.watchpoints.values()])")
    lab.wait_for_output("made [('SPIKE', {'field': 'loss', 'factor': 10.0, 'window': 20})]")
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]
