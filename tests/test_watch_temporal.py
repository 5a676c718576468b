"""Watchpoints over time (SPIKE, DRIFT, STALL, ODD_RANK): synthetic series with a known answer, and real
reproductions built here from configs (a GPT-2 whose learning rate jumps ×100, a frozen param group, four
in-process ranks one of which gets data ×1e3)."""

from __future__ import annotations

import numpy as np
import pytest

from nbdebug.session.monitor import Monitor
from nbdebug.session.session import Session
from nbdebug.watch.conditions import TEMPORAL, get_condition, validate
from nbdebug.watch.temporal import min_history, rank_outliers
from nbdebug.watch.watchpoints import WatchManager


def _bare(n_steps: int, series: dict, watches: list) -> tuple[WatchManager, list]:
    """A session whose monitor gets ``series[key](step)`` each step; the watchpoints checked at each step end."""
    s = Session(framework="none")
    s.monitor = Monitor()
    wm = WatchManager(s)
    wps = [wm.watch(c, nodes, **p) for c, nodes, p in watches]
    keys = list(series)
    hits = []
    for step in range(n_steps):
        s.monitor.record(step, keys, np.array([series[k](step) for k in keys], dtype=np.float64))
        hits += wm.temporal.check(wm.watchpoints.values(), step)
    return wm, hits, wps


def test_registry_and_validation():
    assert set(TEMPORAL) == {"SPIKE", "DRIFT", "STALL", "ODD_RANK"}
    assert get_condition("spike").category == "temporal"
    assert validate("SPIKE", {}) == {"field": "norm", "factor": 10.0, "window": 50}
    assert validate("DRIFT", {"field": "loss"}) == {"field": "loss", "z": 6.0, "window": 200}
    assert validate("STALL", {}) == {"field": "update_ratio", "below": 1e-8, "steps": 20}
    assert validate("ODD_RANK", {"z": 4}) == {"field": "norm", "z": 4.0}
    for bad, msg in (({"field": "nrom"}, "'field' must be a statistic"), ({"window": 2}, "whole number >= 3"),
                     ({"window": 7.5}, "whole number"), ({"factor": -1}, "> 0")):
        with pytest.raises(ValueError, match=msg):
            validate("SPIKE", bad)


def test_spike_fires_at_the_step_and_warm_up_holds():
    rng = np.random.default_rng(0)
    noise = 1.0 + 0.05 * rng.standard_normal(60)
    k = 40
    wm, hits, (wp,) = _bare(60, {("Run", "loss"): lambda s: noise[s] * (30.0 if s == k else 1.0),
                                 ("Run", "loss_scale"): lambda s: 100.0 if s == 3 else 1.0},
                            [("SPIKE", None, {"field": "loss", "window": 20})])
    assert [(h.step, h.node, h.slot) for h in hits] == [(k, "Run", "loss")]
    band = wm.temporal.bands[(wp.id, "Run", "loss", k)]
    assert band.since == k and 0.9 < band.median < 1.1 and band.n == 20 and band.value == pytest.approx(30 * noise[k])
    assert hits[0].hits[0].param == "factor" and hits[0].hits[0].actual > 10
    assert "median" in hits[0].advice and f"step {k}" in hits[0].advice
    # a spike inside the warm-up (step 3 < min_history(20) = 4 values) is not judged
    _, early, _ = _bare(10, {("Run", "loss_scale"): lambda s: 100.0 if s == 3 else 1.0},
                        [("SPIKE", "Run", {"field": "loss_scale", "window": 20})])
    assert min_history(20) == 4 and early == []
    _, later, _ = _bare(10, {("Run", "loss_scale"): lambda s: 100.0 if s == 4 else 1.0},
                        [("SPIKE", "Run", {"field": "loss_scale", "window": 20})])
    assert [h.step for h in later] == [4]


def test_drift_on_a_slowly_growing_series():
    rng = np.random.default_rng(1)
    noise = 0.01 * rng.standard_normal(400)
    k = 250
    series = {("Parameter.w", "weight_norm"): lambda s: 1.0 + noise[s] + (0.01 * (s - k) if s >= k else 0.0)}
    wm, hits, (wp,) = _bare(300, series, [("DRIFT", "Parameter.*", {"field": "weight_norm", "z": 6})])
    assert hits, "the drift was not found"
    first = min(h.step for h in hits)
    assert k < first <= k + 20
    band = wm.temporal.bands[(wp.id, "Parameter.w", "weight_norm", first)]
    assert k <= band.since <= first and abs(band.mean - 1.0) < 0.05 and band.std > 0
    # recheck over the kept history finds the same hits as the live evaluation
    again = wm.recheck_temporal()
    assert [(h.step, h.node) for h in again] == [(h.step, h.node) for h in hits]


def test_stall_counts_consecutive_steps_and_resets():
    series = {("Parameter.a", "update_ratio"): lambda s: 0.0 if 10 <= s < 40 else 1e-3,
              ("Parameter.b", "update_ratio"): lambda s: 0.0 if s % 10 else 1e-3}
    wm, hits, (wp,) = _bare(50, series, [("STALL", None, {"steps": 20})])
    assert {h.node for h in hits} == {"Parameter.a"}
    assert [h.step for h in hits] == list(range(29, 40))
    assert wm.temporal.bands[(wp.id, "Parameter.a", "update_ratio", 29)].since == 10


def test_many_series_vectorised():
    """Thousands of series in one watchpoint: only the spiked ones fire, at their step."""
    n = 2000
    s = Session(framework="none")
    s.monitor = Monitor()
    wm = WatchManager(s)
    wm.watch("SPIKE", field="grad_norm", window=20)
    keys = [(f"Parameter.p{i}", "grad_norm") for i in range(n)]
    rng = np.random.default_rng(2)
    found = []
    for step in range(40):
        row = 1.0 + 0.1 * rng.random(n)
        if step == 30:
            row[[5, 1234]] *= 50
        s.monitor.record(step, keys, row)
        found += wm.temporal.check(wm.watchpoints.values(), step)
    assert sorted((h.step, h.node) for h in found) == [(30, "Parameter.p1234"), (30, "Parameter.p5")]


def test_rank_outliers_mad_floor():
    same = np.array([[2.0], [2.0], [2.0], [2.0 * (1 + 1e-7)]])  # allreduced: equal up to rounding
    assert not rank_outliers(same, 6)[0].any()
    odd = np.array([[2.0], [2.1], [1.9], [2e3]])
    assert rank_outliers(odd, 6)[0][:, 0].tolist() == [False, False, False, True]
    assert not rank_outliers(odd[:2], 6)[0].any()  # fewer than 3 ranks: no median to speak of


# -- real reproductions -----------------------------------------------------------------------------------

torch = pytest.importorskip("torch")


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _fill_monitor(dbg, model, before, loss):
    """The monitor series this test needs, from the parameters' real values — unless the capture fills the
    monitor itself (then its own series are used)."""
    mon = dbg.session.monitor
    if any(f == "update_ratio" for _n, f in mon.keys) and not getattr(dbg, "_test_fills", False):
        return
    dbg._test_fills = True
    keys, vals, sq = [("Run", "loss"), ("Run", "grad_norm_total")], [float(loss)], 0.0
    for name, p in model.named_parameters():
        g = 0.0 if p.grad is None else float(p.grad.norm())
        sq += g * g
        w = float(before[name].norm())
        keys += [(f"Parameter.{name}", "update_ratio"), (f"Parameter.{name}", "grad_norm")]
        vals += [float((p.detach() - before[name]).norm()) / w if w else 0.0, g]
    vals[1] = sq ** 0.5
    mon.record(dbg.session.step_index, keys, np.array(vals))


def _train_gpt2(steps, *, lr_jump_at=None, frozen=None, watches=(), recommended=False, level="L0"):
    import nbdebug

    model = _gpt2()
    frozen_params = [p for n, p in model.named_parameters() if frozen and n == frozen]
    others = [p for n, p in model.named_parameters() if not (frozen and n == frozen)]
    groups = [{"params": others}] + ([{"params": frozen_params, "lr": 0.0}] if frozen_params else [])
    opt = torch.optim.Adam(groups, lr=1e-3)
    g = torch.Generator().manual_seed(1)
    with nbdebug.Debugger(model, level=level) as dbg:
        if not hasattr(dbg.session, "monitor"):
            dbg.session.monitor = Monitor()
        for c, nodes, p in watches:
            dbg.watch(c, nodes, **p)
        if recommended:
            dbg.watch_recommended()
        for step in range(steps):
            if step == lr_jump_at:
                for grp in opt.param_groups:
                    grp["lr"] *= 100
            ids = torch.randint(0, 100, (4, 12), generator=g)
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            _fill_monitor(dbg, model, before, loss.detach())
            opt.zero_grad()
            dbg.step()
        return dbg, dbg.hits


def test_gpt2_lr_jump_spikes_update_ratio_at_that_step():
    k = 20
    dbg, hits = _train_gpt2(k + 3, lr_jump_at=k,
                            watches=[("SPIKE", "Parameter.*", {"field": "update_ratio", "factor": 10})])
    spikes = [h for h in hits if h.condition == "SPIKE"]
    assert spikes and min(h.step for h in spikes) == k
    at_k = {h.node for h in spikes if h.step == k}
    assert len(at_k) >= 10 and all(n.startswith("Parameter.") for n in at_k)
    assert all(h.hits[0].actual > 10 for h in spikes)


def test_gpt2_clean_steps_fire_nothing():
    dbg, hits = _train_gpt2(25, watches=[("SPIKE", "Parameter.*", {"field": "update_ratio", "factor": 10})])
    assert [h for h in hits if h.condition in TEMPORAL] == []


def test_gpt2_stall_on_a_frozen_param_group():
    name = "transformer.h.1.mlp.c_fc.weight"
    dbg, hits = _train_gpt2(26, frozen=name, watches=[("STALL", "Parameter.*", {"steps": 20})])
    stalls = [h for h in hits if h.condition == "STALL"]
    assert {h.node for h in stalls} == {f"Parameter.{name}"}
    assert min(h.step for h in stalls) <= 21  # 20 steps after the first step the monitor holds


@pytest.fixture
def one_thread():
    """One intra-op thread: on a small shared machine two threads per tiny op cost 10-20× (contention)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _quiet_run(model, opt, batch, loss_fn, steps=200):
    """``steps`` clean steps at level='monitor' with the recommended temporal set, then one step with the
    learning rate ×100 (the set is live: SPIKE on update_ratio fires there, and only there)."""
    import nbdebug
    from nbdebug.watch.recommend import recommended_temporal

    with nbdebug.Debugger(model, level="monitor") as dbg:
        wps = [dbg.watch(c, **p) for c, p, _t in recommended_temporal()]
        for step in range(steps + 1):
            if step == steps:
                for grp in opt.param_groups:
                    grp["lr"] *= 100
            x, y = batch(step)
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        mon = dbg.session.monitor
        params = {f"Parameter.{n}" for n, _p in model.named_parameters()}
        assert mon.last_step == steps and len(mon) == steps + 1
        assert params <= {n for n, f in mon.keys if f == "update_ratio"} and ("Run", "grad_norm_total") in mon
        seen = {wp.id: len(dbg.watchpoints.temporal._states[wp.id].keys) for wp in wps}
        assert seen == {wps[0].id: 1, wps[1].id: len(params), wps[2].id: len(params)}  # every series evaluated
        temporal = [h for h in dbg.hits if h.condition in TEMPORAL]
        assert [h.describe() for h in temporal if h.step < steps] == []
        assert {h.node for h in temporal if h.step == steps and h.slot == "update_ratio"} & params


def test_recommended_temporal_set_is_quiet_on_200_clean_gpt2_steps(one_thread):
    model = _gpt2()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)

    def batch(_step):
        ids = torch.randint(0, 100, (2, 8), generator=g)
        return ids, ids

    _quiet_run(_Loss(model), opt, batch, lambda loss, _y: loss)


class _Loss(torch.nn.Module):
    """GPT-2 whose forward returns its language-model loss (``model(ids)`` in :func:`_quiet_run`)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, ids):
        return self.lm(input_ids=ids, labels=ids).loss


class _Block(torch.nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.short = (torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), torch.nn.BatchNorm2d(cout))
                      if stride != 1 or cin != cout else torch.nn.Identity())

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.short(x))


def _resnet():
    """A small ResNet (stem, two residual stages with BatchNorm, pooled linear head) for 16×16 images."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 1, 1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               _Block(8, 8, 1), _Block(8, 16, 2), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                               torch.nn.Linear(16, 10))


def test_recommended_temporal_set_is_quiet_on_200_clean_resnet_steps(one_thread):
    model = _resnet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    g = torch.Generator().manual_seed(2)
    centers = torch.randn(10, 3, 16, 16, generator=torch.Generator().manual_seed(3))

    def batch(_step):  # a learnable task: noisy class templates
        y = torch.randint(0, 10, (16,), generator=g)
        return centers[y] + 0.5 * torch.randn(16, 3, 16, 16, generator=g), y

    _quiet_run(model, opt, batch, torch.nn.functional.cross_entropy)


def test_gradient_norm_spike_without_the_monitor():
    """Per-tensor statistics are series too: SPIKE on the norm of gradient nodes when one batch is ×1e3."""
    import nbdebug

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(3)
    k = 15
    with nbdebug.Debugger(model, level="L0") as dbg:
        dbg.watch("SPIKE", "*backward*", field="norm", factor=10, window=10)
        for step in range(k + 1):
            x = torch.randn(16, 6, generator=g)
            y = torch.randn(16, 1, generator=g) * (1e3 if step == k else 1.0)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        spikes = [h for h in dbg.hits if h.condition == "SPIKE"]
        assert spikes and {h.step for h in spikes} == {k}


def test_odd_rank_in_process_job_names_the_rank():
    """Four in-process ranks (one Debugger each); rank 2's data is ×1e3 from step k: ODD_RANK names rank 2
    at step k, and nothing fires before."""
    import nbdebug
    from nbdebug.job.job import Job

    k, ranks = 6, 4
    dbgs, models, opts = {}, {}, {}
    for r in range(ranks):
        torch.manual_seed(0)
        models[r] = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
        opts[r] = torch.optim.SGD(models[r].parameters(), lr=1e-2)
        dbgs[r] = nbdebug.Debugger(models[r], level="L0")
    try:
        job = Job(dbgs)
        job.watch("ODD_RANK", "Module.*.forward.*", field="norm", z=6)
        gens = {r: torch.Generator().manual_seed(10 + r) for r in range(ranks)}
        for step in range(k + 2):
            for r in range(ranks):
                x = torch.randn(512, 5, generator=gens[r]) * (1e3 if r == 2 and step >= k else 1.0)
                models[r](x).pow(2).mean().backward()
                opts[r].step()
                opts[r].zero_grad()
        odd = {r: [h for h in dbgs[r].hits if h.condition == "ODD_RANK"] for r in range(ranks)}
        assert odd[2] and min(h.step for h in odd[2]) == k
        assert all(h.step >= k for hs in odd.values() for h in hs)
        assert all(not odd[r] for r in (0, 1, 3) if r != 2) or all(h.step > k for r in (0, 1, 3) for h in odd[r])
        assert "median" in odd[2][0].advice
    finally:
        for d in dbgs.values():
            d.close()
