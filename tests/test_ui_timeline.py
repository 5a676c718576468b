"""The run timeline, kernel side: exact min/max decimation, the message's binary buffers and their sizes, the
SPIKE/DRIFT bands, the module tree's rows, and scrubbing a panel (live and offline) to a chosen step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import nbdebug
import nbdebug.ui.export
import nbdebug.ui.source
from nbdebug.session.monitor import Monitor
from nbdebug.session.session import Session
from nbdebug.ui.panel import Panel
from nbdebug.ui.timeline import Timeline
from nbdebug.ui.timeline_data import RowTree, decimate, drift_band, spike_band


def test_decimation_min_max_exact_per_column() -> None:
    rng = np.random.default_rng(0)
    steps = np.sort(rng.choice(100_000, 30_000, replace=False))
    values = rng.standard_normal(len(steps))
    values[1234] = 1e6  # a one-step spike survives any zoom
    values[rng.choice(len(steps), 50)] = np.nan
    cols = decimate(steps, values, 0, 99_999, 777)
    assert len(cols.first) == 777 and cols.first[0] == 0 and cols.last[-1] == 99_999
    assert np.all(cols.first[1:] == cols.last[:-1] + 1)  # columns tile the range
    for i in range(777):
        sel = (steps >= cols.first[i]) & (steps <= cols.last[i]) & ~np.isnan(values)
        if sel.any():
            assert cols.vmin[i] == values[sel].min() and cols.vmax[i] == values[sel].max()
        else:
            assert np.isnan(cols.vmin[i]) and np.isnan(cols.vmax[i])
    assert np.nanmax(cols.vmax) == 1e6
    one = decimate(steps, values, 10, 40, 1000)  # fewer steps than columns: one column per step
    assert one.first.tolist() == list(range(10, 41)) and one.first.tolist() == one.last.tolist()


def test_bands_match_the_temporal_conditions() -> None:
    rng = np.random.default_rng(1)
    v = 1 + 0.01 * rng.standard_normal(300)
    v[250] = 20.0
    spike = spike_band(v, window=50, factor=10)
    assert np.isnan(spike.hi[:50]).all()
    assert spike.hi[120] == pytest.approx(10 * np.median(v[70:120]))
    assert np.flatnonzero(spike.outside(v)).tolist() == [250]
    drift = drift_band(v, window=200, z=6)
    assert drift.mid[260] == pytest.approx(v[60:260].mean())
    assert drift.hi[260] == pytest.approx(v[60:260].mean() + 6 * v[60:260].std())
    assert np.flatnonzero(drift.outside(v)).tolist() == [250]


def _monitor_session(steps: int = 5000, spike: int = 4321) -> Session:
    s = Session(framework="pytorch", live=False)
    s.monitor = Monitor(horizon=2000, block=10)
    names = ["Module.h.0.attn.Attention", "Module.h.0.mlp.MLP", "Module.h.1.attn.Attention", "Module.h.1.mlp.MLP",
             "Module.h.0.Block", "Module.h.1.Block", "Module.lm_head.Linear"]
    keys = [(n, "output_norm") for n in names] + [("Run", "loss")]
    for step in range(steps):
        vals = np.r_[np.arange(1.0, len(names) + 1), 3.0 - step / steps]
        if step == spike:
            vals[2] = 1e4
        s.monitor.record(step, keys, vals)
    return s


def test_timeline_message_buffers_rows_and_sizes() -> None:
    s = _monitor_session()
    tl = Timeline(s)
    tl.zoom(None, None, width=600)
    msg, bufs = tl.message()
    rows = [r[0] for r in msg["rows"]]
    assert rows[:2] == ["h", "h.0"] and "lm_head" in rows  # the module tree, opened breadth-first
    nrows, ncols = msg["shape"]
    assert ncols == 600 and msg["steps"] == [9, 4999]  # a folded block stands at its last step
    assert [b.dtype.name for b in bufs] == ["int32", "int32", "float32"] + ["float32"] * 5
    assert bufs[2].nbytes == nrows * ncols * 4 and all(b.nbytes == ncols * 4 for b in bufs[3:])
    assert sum(b.nbytes for b in bufs) < 100_000  # 5,000 steps → 600 columns: well under the 1 MB budget
    heat = bufs[2].reshape(nrows, ncols)
    attn = rows.index("h.1.attn")
    col = int(np.searchsorted(bufs[0], 4321, side="right") - 1)
    assert heat[attn, col] == 1e4  # the spike (folded into a min/max block) is in its column
    assert heat[rows.index("h.1"), col] == 6.0  # an open row with a series of its own shows its own
    # collapsing h: one row for everything under it, the largest value under it
    tl.toggle("h")
    msg2, bufs2 = tl.message()
    assert [r[0] for r in msg2["rows"]] == ["h", "lm_head"]
    assert bufs2[2].reshape(2, -1)[0].max() == 1e4
    # zooming sends the same number of columns for the range asked
    tl.zoom(4300, 4340, width=600)
    msg3, bufs3 = tl.message()
    assert msg3["range"] == [4300, 4340] and msg3["shape"][1] == 41
    assert bufs3[0].tolist() == list(range(4300, 4341))


def test_run_field_line_band_and_hits() -> None:
    s = _monitor_session(steps=400, spike=300)
    tl = Timeline(s)
    tl.set_field("loss")
    msg, bufs = tl.message()
    assert [r[0] for r in msg["rows"]] == ["Run"] and msg["selected"] == "Run"
    assert np.allclose(bufs[4], 3.0 - np.arange(400) / 400, atol=1e-6)
    tl.set_field("output_norm")
    tl.selected = "h.1.attn"
    tl.set_band("SPIKE", window=50, k=10)
    msg, bufs = tl.message()
    assert msg["left_band"] == 300 and msg["selected_label"] == "Module.h.1.attn.Attention"
    assert bufs[7][60] == pytest.approx(30.0)  # 10 × the median of the previous 50 steps (3.0)


def _train(dbg_model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    torch.manual_seed(0)
    for i in range(steps):
        opt.zero_grad()
        x = torch.randn(4, 3) * (100.0 if i == 9 else 1.0)
        dbg_model(x).pow(2).mean().backward()
        opt.step()


def test_scrub_live_panel_shows_the_chosen_step() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = nbdebug.Debugger(model)
    try:
        _train(model, opt, 14)
        panel = Panel(dbg, loop=None)
        panel.timeline.show()
        msg = panel.timeline.figure.recorded()[-1]
        assert msg["type"] == "timeline" and msg["step"] == 13
        tl = panel.timeline.timeline
        tl.set_field("norm")
        msg, _ = tl.message()
        assert msg["steps"] == [0, 13] and [r[0] for r in msg["rows"]] == ["0", "1", "2"]
        node = "Module.0.Linear.forward.0"
        panel.select(node)
        # the browser clicks step 9 (in the window): every view shows it
        panel.timeline.figure.receive({"type": "scrub", "first": 9, "last": 9, "row": "0"})
        assert dbg.session.latest_step() == 9 and panel.source.step == 9
        assert panel.header.step.value == "9"
        shown = panel.details.slot_stats["output.0"]
        assert shown["max"] == dbg.stats(node, "output.0", 9)["max"] != dbg.stats(node, "output.0", 13)["max"]
        # step 9's values are not retained (current and previous only): the details say why
        assert "values are kept for the current (13) and previous step only" in panel.details.table.value
        assert "step 9 has statistics but no retained value" in panel.details.table.value  # the reason whole
        assert panel.timeline.figure.recorded()[-1]["step"] == 9
        assert panel.timeline.note.value == ""
        # a step out of the window: refused, with the statistics window's reason
        why = panel.timeline.scrub(2)
        assert why is not None and "fell out of the statistics window" in why
        assert "fell out" in panel.timeline.note.value and panel.source.step == 9
        # training again: the session shows what it records
        _train(model, opt, 1)
        assert dbg.session.latest_step() == 14
        panel.close()
    finally:
        dbg.close()


def test_row_tree_paths() -> None:
    tree = RowTree.of(["Module.a.Seq", "Module.a.0.Linear", "Module.a.1.Linear", "Module.b.ReLU", "Run"])
    assert tree.visible([]) == [("a", 0, True), ("b", 0, False), ("Run", 0, False)]
    assert tree.visible(["a"])[1:3] == [("a.0", 1, False), ("a.1", 1, False)]
    assert tree.label("a") == "a (Seq)"


def test_job_timeline_ranks_by_steps_click_selects_rank_and_step() -> None:
    from nbdebug.job import Job
    from nbdebug.offline import OfflineSession
    from nbdebug.session.stats import StatsTable
    from nbdebug.ui.job_panel import JobPanel

    def rank(scale: float) -> OfflineSession:
        s = Session(framework="pytorch", live=False, stats_window=None)
        s.node("Module.fc.Linear.forward.0", kind="module", op_type="Linear")
        for step in range(30):
            v = scale * (1.0 + step) if step >= 20 else 1.0 + step
            t = StatsTable.from_rows([("Module.fc.Linear.forward.0", "output.0")], ["float32"], [(2,)],
                                     np.array([[v, 0, v / 2, v / 2, v, 0, 0, 0, 0, 2]]))
            s.steps[step] = t
        s.step_index = 30
        return OfflineSession(s)

    job = Job({0: rank(1.0), 1: rank(1e3), 2: rank(1.0)})
    jp = JobPanel(job, loop=None)
    tl = jp.timeline
    tl.timeline.field = "norm"
    tl.show()
    msg = tl.figure.recorded()[-1]
    assert [r[0] for r in msg["rows"]] == ["0", "1", "2"] and msg["shape"] == [3, 30]
    heat = tl.figure.recorded_buffers("timeline")
    values = np.frombuffer(heat[2], np.float32).reshape(3, 30)
    assert values[1, 25] == pytest.approx(26_000) and values[0, 25] == pytest.approx(26)  # rank 1 ×1e3 from 20
    tl.figure.receive({"type": "scrub", "first": 21, "last": 21, "row": "1"})
    assert jp.rank == 1 and jp.panel.source.step == 21
    assert jp.panel.header.step.value == "21"
    jp.close()


def test_export_html_carries_the_timeline_and_plotly(tmp_path) -> None:
    import json
    import re

    s = _monitor_session(steps=300, spike=200)
    src = nbdebug.ui.source.SessionSource(s)
    page = nbdebug.ui.export.export_html(src, tmp_path / "run.html").read_text()
    assert 'id="nbdebug-plotly-src" data-encoding="base64"' in page
    data = json.loads(re.search(r'id="nbdebug-timeline-data">(.*?)</script>', page).group(1))
    msg = data["messages"][0]
    assert msg["type"] == "timeline" and msg["steps"] == [0, 299] and len(msg["buffers_b64"]) == 8
