"""The watch panel's "+" form with the watchpoints over time (SPIKE, DRIFT, STALL; ODD_RANK on a job's panel),
and a temporal hit in the hit list: baseline against the value and the step the series left its band."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ipywidgets")

from nbdebug.job.job import Job  # noqa: E402
from nbdebug.offline import OfflineSession  # noqa: E402
from nbdebug.session.monitor import Monitor  # noqa: E402
from nbdebug.session.session import Session  # noqa: E402
from nbdebug.ui.hits import HitList, band_text  # noqa: E402
from nbdebug.ui.source import SessionSource, SourceView  # noqa: E402
from nbdebug.ui.watch_panel import WatchPanel, condition_options  # noqa: E402


def _form(source=None) -> WatchPanel:
    s = Session(framework="none", live=False)
    s.monitor = Monitor()
    return WatchPanel(SourceView(source if source is not None else SessionSource(s)))


def test_form_offers_the_temporal_conditions_with_their_fields():
    offered = [abbr for _t, abbr in condition_options()]
    assert offered[-3:] == ["SPIKE", "DRIFT", "STALL"] and "ODD_RANK" not in offered
    wp = _form()
    wp.open_form()
    wp.condition.value = "SPIKE"
    assert list(wp.fields) == ["field", "factor", "window"]
    assert (wp.field("field").value, wp.field("factor").value, wp.field("window").value) == ("norm", "10.0", "50")
    assert "update_ratio" in wp.field("field").options and "median" in wp.summary.value
    wp.condition.value = "STALL"
    assert (wp.field("field").value, wp.field("below").value, wp.field("steps").value) == \
        ("update_ratio", "1e-08", "20")
    wp.condition.value = "DRIFT"
    assert list(wp.fields) == ["field", "z", "window"]


def test_form_validates_each_temporal_field_and_creates_nothing_on_error():
    wp = _form()
    wp.open_form()
    wp.condition.value = "SPIKE"
    wp.field("field").value = "nrom"
    wp.field("factor").value = "-2"
    wp.field("window").value = "7.5"
    assert wp.submit() is None
    errors = wp.errors()
    assert "statistic or a monitor field" in errors["field"] and "nrom" in errors["field"]
    assert "> 0" in errors["factor"] and "whole number >= 3" in errors["window"]
    assert wp.form_open and not wp.source.watchpoints.watchpoints
    wp.field("window").value = "2"
    assert wp.submit() is None and "whole number >= 3" in wp.errors()["window"]


def test_form_creates_a_spike_watchpoint_with_typed_parameters():
    wp = _form()
    wp.open_form()
    wp.condition.value = "SPIKE"
    wp.field("field").value = "loss"
    wp.field("factor").value = "5"
    wp.field("window").value = "20"
    made = wp.submit()
    assert made is not None and not wp.form_open
    assert made.condition == "SPIKE" and made.params == {"field": "loss", "factor": 5.0, "window": 20}
    assert isinstance(made.params["window"], int)
    assert "SPIKE" in wp.rows()[0].children[1].value
    wp.open_form()
    wp.condition.value = "STALL"
    wp.field("steps").value = "3"
    stall = wp.submit()
    assert stall.params == {"field": "update_ratio", "below": 1e-8, "steps": 3}


def test_a_spike_hit_in_the_hit_list_shows_its_band():
    s = Session(framework="none", live=False)
    s.monitor = Monitor()
    src = SessionSource(s)
    src.watch("SPIKE", "Run", field="loss", window=20)
    for step in range(30):
        s.monitor.record(step, [("Run", "loss")], np.array([500.0 if step == 25 else 5.0 + step % 3]))
        src.watchpoints.hits.extend(src.watchpoints.temporal.check(src.watchpoints.watchpoints.values(), step))
    (hit,) = src.hits
    text = band_text(hit)
    assert text.startswith("value 500 against median 6, mean") and "std" in text
    assert text.endswith("left its band at step 25")
    hl = HitList(src)
    (row,) = hl.rows()
    detail = row.children[-1].value
    assert "factor = 10 set" in detail and "median 6" in detail and "left its band at step 25" in detail


def test_job_panel_form_sets_odd_rank_on_the_job():
    from nbdebug.ui.job_panel import JobPanel

    sessions = {}
    for r in range(4):
        s = sessions[r] = Session(framework="none", live=False)
        s.monitor = Monitor()
        for step in range(5):  # ODD_RANK judges a series after 3 steps (its MAD floor)
            s.monitor.record(step, [("Run", "loss")], np.array([2.0 + 0.01 * r if (r, step) != (1, 4) else 2e3]))
    job = Job({r: OfflineSession(s) for r, s in sessions.items()})
    panel = JobPanel(job, loop=None)
    form = panel.panel.watch
    assert "ODD_RANK" in [abbr for _t, abbr in form.condition.options]
    form.open_form()
    form.condition.value = "ODD_RANK"
    assert list(form.fields) == ["field", "z"]
    form.field("field").value = "loss"
    form.field("z").value = "4"
    made = form.submit()
    assert made is not None and made.condition == "ODD_RANK" and made.params == {"field": "loss", "z": 4.0}
    assert len(job.odd_rank.watches) == 1 and set(job.odd_rank.watches[0]) == {0, 1, 2, 3}
    assert made is job.odd_rank.watches[0][panel.rank]
    found = job.odd_rank.on_step()
    assert [(rank, h.node, h.slot) for rank, h in found] == [(1, "Run", "loss")]
    assert "ranks' median" in band_text(found[0][1])
