"""The job panel in a real JupyterLab through Chromium: three in-process ranks (rank 1 goes non-finite at
step 2), the rank selector switching the panel below it, the first non-finite line and its "show" button,
and a rank-vs-rank compare. The kernel's log shows no traceback meanwhile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from browser import LabPage

NB = ".jp-NotebookPanel:not(.lm-mod-hidden)"
JOB = f"{NB} .nbdebug-job-panel"
FAULT = "Module.fault.Fault.forward.0"

TESTS = Path(__file__).resolve().parent
CELLS = [
    f"""\
import sys
sys.path.insert(0, {str(TESTS)!r})
from test_job import _ranks, _train  # tiny models with a fault module; one Debugger each
from nbdebug.job import Job

models, dbgs = _ranks(3)
dbgs[1].watch("TO")
_train(models, 4, faults={{(1, 2, "fault")}})""",
    """\
job = Job(dict(enumerate(dbgs)))
jp = job.panel()
jp""",
]


def facts(lab: LabPage) -> dict[str, Any]:
    return lab.page.evaluate("""(sel) => {
        const p = document.querySelector(sel), text = c => (p.querySelector(c) || {}).textContent;
        const t = c => text(c) === undefined ? null : text(c).trim();
        return {first: t('.nbdebug-job-first'), rank: p.querySelector('.nbdebug-rank-select select').value,
                hits: t('.nbdebug-panel .nbdebug-hit-count'), panels: p.querySelectorAll('.nbdebug-panel').length,
                overviewRows: p.querySelectorAll('.nbdebug-job-overview tr[data-rank]').length,
                compare: t('.nbdebug-job-compare-box .nbdebug-compare-summary'),
                compareError: t('.nbdebug-job-compare-box .nbdebug-job-compare-error')};
    }""", JOB)


def test_job_panel_in_jupyterlab(lab_page: LabPage) -> None:
    from browser import labextension_build

    labextension_build()  # the graph view loads the built front end
    lab = lab_page
    lab.server.write_notebook("job.ipynb", CELLS)
    lab.open_notebook("job.ipynb")
    start = lab.server.log_path.stat().st_size
    lab.run_all()  # training, then the job's panel
    lab.wait_until("(sel) => !!document.querySelector(sel + ' .nbdebug-panel .nbdebug-hit-count')", arg=JOB,
                   timeout=120)
    f = facts(lab)
    assert f["first"] == f"first non-finite: rank 1, node {FAULT}, step 2", f
    # its static snapshot (for the saved notebook) is in the page, hidden while the widget is drawn
    hidden = lab.page.evaluate("""() => {
        const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .nbdebug-job-snapshot');
        return s ? s.getBoundingClientRect().height === 0 : null;
    }""")
    assert hidden is True, hidden
    assert f["rank"] == "rank 0" and f["hits"] == "0" and f["panels"] == 1 and f["overviewRows"] == 3, f

    # the user picks rank 1 in the selector: the panel below is rank 1's (its watchpoint hits)
    lab.page.locator(f"{JOB} .nbdebug-rank-select select").select_option(value="rank 1")
    lab.wait_until("""(sel) => {
        const h = document.querySelector(sel + ' .nbdebug-panel .nbdebug-hit-count');
        return h && Number(h.textContent.trim()) > 0;
    }""", arg=JOB, timeout=90)
    assert facts(lab)["panels"] == 1

    # back to rank 2, then "show" jumps to the first non-finite rank and selects its node
    lab.page.locator(f"{JOB} .nbdebug-rank-select select").select_option(value="rank 2")
    lab.wait_until("(sel) => document.querySelector(sel + ' .nbdebug-panel .nbdebug-hit-count')"
                   ".textContent.trim() === '0'", arg=JOB, timeout=90)
    lab.page.locator(f"{JOB} .nbdebug-job-first-show").click()
    lab.wait_until("""(sel) => {
        const s = document.querySelector(sel + ' .nbdebug-rank-select select');
        return s && s.value === 'rank 1';
    }""", arg=JOB, timeout=90)

    # rank-vs-rank compare in the compare panel
    lab.page.locator(f"{JOB} .nbdebug-job-compare").click()
    lab.wait_until("(sel) => !!document.querySelector(sel + ' .nbdebug-job-compare-box .nbdebug-compare-summary, '"
                   " + sel + ' .nbdebug-job-compare-box .nbdebug-job-compare-error')", arg=JOB, timeout=90)
    f = facts(lab)
    assert f["compareError"] is None, f
    assert "rank 2" in f["compare"] and "rank 0" in f["compare"], f
    # the compare's rows come with its table widget, drawn after the summary line
    lab.wait_until("(sel) => document.querySelectorAll(sel + ' .nbdebug-job-compare-box .nbdebug-compare-row')"
                   ".length > 0", arg=JOB, timeout=60)
    lab.assert_not_blank(lab.screenshot("ui-job-panel", JOB))
    log = lab.server.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert not [e for e in lab.errors if "pageerror" in e], lab.errors
