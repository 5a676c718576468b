"""Kernel-level panel tests: real PyTorch training on the worker thread, driven by the panel's widgets."""

import asyncio
import itertools
import threading
import time

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import Net, train_steps

import nbdebug
from nbdebug.control import State
from nbdebug.ui.panel import Panel

RELU = "Functional.relu.0.forward"


def endless(model, seed=0):
    def train():
        g = torch.Generator().manual_seed(seed)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for _ in itertools.count():
            x = torch.randn(5, 8, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), torch.zeros(5, 4)).backward()
            opt.step()
    return train


@pytest.fixture
def live():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    panel = Panel(dbg)
    yield dbg, panel, model
    dbg.terminate()
    dbg.wait(10)
    panel.close()
    dbg.close()


def settle(dbg, panel):
    state = dbg.wait(10)
    panel.flush()
    return state


def enabled(panel):
    return {k: not b.disabled for k, b in panel.controls.buttons().items()}


def test_panel_drives_real_training(live):
    dbg, panel, model = live
    c = panel.controls
    # never started: nothing to press, the bar says how to start
    assert panel.header.state.value.endswith(">idle</span>")
    assert not any(enabled(panel).values())
    assert "dbg.run(" in c.status.value
    # first panel on a live session offers the recommended watchpoints; "no" creates nothing
    assert panel.recommend_bar.layout.display == "flex"
    panel.recommend_bar.children[2].click()
    assert panel.recommend_bar.layout.display == "none" and not dbg.watchpoints.watchpoints

    dbg.run(endless(model), paused=True)
    panel.flush()
    assert "paused" in panel.header.state.value
    assert enabled(panel) == {"ok": True, "continue": True, "pause": False, "terminate": True,
                              "run_to": False, "next_node": True}

    # OK with a step count: exactly one step, then paused
    c.step_count.value = 1
    c.ok.click()
    assert settle(dbg, panel) is State.PAUSED and dbg.step_index == 1
    # one step convention: the header shows the step whose data is shown (step 0, just finished) and,
    # paused at the step boundary, the step that runs next
    assert panel.header.step.value == "0" and "step 1 next" in panel.header.step_running.value
    assert "forward:act" in panel.graph_view.visible_keys()
    panel.select(RELU)
    assert "forward:act" in panel.graph_view.expanded and RELU in panel.graph_view.visible_keys()
    assert RELU in panel.details.title.value and "output.0" in panel.details.table.value
    assert enabled(panel)["run_to"]

    # the "+" form: invalid values show the ValueError text next to the field and create nothing
    wp = panel.watch
    wp.add.click()
    assert wp.form_open
    wp.condition.value = "TL"
    assert set(wp.fields) == {"abs_mean_gt", "max_gt", "min_gt", "mean_gt"}
    wp.field("abs_mean_gt").value = "-1"
    wp.create.click()
    assert "abs_mean_gt" in wp.errors() and "must be >= 0, got -1" in wp.errors()["abs_mean_gt"]
    assert not dbg.watchpoints.watchpoints and wp.form_open
    wp.field("abs_mean_gt").value = "big"
    wp.create.click()
    assert "must be a number" in wp.errors()["abs_mean_gt"] and not dbg.watchpoints.watchpoints
    wp.field("abs_mean_gt").value = ""
    wp.create.click()
    assert "at least one parameter" in wp.errors()["form"] and not dbg.watchpoints.watchpoints
    wp.field("max_gt").value = "0"
    wp.only_selected.value = True
    wp.create.click()
    assert wp.errors() == {} and not wp.form_open
    (made,) = dbg.watchpoints.watchpoints.values()
    assert (made.condition, made.params, made.nodes) == ("TL", {"max_gt": 0.0}, [RELU])
    assert len(wp.rows()) == 1

    # CONTINUE: the watchpoint fires at the end of the step; the hit shows in the list
    panel.select("Input.0")
    c.cont.click()
    assert settle(dbg, panel) is State.PAUSED and "watchpoint hit" in dbg.pause_reason
    rows = panel.hit_list.rows()
    assert len(rows) == 1
    hit = dbg.hits[0]
    select_btn, view_btn, detail = rows[0].children
    assert select_btn.description == "TL · output.0"
    (group,) = panel.hit_list.groups()  # grouped by node: the title names the node and the step
    assert RELU in group.children[0].value and f"step {hit.step}" in group.children[0].value
    assert f"max_gt = 0 set, actual max = {hit.hits[0].actual:.4g}" in detail.value
    assert panel.header.hit_count.value == "1"
    select_btn.click()
    assert panel.selected == RELU
    gv = panel.graph_view
    sent_marks = next(m for m in gv.widget.recorded() if m["type"] == "marks")
    assert sent_marks["badges"] == {str(gv.feed.ids[RELU]): "TL"}
    assert sent_marks["step"] == f"step {panel.header.step.value}"  # one step convention with the header

    # View: the tensor view on the hit's tensor; slice changes update the heatmap data
    view_btn.click()
    tv = panel.tensor_view
    assert tv.visible and f"step {hit.step}" in tv.title.value
    cur = dbg.tensor(RELU, "output.0", hit.step)
    prev = dbg.tensor(RELU, "output.0", hit.step - 1)
    assert np.array_equal(tv.shown, cur) and tv.message["step"] == f"current step {hit.step}"
    assert tv.heatmap.recorded_buffers("heatmap") == [cur.astype(np.float32).tobytes()]
    tv.slices.children[0].value = "1:3"
    assert np.array_equal(tv.shown, cur[1:3]) and tv.message["rows"] == [1, 2]  # original indices
    tv.slices.children[1].value = "4"
    assert np.array_equal(tv.shown, cur[1:3, 4][None, :])
    assert (tv.message["cols"], tv.message["rows"], tv.message["index"]) == ([1, 2], None, [None, 4])
    tv.slices.children[0].value = "9"
    assert "out of range" in tv.slice_error.value
    assert np.array_equal(tv.shown, cur[1:3, 4][None, :])  # unchanged
    tv.set_selection([":", ":"])
    tv.mode.value = "previous"
    assert np.array_equal(tv.shown, prev) and tv.message["step"] == f"previous step {hit.step - 1}"
    tv.mode.value = "compare"
    diff = (cur - prev).astype(np.float64)
    assert np.allclose(tv.shown, diff) and tv.message["scale"] == "diverging"
    assert tv.message["step"] == f"difference step {hit.step} − step {hit.step - 1}"
    tv.tolerance.value = 0.5
    bound = 0.5 * np.abs(diff).max()
    assert np.allclose(tv.shown, np.where(np.abs(diff) <= bound, 0, diff))
    assert "difference" in tv.stats.value and "Inf" in tv.stats.value
    assert "max_gt" in tv.hits.value and "nbdebug-advice" in tv.hits.value
    assert tv.marks == {RELU: "TL"}
    g = dbg.graph
    assert set(tv._rel_names) == {RELU} | g.predecessors(RELU) | g.successors(RELU)
    tv.hops.value = 2
    up, down = g.neighbourhood(RELU, 2)
    assert set(tv._rel_names) == {RELU} | up | down and len(up | down) > len(g.predecessors(RELU) | g.successors(RELU))

    # disable the watchpoint from its row, then CONTINUE / PAUSE while the worker trains
    wp.rows()[0].children[0].value = False
    assert made.enabled is False
    c.cont.click()
    assert "running" in panel.header.state.value
    assert enabled(panel) == {"ok": False, "continue": False, "pause": True, "terminate": True,
                              "run_to": False, "next_node": False}
    time.sleep(0.05)
    c.pause.click()
    assert settle(dbg, panel) is State.PAUSED and dbg.pause_reason == "paused"

    # next node, then run to the selected node: the graph marks where training is paused
    c.next_node.click()
    assert settle(dbg, panel) is State.PAUSED and dbg.current_node is not None
    paused_at = next(m for m in panel.graph_view.widget.recorded() if m["type"] == "marks")["paused"]
    assert paused_at == panel.graph_view.feed.ids[dbg.current_node]
    panel.select(RELU)
    c.run_to.click()
    assert settle(dbg, panel) is State.PAUSED
    if dbg.current_node is None:  # paused after the relu of this step: run-to stops at the step's end
        assert "did not execute" in dbg.pause_reason and "did not execute" in c.status.value
        c.run_to.click()
        assert settle(dbg, panel) is State.PAUSED
    assert dbg.current_node == RELU
    assert next(m for m in panel.graph_view.widget.recorded()
                if m["type"] == "marks")["paused"] == panel.graph_view.feed.ids[RELU]
    assert RELU in panel.header.reason.value

    c.terminate.click()
    assert settle(dbg, panel) is State.TERMINATED
    assert not any(enabled(panel).values()) and "terminated" in c.status.value
    assert panel.errors == []


def test_failed_training_reaches_the_panel():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="L0")
    panel = Panel(dbg, recommend=False)
    try:
        def boom():
            model(torch.randn(2, 8))
            raise RuntimeError("loss went sideways")

        dbg.run(boom)
        assert settle(dbg, panel) is State.FAILED
        assert "failed" in panel.header.state.value
        assert "RuntimeError: loss went sideways" in panel.controls.status.value
        assert "Traceback" in panel.controls.status.value
        assert not any(enabled(panel).values())
        # a refused command is shown in the bar, not raised
        panel.controls.run_to.disabled = False
        panel.selected = None
        panel.controls.run_to.click()
        assert "select a node first" in panel.controls.status.value
    finally:
        panel.close()
        dbg.close()


def test_watchpoint_list_actions_and_recommended():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        train_steps(model, 2)
        panel = Panel(dbg, recommend=True)
        assert panel.recommend_bar.layout.display == "flex"
        assert Panel(dbg).recommend_bar.layout.display == "none"  # offered once per debugger
        panel.recommend_bar.children[1].click()  # yes
        assert [w.condition for w in dbg.watchpoints.watchpoints.values()] == \
            [c for c, _, _ in dbg.recommend()]
        assert len(panel.watch.rows()) == len(dbg.watchpoints.watchpoints)
        panel.watch.clear.click()
        assert not dbg.watchpoints.watchpoints and panel.watch.rows() == []

        panel.watch.add.click()
        panel.watch.condition.value = "WL"  # weight too large: selects all weights
        panel.watch.field("abs_mean_gt").value = "0.0"
        made = panel.watch.submit()
        assert made is not None and made.nodes is None
        weight = "Parameter.fc1.weight"
        panel.select(weight)
        (row,) = panel.watch.rows()
        enabled_box, label, pick, delete = row.children
        weights = [n.name for n in dbg.graph if n.kind == "parameter" and n.section == "forward"]
        assert len(weights) == 6  # fc1, block.lin (used twice), fc2: weight and bias each
        assert pick.value is True and pick.description == weight and "(6 nodes)" in label.value
        pick.value = False
        assert weight in made.removed and weight not in dbg.watchpoints.selected_nodes(made)
        (row,) = panel.watch.rows()
        assert row.children[2].value is False and "(5 nodes)" in row.children[1].value
        row.children[2].value = True
        assert weight in dbg.watchpoints.selected_nodes(made)

        panel.watch.recheck.click()
        panel.flush()
        n = sum(1 for h in dbg.hits if h.hits)
        assert n == 6 and f"recheck: {n} hits" in panel.watch.message.value
        assert len(panel.hit_list.rows()) == n and panel.header.hit_count.value == str(n)
        # every weight carries the WL badge (the browser shows a collapsed scope's badges on its box)
        gv = panel.graph_view
        badges = next(m for m in gv.widget.recorded() if m["type"] == "marks")["badges"]
        assert badges == {str(gv.feed.ids[w]): "WL" for w in weights}

        panel.watch.rows()[0].children[3].click()  # delete
        assert not dbg.watchpoints.watchpoints and panel.watch.rows() == []
        panel.flush()
        assert panel.hit_list.rows() == [] and panel.header.hit_count.value == "0"
        assert panel.errors == []
        panel.close()
    finally:
        dbg.close()


def offline_copy(session):
    """An offline session holding what a live one recorded (what a dump loader produces)."""
    from nbdebug.session.session import Session

    off = Session(framework=session.framework, framework_version=session.framework_version,
                  device=session.device, live=False)
    off.graph = session.graph
    off.steps = dict(session.steps)
    off.step_index = session.step_index
    off.store = session.store
    off.store_step = session.store_step
    return off


def test_offline_session_uses_the_same_panel_without_control():
    torch.manual_seed(0)
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    try:
        train_steps(model, 2)
        off = offline_copy(dbg.session)
    finally:
        dbg.close()
    panel = Panel(off)
    assert panel.controls is None and panel.recommend_bar.layout.display == "none"
    assert "offline" in panel.header.state.value and panel.header.step.value == "1"
    assert "nbdebug-offline" in panel._dom_classes
    assert len(panel.graph_view.visible_keys()) > 5
    panel.select(RELU)
    panel.watch.add.click()
    panel.watch.condition.value = "TZ"
    panel.watch.field("zero_percentage_ge").value = "1"
    panel.watch.only_selected.value = True
    assert panel.watch.submit() is not None
    panel.watch.recheck.click()
    panel.flush()
    (row,) = panel.hit_list.rows()
    assert "TZ" in row.children[0].description and "zero_percentage_ge = 1 set" in row.children[2].value
    row.children[1].click()
    assert panel.tensor_view.visible and panel.tensor_view.shown.shape == (5, 16)
    assert panel.errors == []
    panel.close()


def test_updates_are_coalesced_on_the_event_loop():
    """Inside an event loop (as in a kernel) redraws are scheduled there, at most ~10 per second, while
    the worker trains flat out; clicks from the loop still act at once."""
    async def main():
        torch.manual_seed(0)
        model = Net()
        dbg = nbdebug.Debugger(model, level="mix")
        panel = Panel(dbg, recommend=False)
        assert panel.coalescer.automatic
        changes = []
        panel.header.step.observe(lambda ch: changes.append(ch["new"]), names="value")
        try:
            dbg.run(endless(model))
            t0 = time.monotonic()
            await asyncio.sleep(1.5)
            panel.controls.pause.click()
            for _ in range(500):
                if dbg.state is State.PAUSED:
                    break
                await asyncio.sleep(0.01)
            assert dbg.state is State.PAUSED
            await asyncio.sleep(0.4)  # the last coalesced redraw lands
            elapsed = time.monotonic() - t0
            steps = dbg.step_index
            assert panel.coalescer.redraws <= 10 * elapsed + 3, (panel.coalescer.redraws, elapsed)
            assert len(changes) <= 10 * elapsed + 3
            assert steps > len(changes) >= 2  # many steps, few header updates, and it did follow
            shown = steps if len(dbg.session.recorder) else steps - 1  # paused before the step's first node
            assert panel.header.step.value == str(shown)
            assert "paused" in panel.header.state.value
            # something changed without an event (a watchpoint made in a cell): the poll picks it up
            dbg.watch("TO")
            await asyncio.sleep(1.3)
            assert len(panel.watch.rows()) == 1
        finally:
            dbg.terminate()
            for _ in range(500):
                if dbg.state is not State.PAUSED and dbg.state is not State.RUNNING:
                    break
                await asyncio.sleep(0.01)
            panel.close()
            dbg.close()

    # a thread of its own: this process may already have a (parked) loop in the main thread
    errors = []
    worker = threading.Thread(target=lambda: _run_collecting(main, errors))
    worker.start()
    worker.join(120)
    assert not worker.is_alive()
    if errors:
        raise errors[0]


def _run_collecting(main, errors):
    try:
        asyncio.run(main())
    except BaseException as e:  # re-raised in the test's thread
        errors.append(e)


def test_details_warn_when_a_name_moved_to_another_call_site():
    """An op that runs in some steps only shifts the counters: the node whose name now stands for another call
    site says so in its details (steps named), and a node that never moved has no such warning."""

    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.extra = False

        def forward(self, x):
            if self.extra:
                x = x * 2.0  # runs in step 1 only: takes the name of the later multiplication
            return self.fc(x) * 3.0

    torch.manual_seed(0)
    model = Gate()
    with nbdebug.Debugger(model, level="L1") as dbg:
        for extra in (False, True):
            model.extra = extra
            model(torch.ones(2, 4)).sum().backward()
            if not extra:
                dbg.step()
        moved = [n for n in dbg.graph if n.moved]
        assert [n.name for n in moved] == ["Tensor.__mul__.0.forward"] and moved[0].moved == [1]
        panel = Panel(dbg)
        panel.details.show("Tensor.__mul__.0.forward")
        assert "nbdebug-details-moved" in panel.details.title.value
        assert "before step 1" in panel.details.title.value
        panel.details.show("Functional.linear.0.forward")
        assert "nbdebug-details-moved" not in panel.details.title.value
        panel.close()


def test_a_pause_on_hits_selects_and_reveals_the_first_hit(live):
    """Training paused by a watchpoint: the panel selects the step's first hit (graph scopes opened on it,
    details on it) once; the user's own selection afterwards is kept."""
    dbg, panel, model = live
    dbg.watch("TL", nodes=[RELU, "Functional.linear.2.forward"], max_gt=-1e30)  # fires on every step
    dbg.run(endless(model))
    assert settle(dbg, panel) is State.PAUSED
    assert panel.selected == RELU, panel.selected  # relu runs before the third linear
    assert "forward:act" in panel.graph_view.expanded and RELU in panel.details.title.value
    panel.select("Functional.linear.0.forward")
    panel.flush()
    assert panel.selected == "Functional.linear.0.forward"  # the same pause is not followed again
