"""The monitor series (``Session.monitor``): level="monitor" and the same series at L0/L1/mix.

Every value is checked against a reference computed here by hand on a plain (undebugged) run with the
same seed, and the monitored training is bitwise the plain one.
"""

from __future__ import annotations

import gc
import os
import resource

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.session.monitor import Monitor

LEVELS = ("monitor", "L0", "L1", "mix")


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(6, 4, generator=g) for _ in range(n)]


def _reference(steps: int) -> tuple[list[float], list[dict]]:
    """A plain AdamW run computing every series by hand."""
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    names = dict(model.named_parameters())
    losses, rows = [], []
    for x in _batches(steps):
        opt.zero_grad()
        h1 = model[0](x)
        h2 = model[1](h1)
        out = model[2](h2)
        for h in (h1, h2, out):
            h.retain_grad()
        loss = out.pow(2).mean()
        loss.backward()
        row = {}
        for i, (h, cls) in enumerate(((h1, "Linear"), (h2, "Tanh"), (out, "Linear"))):
            row[(f"Module.{i}.{cls}", "output_norm")] = h.detach().norm().item()
            row[(f"Module.{i}.{cls}", "output_max_abs")] = h.detach().abs().max().item()
            row[(f"Module.{i}.{cls}", "grad_input_norm")] = h.grad.norm().item()
        before = {q: p.detach().clone() for q, p in names.items()}
        total = 0.0
        for q, p in names.items():
            row[(f"Parameter.{q}", "weight_norm")] = p.detach().norm().item()
            row[(f"Parameter.{q}", "grad_norm")] = p.grad.norm().item()
            total += p.grad.norm().item() ** 2
        opt.step()
        for q, p in names.items():
            upd = (before[q] - p.detach()).norm().item()
            row[(f"Parameter.{q}", "update_norm")] = upd
            row[(f"Parameter.{q}", "update_ratio")] = upd / before[q].norm().item()
            row[(f"Parameter.{q}", "exp_avg_norm")] = opt.state[p]["exp_avg"].norm().item()
            row[(f"Parameter.{q}", "exp_avg_sq_norm")] = opt.state[p]["exp_avg_sq"].norm().item()
        row[("Run", "loss")] = loss.item()
        row[("Run", "grad_norm_total")] = total ** 0.5
        losses.append(loss.item())
        rows.append(row)
    return losses, rows


def _monitored(level: str, steps: int) -> tuple[list[float], nbdebug.Debugger, dict]:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    dbg = nbdebug.Debugger(model, level=level)
    losses = []
    for x in _batches(steps):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        dbg.record_loss(loss)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, dbg, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("level", LEVELS)
def test_series_equal_a_hand_computed_reference_and_training_is_bitwise(level):
    ref_losses, ref_rows = _reference(4)
    losses, dbg, _ = _monitored(level, 4)
    try:
        assert losses == ref_losses  # bitwise: the monitor changes nothing of the training
        m = dbg.session.monitor
        assert dbg.step_index == 4 and len(m) == 4
        for step, ref in enumerate(ref_rows):
            got = m.row(step)
            missing = set(ref) - set(got)
            assert not missing, f"{level} step {step}: no {sorted(missing)}"
            for key, want in ref.items():
                assert got[key] == pytest.approx(want, rel=2e-5, abs=1e-7), (level, step, key)
        if level == "monitor":  # nothing else is recorded
            assert len(dbg.graph) == 0
            assert all(len(t.keys) == 0 for t in dbg.session.steps.values())
            assert dbg.session.store.used == 0
    finally:
        dbg.close()


def test_monitor_level_refuses_tensor_watchpoints_and_dumps_but_controls_steps(tmp_path):
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with pytest.raises(ValueError, match="records no tensors"):
        nbdebug.Debugger(model, level="monitor", dump_dir=str(tmp_path))
    dbg = nbdebug.Debugger(model, level="monitor")
    try:
        with pytest.raises(ValueError, match="level='monitor' records none"):
            dbg.watch("MAX_GT", value=1.0)  # a tensor condition (TO reads the monitor series, see below)

        def train():
            for x in _batches(6):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()

        dbg.run(train, steps=2)
        assert dbg.wait(30).value == "paused"
        assert dbg.step_index == 2 and dbg.session.monitor.last_step == 1
        dbg.cont()
        assert dbg.wait(30).value == "finished"
        assert dbg.step_index == 6 and len(dbg.session.monitor) == 6
    finally:
        dbg.close()


def test_gpt2_adamw_series():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=16)
    model = GPT2LMHeadModel(cfg)
    plain = GPT2LMHeadModel(cfg)
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(3))

    def train(m, n):
        torch.manual_seed(5)  # dropout
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        out = []
        for _ in range(n):
            opt.zero_grad()
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            out.append(loss.item())
        return out

    ref = train(plain, 3)
    dbg = nbdebug.Debugger(model, level="monitor")
    try:
        assert train(model, 3) == ref
        m = dbg.session.monitor
        assert m.series("Run", "loss")[1].tolist() == pytest.approx(ref, rel=1e-6)  # the model's own loss
        assert len(m.series("Module.transformer.h.0.attn.c_attn.Conv1D", "output_norm")[1]) == 3
        assert len(m.series("Module.transformer.h.1.mlp.GPT2MLP", "grad_input_norm")[1]) == 3
        for f in ("weight_norm", "grad_norm", "update_norm", "update_ratio", "exp_avg_norm", "exp_avg_sq_norm"):
            assert len(m.series("Parameter.transformer.h.0.attn.c_attn.weight", f)[1]) == 3, f
        assert np.all(m.series("Run", "grad_norm_total")[1] > 0)
        assert "momentum_norm" not in m.fields("Parameter.transformer.wte.weight")
    finally:
        dbg.close()


def test_cnn_sgd_momentum_series():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU(inplace=True),
                                torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(2))
    dbg = nbdebug.Debugger(model, level="monitor")
    try:
        for step in range(3):
            opt.zero_grad()
            out = torch.nn.functional.cross_entropy(model(x), torch.tensor([0, 2]))
            dbg.record_loss(out)
            out.backward()
            opt.step()
            m = dbg.session.monitor
            buf = opt.state[model[4].weight]["momentum_buffer"]
            assert m.value(step, "Parameter.4.weight", "momentum_norm") == pytest.approx(buf.norm().item(), rel=1e-6)
            assert m.value(step, "Run", "loss") == pytest.approx(out.item(), rel=1e-6)
        # the in-place ReLU's output is measured when it returns
        assert len(m.series("Module.2.ReLU", "output_norm")[1]) == 3
        assert "exp_avg_norm" not in m.fields("Parameter.4.weight")
    finally:
        dbg.close()


def test_grad_scaler_loss_scale_and_unscaled_loss():
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=1)
    dbg = nbdebug.Debugger(model, level="monitor")
    dbg.track_loss_scale(scaler)
    try:
        scales, losses, grads = [], [], []
        for x in _batches(3):
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            scales.append(scaler.get_scale())
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            grads.append(sum(p.grad.norm().item() ** 2 for p in model.parameters()) ** 0.5)
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
        m = dbg.session.monitor
        assert m.series("Run", "loss_scale")[1].tolist() == scales == [1024.0, 2048.0, 4096.0]
        assert m.series("Run", "loss")[1].tolist() == pytest.approx(losses, rel=1e-6)  # unscaled
        assert m.series("Run", "grad_norm_total")[1].tolist() == pytest.approx(grads, rel=1e-5)  # unscaled
    finally:
        dbg.close()


def test_monitor_memory_bound_gpt2_small_100k_steps():
    """100,000 steps of a GPT-2-small's series (its modules × 3, parameters × 6 with AdamW, the run's 3)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    modules = sum(1 for path, _ in model.named_modules() if path)
    params = sum(1 for _ in model.named_parameters())
    keys = [(f"Module.{i}", f) for i in range(modules) for f in ("output_norm", "output_max_abs", "grad_input_norm")]
    keys += [(f"Parameter.{i}", f) for i in range(params) for f in
             ("weight_norm", "grad_norm", "update_norm", "update_ratio", "exp_avg_norm", "exp_avg_sq_norm")]
    keys += [("Run", f) for f in ("loss", "grad_norm_total", "loss_scale")]
    assert len(keys) > 1_300  # 1,380: 164 modules, 148 parameters
    m = Monitor()
    row = np.linspace(1.0, 2.0, len(keys))
    for step in range(100_000):
        m.record(step, keys, row)
    assert len(m) == 100_000
    assert m.nbytes <= 200 * 2**20, f"{m.nbytes / 2**20:.0f} MiB for {len(keys)} series"
    steps, vals = m.series("Run", "loss")
    assert steps[-1] == 99_999 and len(steps) == 10_000 + 9_000  # horizon + folded blocks


def _rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.slow
def test_soak_10000_steps_at_monitor_level_rss_bounded():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8)
    dbg = nbdebug.Debugger(model, level="monitor")
    try:
        def steps(n):
            for _ in range(n):
                opt.zero_grad(set_to_none=True)
                model(x).pow(2).mean().backward()
                opt.step()

        steps(500)
        gc.collect()
        start = _rss_mb()
        steps(9_500)
        gc.collect()
        grown = _rss_mb() - start
        m = dbg.session.monitor
        print(f"\nsoak: 10,000 monitor steps, RSS +{grown:.1f} MB after step 500; series {m.nbytes / 2**20:.1f} MiB")
        assert dbg.step_index == 10_000 and len(m) == 10_000
        # the series' ring is allocated up front; what grows is the steps' empty tables' history and the
        # folded blocks (none before the horizon): a few MB at most
        assert grown < 30, f"RSS grew {grown:.1f} MB over 9,500 monitor steps"
    finally:
        dbg.close()


def test_to_at_monitor_level_pauses_at_the_step_the_loss_goes_nan():
    """At level="monitor" no tensor is recorded, yet a NaN loss or gradient must stop the run: TO reads the
    monitor series (a NaN the model computed is a value in the Monitor, not an absent series)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="monitor")
    try:
        dbg.watch("TO")
        for step in range(4):
            x = torch.randn(8, 4)
            if step == 2:
                x[0, 0] = float("nan")  # one bad batch
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            dbg.record_loss(loss)
            loss.backward()
            opt.step()
        hits = [h for h in dbg.hits if h.is_hit]
        assert hits and min(h.step for h in hits) == 2
        nodes = {(h.node, h.slot) for h in hits if h.step == 2}
        assert ("Run", "loss") in nodes and ("Module.0.Linear", "output_norm") in nodes, nodes
        assert dbg.session.monitor.value(2, "Run", "loss") != dbg.session.monitor.value(2, "Run", "loss")  # NaN
        assert "NaN" in next(h for h in hits if h.node == "Run").advice
    finally:
        dbg.close()


def test_series_a_step_did_not_measure_are_absent_not_nan():
    """A series the step did not measure is absent (None), never a NaN that TO would take for the model's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    dbg = nbdebug.Debugger(model, level="L0")
    try:
        dbg.watch("TO")
        for step in range(3):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            if step != 1:
                dbg.record_loss(loss)  # step 1 gives the monitor no loss
            loss.backward()
            opt.step()
        m = dbg.session.monitor
        assert m.value(1, "Run", "loss") is None and m.value(2, "Run", "loss") is not None
        assert m.nonfinite(1) == {} and not [h for h in dbg.hits if h.is_hit]
        assert all(v == v for v in m.row(1).values())  # every value recorded is a measured (finite) one
    finally:
        dbg.close()


def test_native_update_kernel_matches_torch_and_leaves_the_new_weights():
    """``_fastats.update_norms``: |after - before|² (difference in the element type) and |after|², the
    buffer left holding ``after``; float32 and float64, lengths around the vector width."""
    from nbdebug.frameworks.core.native import fastats

    if fastats is None:
        pytest.skip("the native kernel is not built (make test builds it): nothing to compare")
    g = torch.Generator().manual_seed(3)
    for dtype, code in ((torch.float32, fastats.FLOAT32), (torch.float64, fastats.FLOAT64)):
        for n in (0, 1, 7, 8, 9, 17, 4099):
            before = torch.randn(n, generator=g, dtype=dtype)
            after = before + 1e-3 * torch.randn(n, generator=g, dtype=dtype)
            buf = before.clone()
            dd, ww = fastats.update_norms(buf.data_ptr(), after.data_ptr(), n, code)
            assert torch.equal(buf, after)
            assert dd == pytest.approx((after - before).double().pow(2).sum().item(), rel=1e-12, abs=1e-300)
            assert ww == pytest.approx(after.double().pow(2).sum().item(), rel=1e-12, abs=1e-300)
    with pytest.raises(ValueError, match="FLOAT32 or FLOAT64"):
        fastats.update_norms(buf.data_ptr(), after.data_ptr(), 1, fastats.FLOAT16)


def test_weights_changed_between_steps_are_measured_again():
    """The update pass leaves the new weights in its buffer and skips the next copy while a weight is
    untouched; a weight changed between steps (in place, or its storage replaced) is copied and measured
    again: the series still equal a hand computation on a plain run with the same changes."""

    def train(dbg_level):
        model = _mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        dbg = nbdebug.Debugger(model, level=dbg_level) if dbg_level else None
        w, ref = model[0].weight, []
        for step, x in enumerate(_batches(4)):
            with torch.no_grad():
                if step == 1:
                    w.mul_(0.5)  # in place: a new version
                if step == 2:
                    w.data = w.data * 2.0  # a new storage
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            before = w.detach().clone()
            opt.step()
            ref.append((before.norm().item(), (w.detach() - before).norm().item()))
        return dbg, ref

    _, ref = train(None)
    dbg, _ = train("monitor")
    try:
        m = dbg.session.monitor
        assert len(m) >= 3
        for step in range(len(m)):
            got = m.row(step)
            assert got[("Parameter.0.weight", "weight_norm")] == pytest.approx(ref[step][0], rel=1e-6), step
            assert got[("Parameter.0.weight", "update_norm")] == pytest.approx(ref[step][1], rel=1e-5), step
    finally:
        dbg.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norms_of_tiny_tensors_are_not_lost_to_underflow(dtype):
    """Gradients ~1e-13 make AdamW's ``exp_avg_sq`` ~1e-29: its squares underflow in float32 (and bfloat16's
    own range), so a norm summed in float32 read 0 (or was off by percents) where the tensor is not zero.
    Every parameter series equals the norm of the very tensor, taken in float64."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dbg = nbdebug.Debugger(model, level="monitor")
    x = torch.randn(4, 5, dtype=dtype)
    for _ in range(2):
        opt.zero_grad()
        (model(x).float().sum() * 1e-13).backward()
        grads = {q: p.grad.detach().double().norm().item() for q, p in model.named_parameters()}
        opt.step()
    mon = dbg.session.monitor
    step = mon.last_step
    for q, p in model.named_parameters():
        st = opt.state[p]
        for field, want in (("grad_norm", grads[q]), ("exp_avg_norm", st["exp_avg"].double().norm().item()),
                            ("exp_avg_sq_norm", st["exp_avg_sq"].double().norm().item())):
            assert want > 0, (q, field)
            assert mon.value(step, f"Parameter.{q}", field) == pytest.approx(want, rel=1e-6, abs=0), (q, field)
    dbg.close()
