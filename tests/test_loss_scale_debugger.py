"""Debugger.track_loss_scale with a real torch GradScaler: per-step scale/overflow, persisting overflow."""

import torch
import torch.nn as nn

import nbdebug
from nbdebug.control import State


def test_gradscaler_history_and_persisting_overflow_pauses_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    dbg = nbdebug.Debugger(model, level="L0")
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    tracker = dbg.track_loss_scale(scaler)
    fired = []
    dbg.on("hit", fired.append)
    dbg.watch_loss_scale(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train():
        for i in range(8):
            opt.zero_grad()
            loss = model(torch.randn(2, 4)).pow(2).mean()
            if 2 <= i <= 5:
                loss = loss * float("inf")  # overflowing gradients for four steps in a row
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()

    dbg.run(train)
    assert dbg.wait(30) is State.PAUSED  # overflow persisted 3 steps: paused at the next node boundary
    hist = dbg.loss_scale_history()
    assert [r.overflow for r in hist[:5]] == [False, False, True, True, True]
    assert hist[0].scale == 1024.0 and hist[3].scale == hist[2].scale / 2
    assert [r.step for r in hist] == list(range(len(hist)))  # skipped optimizer steps still end a step
    assert fired and fired[0].k == 3 and fired[0].first_step == 2
    assert tracker is dbg.loss_scale
    dbg.cont()
    assert dbg.wait(30) is State.FINISHED
    assert dbg.step_index == 8
    dbg.close()
    assert "update" not in scaler.__dict__  # unwrapped on close


def test_panel_header_shows_the_loss_scale_and_overflow_run():
    from nbdebug.ui.panel import Panel

    model = nn.Linear(3, 1)
    dbg = nbdebug.Debugger(model, level="L0")
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    dbg.track_loss_scale(scaler)
    panel = Panel(dbg, recommend=False)
    assert panel.header._ls_box.layout.display == "none"  # nothing tracked yet: no field
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for bad in (False, True, True):
        opt.zero_grad()
        loss = model(torch.ones(2, 3)).sum() * (float("inf") if bad else 1.0)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    panel.flush()
    assert panel.header._ls_box.layout.display is None
    assert panel.header.loss_scale.value.startswith("128")  # the scale the last step ran with (256, halved once)
    assert "overflow 2 steps in a row" in panel.header.loss_scale.value
    panel.close()
    dbg.close()


def test_tracking_the_scale_adds_no_op_to_the_graph_at_l1_and_mix():
    """The tracker reads the scale with torch ops of its own (a copy, a stack, one host read): under the op
    mode of L1/mix none of them may appear as an op of the model — the graph is the one without tracking."""

    def nodes(level, track):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
        with nbdebug.Debugger(model, level=level) as dbg:
            if track:
                dbg.track_loss_scale(scaler)
            for _ in range(3):
                opt.zero_grad()
                scaler.scale(model(torch.randn(2, 4)).pow(2).mean()).backward()
                scaler.step(opt)
                scaler.update()
            return set(dbg.graph.nodes)

    for level in ("L1", "mix"):
        assert nodes(level, track=True) == nodes(level, track=False), level
