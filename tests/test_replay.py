"""Replaying a step with every tensor (nbdebug/replay/): bitwise equal to the live step, live run unchanged."""

from __future__ import annotations

import random
import threading
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import transformers  # noqa: E402 - the numpy-2 run leaves this module out (tests/torch_only.py)

import nbdebug
from nbdebug.replay import ReplayMismatch, ReplayMismatchError, ReplayRefused
from nbdebug.session.store import NotRetainedError


def _gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    return transformers.GPT2LMHeadModel(cfg).train()


def _bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                  vocab_size=100, max_position_embeddings=16)
    return transformers.BertForMaskedLM(cfg).train()


def _level(name: str) -> str:
    assert name in nbdebug.Debugger.__init__.__globals__["backend_for_model"](torch.nn.Linear(1, 1)).levels, name
    return name


def _snapshot(model, opt):
    """Every bit of live state a replay must leave alone."""
    params = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    grads = {k: (p.grad.clone() if p.grad is not None else None) for k, p in model.named_parameters()}
    ostate = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in opt.state[p].items()}
              for g in opt.param_groups for p in g["params"]]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    return params, grads, ostate, groups, rng, [m.training for m in model.modules()]


def _same(a, b) -> None:
    pa, ga, oa, gra, ra, ta = a
    pb, gb, ob, grb, rb, tb = b
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)
    assert all((ga[k] is None and gb[k] is None) or torch.equal(ga[k], gb[k]) for k in ga)
    for sa, sb in zip(oa, ob, strict=False):
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) if torch.is_tensor(sa[k]) else sa[k] == sb[k] for k in sa)
    assert gra == grb and ta == tb
    assert ra[0] == rb[0] and np.array_equal(ra[1], rb[1]) and torch.equal(ra[2], rb[2])


@pytest.mark.parametrize("level", ["L0", "monitor"])
@pytest.mark.parametrize("make", [_gpt2, _bert], ids=["gpt2", "bert"])
def test_replay_is_bitwise_and_leaves_the_live_run_alone(make, level):
    level = _level(level) if level != "L0" else level

    def train(replay_at: int | None):
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = iter([torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(i)) for i in range(5)])
        dbg = nbdebug.Debugger(model, level=level)

        @dbg.step_fn
        def train_step(ids, labels):
            opt.zero_grad()
            out = model(input_ids=ids, labels=labels)
            out.loss.backward()
            opt.step()
            return out.loss

        replayed = None
        for i, ids in enumerate(data):
            train_step(ids, ids.clone())
            if i == replay_at:
                before = _snapshot(model, opt)
                with warnings.catch_warnings():
                    warnings.simplefilter("error", ReplayMismatch)
                    replayed = dbg.replay(i, level="mix")
                    if level == "monitor":  # at its own level every monitor series is computed alike
                        again = dbg.replay(i, level="monitor")
                        assert again.bitwise and again.compared == len(dbg.session.monitor.row(i)) > 100
                _same(before, _snapshot(model, opt))
        tables = [dbg.session.monitor.row(s) if level == "monitor" else dbg.session.table(s) for s in range(5)]
        params = {k: v.detach().clone() for k, v in model.state_dict().items()}
        dbg.close()
        return replayed, tables, params

    replayed, tables, params = train(replay_at=2)
    assert replayed.bitwise and replayed.mismatches == []
    assert replayed.compared > (40 if level == "monitor" else 100)  # what the live step recorded
    assert torch.equal(replayed.loss, replayed.live_loss)
    # at mix every op is there with its tensors: the first op's output is readable
    ops = [n for n in replayed.graph.nodes if n.startswith(("Functional.", "Torch.", "Tensor."))]
    assert ops and replayed.tensor(ops[0], "output.0").size > 0
    # the run goes on as if never replayed: same live statistics of later steps, same weights
    _, tables0, params0 = train(replay_at=None)
    assert all(torch.equal(params[k], params0[k]) for k in params)
    for a, b in zip(tables, tables0, strict=False):
        if level == "monitor":  # the same bits (a NaN series value equals itself)
            assert a.keys() == b.keys()
            assert all(np.float32(a[k]).view(np.int32) == np.float32(b[k]).view(np.int32) for k in a)
        else:
            assert a.keys == b.keys and np.array_equal(a.values.view(np.int64), b.values.view(np.int64))


class _CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = F.relu(self.bn(self.conv(x)))
        return self.fc(h.mean(dim=(2, 3)))


@pytest.mark.parametrize("level", ["L0", "monitor"])
def test_cnn_batchnorm_bf16_autocast_gradscaler(level):
    level = _level(level) if level != "L0" else level
    torch.manual_seed(1)
    model = _CNN().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    dbg = nbdebug.Debugger(model, level=level)
    dbg.track_loss_scale(scaler)

    @dbg.step_fn
    def train_step(x, y):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        sched.step()
        return loss

    for _ in range(3):
        train_step(torch.randn(4, 3, 8, 8), torch.randint(0, 4, (4,)))
    before = _snapshot(model, opt)
    scale, tracker, history = scaler._scale.clone(), scaler._growth_tracker.clone(), dbg.loss_scale_history()
    lr = sched.get_last_lr()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplayMismatch)
        r = dbg.replay()
    assert r.step == 2 and r.bitwise and r.compared > 10
    assert torch.equal(r.loss, r.live_loss)
    assert any(d == "bfloat16" for d in r.session.steps[2].dtypes)  # autocast ran in bf16
    _same(before, _snapshot(model, opt))
    assert torch.equal(scale, scaler._scale) and torch.equal(tracker, scaler._growth_tracker)
    assert dbg.loss_scale_history() == history and sched.get_last_lr() == lr
    assert "update" in vars(scaler)  # the loss-scale probe is back on the scaler
    assert "Module.bn.BatchNorm2d.forward.0" in r.graph.nodes
    dbg.close()


class _Div(torch.nn.Module):
    """Divides by the batch's row sums: a row summing to zero makes Inf, then NaN."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc1(x) / x.sum(dim=1, keepdim=True)
        return self.fc2(h)


def _nan_run(use_run: bool):
    torch.manual_seed(0)
    model = _Div()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = nbdebug.Debugger(model, level="L0", on_hit="replay")
    dbg.watch("TO")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    batches = [torch.rand(3, 4) + 0.5 for _ in range(6)]
    batches[3][1] = torch.tensor([1.0, -1.0, 2.0, -2.0])  # the bad batch: row sum 0

    def loop():
        for b in batches:
            train_step(b)

    if use_run:
        dbg.run(loop)
    else:
        loop()
    return dbg, batches


def test_nan_hit_at_L0_is_replayed_at_op_level():
    dbg, batches = _nan_run(use_run=False)
    r = dbg.replayed
    assert r is not None and r.step == 3 and r.bitwise
    assert r.live_hits and r.live_hits[0].step == 3
    node, slot, step = r.first_nonfinite()
    assert (node, slot, step) == ("Tensor.__truediv__.0.forward", "output.0", 3)
    assert not node.startswith("Module")  # the producing op, not its module
    a, b = r.tensor(node, "input.0"), r.tensor(node, "input.1")
    assert np.isfinite(a).all() and b.ravel()[1] == 0.0  # the zero row sum of the bad batch
    assert np.array_equal(b.ravel(), batches[3].sum(dim=1).numpy())
    assert r.node == dbg.hits[0].node  # the panel opens on the hit's node
    dbg.close()


def test_nan_hit_under_run_pauses_after_the_replay():
    dbg, _ = _nan_run(use_run=True)
    try:
        assert str(dbg.wait(60)) == "paused"
        assert dbg.replayed is not None and dbg.replayed.step == 3
        assert "replayed at mix" in dbg.pause_reason and "Tensor.__truediv__.0.forward" in dbg.pause_reason
        assert dbg.step_index == 4  # paused at the boundary after the bad step
        r = dbg.replay(3, level="L1")  # again from the notebook thread while paused: same bits
        assert r.bitwise
        dbg.cont()
        assert str(dbg.wait(60)) in ("finished", "paused")
    finally:
        dbg.close()


def test_unreplayable_steps_say_why():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, replay_window=2, replay_budget=1 << 20)
    with pytest.raises(ReplayRefused, match="step_fn"):
        dbg.replay()

    @dbg.step_fn
    def train_step(x, log):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        log.calls += 1

    class Log:
        calls = 0

    for _ in range(3):
        train_step(torch.ones(1, 2), Log())
    assert dbg.replay_steps == [1, 2]
    with pytest.raises(NotRetainedError, match=r"only the last 2 steps run through a step function can be "
                                               r"replayed \(kept: 1, 2\)"):
        dbg.replay(0)
    with pytest.raises(ReplayRefused, match=r"args\[1\] is a Log, a mutable value"):
        dbg.replay(2)
    dbg.close()
    with pytest.raises(ValueError, match="on_hit"):
        nbdebug.Debugger(torch.nn.Linear(2, 1), on_hit="stop")


def test_over_the_budget_is_not_kept():
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, replay_budget=1000)
    step = dbg.step_fn(lambda x: (opt.zero_grad(), model(x).sum().backward(), opt.step()))
    with pytest.warns(RuntimeWarning, match="over replay_budget"):
        step(torch.ones(1, 64))
    with pytest.raises(NotRetainedError, match="over replay_budget"):
        dbg.replay(0)
    dbg.close()


def test_a_replay_that_differs_says_where_and_why():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = [0]  # Python state the step changes: not in the kept state
    dbg = nbdebug.Debugger(model, level="L0")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        calls[0] += 1
        noisy = x + calls[0]
        loss = model(noisy).sum()
        loss.backward()
        opt.step()
        return loss

    train_step(torch.ones(2, 4))
    with pytest.warns(ReplayMismatch, match="not bitwise identical"):
        r = dbg.replay(0)
    assert not r.bitwise and r.mismatches
    first = r.mismatches[0]
    assert first.node == "loss" or first.node.startswith(("Module.0", "Input"))
    assert "input differs" in r.reason or "counter" in r.reason, r.reason
    with pytest.raises(ReplayMismatchError):
        dbg.replay(0, strict=True)
    dbg.close()


def test_replay_refused_while_training_runs():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model)
    go = threading.Event()
    step = dbg.step_fn(lambda x: (opt.zero_grad(), model(x).sum().backward(), opt.step()))

    def loop():
        step(torch.ones(1, 2))
        go.wait(20)

    dbg.run(loop)
    try:
        for _ in range(200):
            if dbg.replay_steps:
                break
            threading.Event().wait(0.05)
        with pytest.raises(ReplayRefused, match="training is running"):
            dbg.replay(0)
    finally:
        go.set()
        dbg.wait(20)
        dbg.close()
