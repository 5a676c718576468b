"""The job panel (kernel side): a rank selector switching every view, the first non-finite line, the per-rank
overview, job control and the rank-vs-rank compare — over in-process ranks and over a multi-rank dump."""

from __future__ import annotations

import glob
import os
import shutil
import threading

import pytest
import torch
from test_job import FAULT, Net, _collective_training, _ranks, _train, _wait_all

import nbdebug
from nbdebug.job import Job
from nbdebug.ui.job_panel import JobPanel


@pytest.fixture
def trained():
    models, dbgs = _ranks(3)
    _train(models, 4, faults={(1, 2, "fault")})
    yield models, dbgs
    for d in dbgs:
        d.close()


def test_rank_selector_switches_every_view(trained):
    _models, dbgs = trained
    job = Job(dict(enumerate(dbgs)))
    p = JobPanel(job)
    try:
        assert p.rank == 0 and p.panel.source.obj is dbgs[0]
        assert p.first.value == f"first non-finite: rank 1, node {FAULT}, step 2"
        assert "data-rank='2'" in p.overview.value and "#f4b6b6" in p.overview.value
        assert p.panel.controls is None or p.panel.controls.widget.layout.display == "none"
        assert set(p.buttons) == {"pause", "cont", "step", "terminate"}  # live debuggers: job control
        p.panel.select("Module.fc2.Linear.forward.0")
        p.rank_select.value = 2  # the user picks rank 2
        assert p.rank == 2 and p.panel.source.obj is dbgs[2]
        for view in (p.panel.graph_view, p.panel.node_list, p.panel.details, p.panel.hit_list, p.panel.tensor_view):
            assert view.source.obj is dbgs[2]
        assert p.panel.selected == "Module.fc2.Linear.forward.0"  # kept across ranks
        shown = p.show_first()
        assert (shown.rank, shown.node) == (1, FAULT)
        assert p.rank == 1 and p.rank_select.value == 1 and p.panel.selected == FAULT
        p.panel.view(FAULT, "output.0")  # the tensor view reads rank 1's value
        assert p.panel.tensor_view.node == FAULT and p.panel.tensor_view.source.obj is dbgs[1]
        saved = p.snapshot_html()  # what a saved notebook shows without a kernel
        assert "nbdebug-job-snapshot" in saved and "<b>Rank 1</b>" in saved and FAULT in saved
        assert "first non-finite: rank 1" in saved and "class=\"nbdebug-snapshot\"" in saved
        p._ipython_display_()  # the widget, then its snapshot (a display handle kept current)
        assert len(p._snapshots) == 1
        cp = p.compare(2, 0, 0)  # step 0: the same initial weights (these ranks never allreduce)
        assert p.compare_box.children == (cp.widget,) and "rank 2" in cp.summary.value
        assert all(r.status == "pass" for r in cp.result.rows if r.target.startswith("Parameter."))
        # the compare button: a compare that fails says why in the compare box, nothing raised or silent
        p.compare_step.options = [("9", 9)]  # a step no rank has
        p.compare_step.value = 9
        p.compare_button.click()
        (box,) = p.compare_box.children
        assert "nbdebug-job-compare-error" in box._dom_classes and "compare failed" in box.value, box.value
        assert "Traceback" in p.errors[-1]
        p.compare_step.options = [("0", 0)]
        p.compare_button.click()  # and a good one replaces the error
        assert p.compare_box.children == (p.compare_panel.widget,)
    finally:
        p.close()


def _rank_dump(root, dbg_dirs):
    """Per-rank dumps written in one process (proc{pid} folders) moved into msProbe's step{N}/rank{R}."""
    for rank, d in enumerate(dbg_dirs):
        for src in glob.glob(os.path.join(d, "step*", "proc*")):
            step = os.path.basename(os.path.dirname(src))
            os.makedirs(os.path.join(root, step), exist_ok=True)
            shutil.move(src, os.path.join(root, step, f"rank{rank}"))


def test_offline_job_panel_from_a_multi_rank_dump(tmp_path):
    torch.manual_seed(0)
    dirs = [str(tmp_path / f"w{r}") for r in range(2)]
    models = [Net() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    dbgs = [nbdebug.Debugger(m, level="L0", dump_dir=d, task="statistics") for m, d in zip(models, dirs, strict=True)]
    _train(models, 3, faults={(1, 1, "fault")})
    for d in dbgs:
        d.close()
    root = str(tmp_path / "dump")
    _rank_dump(root, dirs)
    off = nbdebug.load(root)
    assert off.ranks == [0, 1] and off.rank(0) is off and off.job is off.job
    with pytest.raises(KeyError, match="no rank 5"):
        off.rank(5)
    one = nbdebug.load(root, rank=1)  # loaded as rank 1: its job holds it for rank 1, and loads rank 0
    assert one.job.source(1) is one and one.job.source(0).meta["rank"] == "rank0"
    single = nbdebug.load(os.path.join(root, "step0", "rank1"))  # one rank folder: a job of that rank
    assert single.ranks == [1] and single.job.ranks == [1]
    p = off.job.panel()
    try:
        assert p.first.value == f"first non-finite: rank 1, node {FAULT}, step 1"
        assert p.panel.step_select is not None  # offline: each rank's panel has the step selector
        p.panel.goto(1)
        p.rank_select.value = 1
        assert p.panel.source.step == 1  # the step is kept across ranks
        assert p.panel.source.obj is off.rank(1)
        p.show_first()
        assert p.panel.selected == FAULT and p.panel.source.step == 1
    finally:
        p.close()


def test_job_panel_controls_every_rank():
    models, dbgs = _ranks(2)
    barrier = threading.Barrier(2)
    train = _collective_training(models, barrier, [])
    try:
        for r, (m, d) in enumerate(zip(models, dbgs, strict=True)):
            d.run(train, r, m, paused=True)
        p = JobPanel(Job(dict(enumerate(dbgs))))
        assert set(p.buttons) == {"pause", "cont", "step", "terminate"}
        assert p.panel.controls.widget.layout.display == "none"
        assert "no finished step yet" in p.overview.value
        p.buttons["step"].click()
        assert _wait_all(dbgs) == ["paused", "paused"] and [d.step_index for d in dbgs] == [1, 1]
        p.flush()  # in a kernel the ranks' step events redraw the bar by themselves
        assert "<th>step 0</th>" in p.overview.value and p.first.value == "first non-finite: none"
        assert p.compare_step.options == (("0", 0),)
        p.buttons["terminate"].click()
        assert _wait_all(dbgs) == ["terminated", "terminated"]
        p.flush()
        assert not p.errors
        p.close()
    finally:
        for d in dbgs:
            d.close()


def test_ranks_joining_a_job_appear_in_its_panel():
    """A listener's job starts empty and grows as processes connect (``Job.add``); a restarted rank's new
    process replaces the old one in the job and in the panel."""
    from nbdebug.offline import OfflineSession
    from nbdebug.session.session import Session

    class Group:
        address = "127.0.0.1:5555"

        def pause_all(self):
            return 0

        def cont_all(self, steps=None):
            pass

        def terminate_all(self):
            pass

    def rank_source():
        return OfflineSession(Session(framework="pytorch"))

    job = Job({}, control=Group())
    p = JobPanel(job, loop=None)
    try:
        assert p.panel is None and "waiting for training processes on 127.0.0.1:5555" in p.processes.value
        assert set(p.buttons) == {"pause", "cont", "step", "terminate"}
        first, second = rank_source(), rank_source()
        job.add(1, second)
        p.flush()
        job.add(0, first)
        p.flush()
        assert job.ranks == [0, 1] and [o[1] for o in p.rank_select.options] == [0, 1]
        assert p.rank == 1 and p.panel.source.obj is second  # the first to join stays shown
        assert {p.compare_a.value, p.compare_b.value} == {0, 1}  # two different ranks to compare
        again = rank_source()
        job.add(1, again)  # rank 1 restarted: a new process
        p.flush()
        assert job.source(1) is again and p.rank == 1 and p.panel.source.obj is again
        p.buttons["pause"].click()
        assert "after step 0" in p.status.value
    finally:
        p.close()
