"""The panel's words and the text it lays out (#22 item 16): one line per shape in node details, a data-flow
column that is never clipped, an idle bar that counts the steps already run, the tensor title naming the
step of the mode shown, slice labels that are not cut, table notes on their own lines, counts as whole
numbers, no "Paused: paused.", the recommended-watchpoints offer that goes when it is moot, and one meaning
of "step" in the status bar (the panel header's)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn

import nbdebug
from nbdebug.lab.commands import status
from nbdebug.ui.controls import paused_text
from nbdebug.ui.panel import Panel
from nbdebug.watch.firing import Hit

LIN = "Functional.linear.0.forward"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc(x)


@pytest.fixture
def three_steps():
    """Three steps run directly (no dbg.run), then a panel."""
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    for _ in range(3):
        model(torch.randn(4, 512)).sum().backward()
        dbg.step()
    panel = Panel(dbg, recommend=False)
    yield dbg, panel
    panel.close()
    dbg.close()


def _node(dbg, prefix: str) -> str:
    return next(n for n in dbg.graph.nodes if n.startswith(prefix))


def test_details_shape_on_one_line_and_the_data_flow_column_has_room(three_steps):
    dbg, panel = three_steps
    panel.details.show(_node(dbg, "Module.fc.Linear.forward"))
    table = panel.details.table.value
    assert "<td style='white-space:nowrap'>4×512</td>" in table, table[:600]
    assert "(4, 512)" not in table
    assert "overflow-x:auto" in table  # a narrow panel scrolls the table sideways instead of clipping it
    # the value and the data flow on rows of their own, across the table (not a squeezed column)
    assert re.search(r"<td class='nbdebug-details-value' colspan='11' style='white-space:normal;[^']*'>\[", table)
    assert re.search(r"<td class='nbdebug-details-flow' colspan='11' style='white-space:normal;[^']*'>(from|to) ",
                     table)


def test_idle_after_steps_does_not_say_training_has_not_started(three_steps):
    _dbg, panel = three_steps
    panel.controls.refresh(force=True)
    text = panel.controls.status.value
    assert "has not started" not in text
    assert text.startswith("3 steps recorded") and "dbg.run(train, paused=True)" in text


def test_fresh_debugger_still_says_how_to_start():
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        panel = Panel(dbg, recommend=False)
        assert panel.controls.status.value.startswith("Training has not started")
        panel.close()
    finally:
        dbg.close()


def test_paused_line_never_repeats_paused():
    assert paused_text("paused", None) == "Paused."
    assert paused_text("paused", "Functional.linear.0.forward") == "Paused at <code>Functional.linear.0.forward</code>."
    assert paused_text("step 2 done.", None) == "Paused: step 2 done."


def test_tensor_title_names_the_step_of_the_mode_shown(three_steps):
    dbg, panel = three_steps
    tv = panel.tensor_view
    tv.open(_node(dbg, "Module.fc.Linear.forward"), "output.0", step=2)
    assert "current step 2" in tv.title.value
    tv.mode.value = "previous"
    assert "previous step 1" in tv.title.value and "current step 2" not in tv.title.value
    tv.mode.value = "compare"
    assert "difference step 2 − step 1" in tv.title.value


def test_slice_labels_are_as_wide_as_their_text(three_steps):
    dbg, panel = three_steps
    tv = panel.tensor_view
    tv.open(_node(dbg, "Module.fc.Linear.forward"), "input.0")
    box = tv.slices.children[1]
    assert box.description == "dim 1 (512)"
    assert box.style.description_width == "initial" and box.layout.width == "auto"


def test_table_and_heatmap_notes_on_their_own_lines(three_steps):
    dbg, panel = three_steps
    tv = panel.tensor_view
    tv.open(_node(dbg, "Module.fc.Linear.forward"), "input.0")
    html = tv.table.value
    assert "table shows 4×16 of 4×512" in html
    assert not re.search(r"4×512</small><small>", html) and "4×512showing" not in re.sub(r"<[^>]+>", "", html)
    assert "<div class='nbdebug-table-note'>" in html


def test_counts_read_as_whole_numbers():
    assert Hit("nan_count", 0.0, 65536.0).describe() == "nan_count = 65536 (> 0)"
    assert Hit("pos_inf_count", 0.0, 3).describe() == "pos_inf_count = 3 (> 0)"


def test_recommend_offer_goes_once_the_user_set_watchpoints():
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        panel = Panel(dbg, recommend=True)
        assert panel.recommend_bar.layout.display == "flex"
        dbg.watch("TO")  # in a cell: the panel's poll sees it
        panel.poll()
        panel.flush()
        assert panel.recommend_bar.layout.display == "none"
        panel.close()
    finally:
        dbg.close()


def test_status_bar_step_is_the_header_step(three_steps):
    dbg, panel = three_steps
    panel.header.refresh()
    st = status(dbg)
    assert panel.header.step.value == "2"
    assert st["shown_step"] == 2 and st["step"] == 3
