"""Watchpoints on a live session: selection, editing, hits, recheck, recommendations, pausing on hits."""

import numpy as np
import pytest
import torch
import torch.nn as nn

import nbdebug
from nbdebug.control import State


class Poisoned(nn.Module):
    """Trains cleanly until ``poison_step``; then log() of a negative value makes a NaN in fc1's scope."""

    def __init__(self, poison_step=2):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.fc2 = nn.Linear(8, 3)
        self.poison_step = poison_step
        self.calls = 0

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        if self.calls == self.poison_step:
            h = torch.log(h - 1e3)
        self.calls += 1
        return self.fc2(h)


def trainer(model, steps=5, lr=0.05, frozen=None):
    def train():
        g = torch.Generator().manual_seed(0)
        params = [p for n, p in model.named_parameters() if n != frozen]
        opt = torch.optim.SGD(params, lr=lr)
        for _ in range(steps):
            opt.zero_grad()
            model(torch.randn(4, 6, generator=g)).pow(2).mean().backward()
            opt.step()
    return train


@pytest.mark.parametrize("check", ["step", "node"])
def test_injected_nan_pauses_at_the_right_node_and_step(check):
    torch.manual_seed(0)
    model = Poisoned(poison_step=2)
    dbg = nbdebug.Debugger(model, level="L1", check=check)
    dbg.watch("TO")
    dbg.run(trainer(model))
    assert dbg.wait(20) is State.PAUSED
    first = dbg.hits[0]
    assert (first.node, first.slot, first.step) == ("Torch.log.0.forward", "output.0", 2)
    assert first.condition == "TO" and first.hits[0].param == "nan_count" and first.hits[0].actual > 0
    if check == "node":
        assert dbg.current_node == "Torch.log.0.forward" and dbg.step_index == 2
        assert len(dbg.hits) == 1  # paused right after the offending node
    else:
        assert dbg.current_node is None and dbg.step_index == 3  # end of step 2 with all its hits
        assert len({h.node for h in dbg.hits}) > 3  # the NaN spread downstream and into backward
        orders = [h.order for h in dbg.hits]
        assert orders == sorted(orders)
    assert dbg.first_nonfinite(step=2)[0] == "Torch.log.0.forward"
    dbg.terminate()
    assert dbg.wait(10) is State.TERMINATED
    dbg.close()


def test_gradient_explosion_and_frozen_weight():
    torch.manual_seed(0)
    model = Poisoned(poison_step=1)
    dbg = nbdebug.Debugger(model, level="L0")
    ge = dbg.watch("GE")
    wnc = dbg.watch("WNC", nodes="Parameter.fc2.*")
    dbg.run(trainer(model, steps=1, frozen="fc2.weight"), block=True)
    assert dbg.state is State.FINISHED
    trainer(model, steps=1, frozen="fc2.weight")()  # step 1: poisoned
    wnc_hits = [h for h in dbg.hits if h.watchpoint == wnc.id and h.step == 1]
    assert [h.node for h in wnc_hits if h.hits] == ["Parameter.fc2.weight"]  # bias trains, weight frozen
    assert "frozen" in wnc_hits[0].advice or "optimizer" in wnc_hits[0].advice
    first_step0 = [h for h in dbg.hits if h.watchpoint == wnc.id and h.step == 0]
    assert first_step0 == []  # nothing to compare with on the first step: no hit and no notice
    ge_hits = [h for h in dbg.hits if h.watchpoint == ge.id]
    assert ge_hits and all(h.step == 1 for h in ge_hits)
    assert any(h.node.startswith("Module.fc1.Linear.parameters_grad") for h in ge_hits)
    assert "clip" in ge_hits[0].advice.lower() or "learning rate" in ge_hits[0].advice.lower()
    dbg.close()


def test_watch_editing_and_selection():
    torch.manual_seed(0)
    model = Poisoned(poison_step=99)
    dbg = nbdebug.Debugger(model, level="mix")
    trainer(model, steps=1)()
    wp = dbg.watch("TL", max_gt=0.0, nodes=["Functional.linear.*.forward"])
    assert dbg.watchpoints.selected_nodes(wp) == ["Functional.linear.0.forward", "Functional.linear.1.forward"]
    dbg.update_watch(wp, add="Torch.relu.0.forward", remove="Functional.linear.1.forward")
    assert set(dbg.watchpoints.selected_nodes(wp)) == {"Functional.linear.0.forward", "Torch.relu.0.forward"}
    grads = dbg.watch("GL", max_gt=1e3)
    sel = dbg.watchpoints.selected_nodes(grads)
    assert sel and all(dbg.graph[n].section == "backward" for n in sel)
    weights = dbg.watchpoints.selected_nodes(dbg.watch("WL", abs_mean_gt=10))
    assert sorted(weights) == ["Parameter.fc1.bias", "Parameter.fc1.weight", "Parameter.fc2.bias",
                               "Parameter.fc2.weight"]
    acts = dbg.watchpoints.selected_nodes(dbg.watch("AR", max_min_gt=100))
    assert acts == ["Torch.relu.0.forward"]
    dbg.update_watch(wp, max_gt=5.0)
    assert wp.params["max_gt"] == 5.0
    dbg.update_watch(wp, enabled=False)
    assert not wp.enabled
    assert len(dbg.watchpoints.watchpoints) == 4
    dbg.unwatch(grads)
    assert grads.id not in dbg.watchpoints.watchpoints
    dbg.unwatch()
    assert not dbg.watchpoints.watchpoints
    with pytest.raises(KeyError, match="no watchpoint"):
        dbg.unwatch(999)
    dbg.close()


@pytest.mark.parametrize("cond, params, match", [
    ("TL", {"abs_mean_gt": -1}, "abs_mean_gt.*>= 0"),
    ("TZ", {"zero_percentage_ge": 150}, r"zero_percentage_ge.*\[0, 100\]"),
    ("TR", {"range_percentage_lt": 5}, "range_start_inclusive"),
    ("GL", {"bogus": 1}, "bogus"),
    ("XX", {}, "XX"),
])
def test_invalid_parameters_are_clear_errors(cond, params, match):
    dbg = nbdebug.Debugger(nn.Linear(2, 2))
    with pytest.raises(ValueError, match=match):
        dbg.watch(cond, **params)
    assert not dbg.watchpoints.watchpoints  # nothing created
    dbg.close()


def test_recheck_evaluates_edited_watchpoints_without_advancing():
    torch.manual_seed(0)
    model = Poisoned(poison_step=99)
    dbg = nbdebug.Debugger(model, level="L1")
    dbg.run(trainer(model, steps=4), paused=True)
    dbg.cont(steps=2)
    assert dbg.wait(10) is State.PAUSED and dbg.step_index == 2
    assert dbg.recheck() == []
    dbg.watch("TL", max_gt=-1e9, nodes="Torch.relu.0.forward")
    found = dbg.recheck()
    assert [(h.node, h.step) for h in found] == [("Torch.relu.0.forward", 1)]
    assert found[0].hits[0].param == "max_gt" and found[0].hits[0].threshold == -1e9
    assert dbg.step_index == 2 and dbg.state is State.PAUSED
    dbg.terminate()
    dbg.wait(10)
    dbg.close()


def test_value_conditions_read_only_watched_tensors(monkeypatch):
    torch.manual_seed(0)
    model = Poisoned(poison_step=99)
    dbg = nbdebug.Debugger(model, level="L1")
    trainer(model, steps=1)()
    asked = []
    real = dbg.session.tensor
    monkeypatch.setattr(dbg.session, "tensor", lambda n, s, step="current": (asked.append(n), real(n, s, step))[1])
    dbg.watch("TR", nodes="Torch.relu.*.forward", range_start_inclusive=0, range_end_inclusive=0,
              range_percentage_gt=10)
    dbg.watch("TO")
    dbg.watch("GL", max_gt=1e6)
    hits = dbg.recheck()
    assert set(asked) == {"Torch.relu.0.forward"}
    tr = [h for h in hits if h.condition == "TR"]
    relu = dbg.tensor("Torch.relu.0.forward", "output.0")
    assert tr and np.isclose(tr[0].hits[0].actual, (relu == 0).mean() * 100)
    dbg.close()


def test_recommended_set_and_apply():
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2), nn.ReLU())
    dbg = nbdebug.Debugger(model, level="L0")
    model(torch.randn(2, 4)).sum().backward()
    dbg.step()
    rec = dbg.recommend()
    conds = [c for c, _, _ in rec]
    assert conds[:6] == ["TO", "GE", "WNC", "GV", "WCL", "WI"]
    ar = [t for c, _, t in rec if c == "AR"]
    assert {k for t in ar for k in t.op_kinds} == {"tanh", "relu"}
    wps = dbg.watch_recommended()
    assert len(wps) == len(rec)
    relu_rule = [w for w in wps if w.condition == "AR" and "relu" in w.target.op_kinds][0]
    assert dbg.watchpoints.selected_nodes(relu_rule) == ["Module.3.ReLU.forward.0"]
    dbg.close()


def test_hit_events_reach_subscribers():
    torch.manual_seed(0)
    model = Poisoned(poison_step=0)
    dbg = nbdebug.Debugger(model, level="L1")
    got = []
    dbg.on("hit", got.append)
    dbg.watch("TO", nodes="Torch.log.0.forward")
    dbg.run(trainer(model, steps=2), block=False)
    assert dbg.wait(10) is State.PAUSED
    assert [h.node for h in got] == ["Torch.log.0.forward"]
    dbg.close()
    assert dbg.state is State.TERMINATED


def test_watched_values_are_kept_over_the_memory_budget():
    torch.manual_seed(0)
    model = Poisoned(poison_step=99)
    dbg = nbdebug.Debugger(model, level="L1", memory_budget=0)  # nothing fits
    trainer(model, steps=1)()
    with pytest.raises(nbdebug.NotRetainedError, match="memory budget"):
        dbg.tensor("Torch.relu.0.forward", "output.0")
    dbg.watch("TR", nodes="Torch.relu.0.forward", range_start_inclusive=0, range_end_inclusive=0,
              range_percentage_gt=10)
    dbg.watch("WNC", nodes="Parameter.fc1.weight")
    trainer(model, steps=2)()
    assert dbg.tensor("Torch.relu.0.forward", "output.0").shape == (4, 8)
    wnc = [h for h in dbg.hits if h.condition == "WNC" and h.step == 2]
    assert wnc == []  # previous value was kept: the check ran (and the weight did change)
    assert not [h for h in dbg.hits if h.step == 2 and h.error in ("value_not_retained", "too_large_to_keep")]
    with pytest.raises(nbdebug.NotRetainedError):
        dbg.tensor("Functional.linear.1.forward", "output.0")  # not watched: still refused
    dbg.close()


def test_an_infinite_gradient_is_too_large_and_pauses():
    """GL max_gt on a gradient that became +inf is a hit (actual inf) and pauses training, not a notice; a
    mean that is NaN because the tensor holds +inf and -inf is a notice saying why."""

    class Blows(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.fc(x) * (3e38 if self.calls == 3 else 1.0)

    torch.manual_seed(0)
    model = Blows()
    dbg = nbdebug.Debugger(model, level="L0")
    dbg.watch("GL", max_gt=1e3)  # every gradient

    def train():
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(5):
            opt.zero_grad()
            (model(torch.ones(2, 4)).sum() * 10.0).backward()
            opt.step()

    dbg.run(train)
    assert dbg.wait(20) is State.PAUSED
    hit = next(h for h in dbg.hits if h.is_hit)
    assert hit.step == 2 and hit.hits[0].param == "max_gt" and hit.hits[0].actual == np.inf
    grad = dbg.tensor(hit.node, hit.slot, 2)
    assert np.isposinf(grad).any() and not np.isnan(grad).any()
    mixed = nbdebug.watch.conditions.evaluate_stats(
        "TL", {"mean_gt": 1.0}, nbdebug.watch.conditions.compute_stats(np.array([np.inf, -np.inf, 1.0]))[None])
    assert [(f.hits, f.error, f.unchecked) for f in mixed] == [((), "inf_present", ("mean_gt",))]
    dbg.terminate()
    assert dbg.wait(10) is State.TERMINATED
    dbg.close()
