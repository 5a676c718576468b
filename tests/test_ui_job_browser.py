"""The job panel in a real JupyterLab through Chromium: three in-process ranks (rank 1 goes non-finite at
step 2), the rank selector switching the panel below it, the first non-finite line and its "show" button,
and a rank-vs-rank compare. The kernel's log shows no traceback meanwhile."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from browser import LabPage

NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
JOB = f"{NB} .nbdebug-job-panel"
FAULT = "Module.fault.Fault.forward.0"

CELLS = [
    """\
import torch, nbdebug
from nbdebug.job import Job

class Fault(torch.nn.Module):
    armed = False
    def forward(self, x):
        return torch.sqrt(x - 10.0) if self.armed else x

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act = torch.nn.Linear(4, 8), torch.nn.Tanh()
        self.fault, self.fc2 = Fault(), torch.nn.Linear(8, 1)
    def forward(self, x):
        return self.fc2(self.fault(self.act(self.fc1(x))))

torch.manual_seed(0)
models = [Net() for _ in range(3)]
for m in models[1:]:
    m.load_state_dict(models[0].state_dict())
dbgs = [nbdebug.Debugger(m, level="L0") for m in models]
dbgs[1].watch("TO")
opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
for step in range(4):
    for r, (m, opt) in enumerate(zip(models, opts)):
        m.fault.armed = (r, step) == (1, 2)
        opt.zero_grad()
        m(torch.randn(6, 4)).pow(2).mean().backward()
        opt.step()""",
    """\
job = Job(dict(enumerate(dbgs)))
jp = job.panel()
jp""",
]


@pytest.fixture(autouse=True)
def built_extension() -> Any:
    from browser import labextension_build

    return labextension_build()


def facts(lab: LabPage) -> dict[str, Any]:
    return lab.page.evaluate("""(sel) => {
        const p = document.querySelector(sel);
        if (!p) return null;
        const t = c => { const e = p.querySelector(c); return e ? e.textContent.trim() : null; };
        const sel_ = p.querySelector('.nbdebug-rank-select select');
        return {first: t('.nbdebug-job-first'), rank: sel_ ? sel_.value : null,
                hits: t('.nbdebug-panel .nbdebug-hit-count'), panels: p.querySelectorAll('.nbdebug-panel').length,
                overviewRows: p.querySelectorAll('.nbdebug-job-overview tr[data-rank]').length,
                compare: t('.nbdebug-job-compare-box .nbdebug-compare-summary')};
    }""", JOB)


def test_job_panel_in_jupyterlab(lab_page: LabPage) -> None:
    lab = lab_page
    lab.server.write_notebook("job.ipynb", CELLS)
    lab.open_notebook("job.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_cell(0)
    lab.run_cell(1)
    lab.wait_until("(sel) => !!document.querySelector(sel + ' .nbdebug-panel .nbdebug-hit-count')", arg=JOB,
                   timeout=60)
    f = facts(lab)
    assert f["first"] == f"first non-finite: rank 1, node {FAULT}, step 2", f
    assert f["rank"] == "rank 0" and f["hits"] == "0" and f["panels"] == 1 and f["overviewRows"] == 3, f

    # the user picks rank 1 in the selector: the panel below is rank 1's (its watchpoint hits)
    lab.page.locator(f"{JOB} .nbdebug-rank-select select").select_option(value="rank 1")
    lab.wait_until("""(sel) => {
        const h = document.querySelector(sel + ' .nbdebug-panel .nbdebug-hit-count');
        return h && Number(h.textContent.trim()) > 0;
    }""", arg=JOB, timeout=30)
    assert facts(lab)["panels"] == 1

    # back to rank 2, then "show" jumps to the first non-finite rank and selects its node
    lab.page.locator(f"{JOB} .nbdebug-rank-select select").select_option(value="rank 2")
    lab.wait_until("(sel) => document.querySelector(sel + ' .nbdebug-panel .nbdebug-hit-count')"
                   ".textContent.trim() === '0'", arg=JOB, timeout=30)
    lab.page.locator(f"{JOB} .nbdebug-job-first-show").click()
    lab.wait_until("""(sel) => {
        const s = document.querySelector(sel + ' .nbdebug-rank-select select');
        return s && s.value === 'rank 1';
    }""", arg=JOB, timeout=30)

    # rank-vs-rank compare in the compare panel
    lab.page.locator(f"{JOB} .nbdebug-job-compare").click()
    lab.wait_until("(sel) => !!document.querySelector(sel + ' .nbdebug-job-compare-box .nbdebug-compare-summary')",
                   arg=JOB, timeout=60)
    f = facts(lab)
    assert "rank 2" in f["compare"] and "rank 0" in f["compare"], f
    assert lab.page.locator(f"{JOB} .nbdebug-job-compare-box .nbdebug-compare-row").count() > 0
    lab.assert_not_blank(lab.screenshot("ui-job-panel", JOB))
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert not [e for e in lab.errors if "pageerror" in e], lab.errors
