"""The run timeline shows what the model computed: a NaN or ±Inf value is flagged in its step's column (heatmap
row and line), while a series absent at a step stays a gap (no flag) — also after the monitor folded the step
into a block."""

from __future__ import annotations

import numpy as np

from nbdebug.session.monitor import Monitor
from nbdebug.session.session import Session
from nbdebug.ui.timeline import Timeline
from nbdebug.ui.timeline_data import NAN, NEG_INF, POS_INF, decimate

LOSS, NORM = ("Run", "loss"), ("Module.fc.Linear", "output_norm")


def _session(steps: int, special: dict[int, float], absent: set[int], horizon: int = 10_000) -> Session:
    s = Session(framework="pytorch", live=False)
    s.monitor = Monitor(horizon=horizon, block=10)
    keys = [NORM, LOSS]
    for step in range(steps):
        loss = special.get(step, 1.0 + 0.001 * step)
        s.monitor.record(step, keys, np.array([2.0, loss]), present=np.array([True, step not in absent]))
    return s


def _flags(msg: dict, bufs: list[np.ndarray], row: int) -> np.ndarray:
    ncols = msg["shape"][1]
    rows = msg["nonfinite"]
    if row not in rows:
        return np.zeros(ncols, np.uint8)
    i = rows.index(row)
    return np.frombuffer(bufs[8].tobytes(), np.uint8)[i * ncols:(i + 1) * ncols]


def test_decimate_flags_computed_nonfinite_not_absent_steps() -> None:
    steps = np.array([0, 1, 2, 4, 5, 6])  # step 3 absent
    values = np.array([1.0, np.nan, 2.0, np.inf, -np.inf, 3.0])
    cols = decimate(steps, values, 0, 6, 100)
    assert cols.flags.tolist() == [0, NAN, 0, 0, POS_INF, NEG_INF, 0]
    assert np.isnan(cols.vmax[1]) and np.isnan(cols.vmax[3])  # both no number: only the flag tells them apart
    two = decimate(steps, values, 0, 6, 2)  # columns 0..2 and 3..6
    assert two.flags.tolist() == [NAN, POS_INF | NEG_INF]


def test_message_marks_nan_step_and_leaves_absent_step_a_gap() -> None:
    k, j, pinf, ninf = 37, 52, 60, 61
    s = _session(100, {k: float("nan"), pinf: float("inf"), ninf: float("-inf")}, absent={j})
    tl = Timeline(s)
    tl.set_field("loss")
    msg, bufs = tl.message()
    assert [r[0] for r in msg["rows"]] == ["Run"] and msg["shape"] == [1, 100]
    heat = np.frombuffer(bufs[2].tobytes(), np.float32)
    assert np.isnan(heat[k]) and np.isnan(heat[j])  # the values: both no number…
    for row in (0, 1):  # the heatmap's row and the line (index = rows)
        flags = _flags(msg, bufs, row)
        assert flags[k] == NAN and flags[j] == 0  # …but only the computed NaN is flagged
        assert flags[pinf] == POS_INF and flags[ninf] == NEG_INF
        assert np.flatnonzero(flags).tolist() == [k, pinf, ninf]
    assert msg["nonfinite"] == [0, 1] and bufs[8].dtype == np.uint8 and bufs[8].nbytes == 200

    tl.set_field("output_norm")  # a finite series: no flag sent, no bytes
    msg, bufs = tl.message()
    assert msg["nonfinite"] == [] and len(bufs) == 8  # no ninth buffer


def test_folded_block_keeps_the_nan_flag() -> None:
    # horizon 100: the first steps fold into blocks of 10; step 13 (NaN) and step 27 (absent) are folded
    s = _session(400, {13: float("nan")}, absent={27}, horizon=100)
    tl = Timeline(s)
    tl.set_field("loss")
    msg, bufs = tl.message()
    first = np.frombuffer(bufs[0].tobytes(), np.int32)
    last = np.frombuffer(bufs[1].tobytes(), np.int32)
    flags = _flags(msg, bufs, 0)
    bad = np.flatnonzero(flags)
    assert len(bad) and all(first[c] <= 19 and last[c] >= 10 for c in bad)  # only the block holding step 13
    assert all(flags[c] == NAN for c in bad)
    block3 = [c for c in range(len(first)) if first[c] <= 27 <= last[c]]
    assert flags[block3].tolist() == [0]  # an absent value folded: still no flag


def test_job_timeline_flags_the_rank_whose_step_was_nan() -> None:
    from nbdebug.job import Job
    from nbdebug.offline import OfflineSession
    from nbdebug.ui.job_timeline import RankTimeline

    ranks = {0: OfflineSession(_session(30, {}, absent={4})),
             1: OfflineSession(_session(30, {11: float("nan"), 12: float("inf")}, absent=set()))}
    tl = RankTimeline(Job(ranks))
    tl.field, tl.name = "loss", "Run"
    msg, bufs = tl.message()
    assert msg["shape"] == [2, 30] and msg["nonfinite"] == [1]  # rank 1 only (rank 0's step 4 absent: a gap)
    assert np.flatnonzero(_flags(msg, bufs, 1)).tolist() == [11, 12]
    assert _flags(msg, bufs, 1)[[11, 12]].tolist() == [NAN, POS_INF]
    tl.selected = 1  # the line is rank 1's: flagged too (index rows)
    msg, bufs = tl.message()
    assert msg["nonfinite"] == [1, 2] and np.flatnonzero(_flags(msg, bufs, 2)).tolist() == [11, 12]


def test_history_field_flags_the_step_whose_tensor_was_nan() -> None:
    import torch
    from torch import nn

    import nbdebug

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = nbdebug.Debugger(model)
    for i in range(6):
        opt.zero_grad()
        x = torch.randn(2, 3)
        if i == 3:
            x[0, 0] = float("nan")
        model(x).sum().backward()
        if i != 3:
            opt.step()
    tl = Timeline(dbg.session)
    tl.set_field("norm")  # each forward module's output.0 from the per-tensor statistics
    msg, bufs = tl.message()
    first = np.frombuffer(bufs[0].tobytes(), np.int32).tolist()
    col = first.index(3)
    assert msg["nonfinite"] and msg["nonfinite"][0] == 0
    for row in range(msg["shape"][0]):
        flags = _flags(msg, bufs, row)
        assert np.flatnonzero(flags).tolist() == [col] and flags[col] == NAN, (row, flags)
