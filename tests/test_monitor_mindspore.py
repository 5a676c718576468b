"""level="monitor" in MindSpore PyNative: every series against a reference computed here by hand (numpy, from a
plain run with the same weights and batches), training unchanged; GRAPH mode refuses the level and says what to
use instead."""

from __future__ import annotations

import numpy as np
import pytest
from ms_fixtures import ms, nn, pynative_mode  # noqa: F401 - the fixture

import nbdebug

pytestmark = [pytest.mark.usefixtures("pynative_mode"), pytest.mark.timeout(300)]


def _net() -> nn.Cell:
    ms.set_seed(0)
    return nn.SequentialCell(nn.Dense(4, 8), nn.Tanh(), nn.Dense(8, 2))


def _batches(n: int) -> list[ms.Tensor]:
    rng = np.random.default_rng(1)
    return [ms.Tensor(rng.standard_normal((6, 4)).astype(np.float32)) for _ in range(n)]


def _np(t) -> np.ndarray:
    return t.asnumpy().astype(np.float64)


def _norm(a) -> float:
    return float(np.sqrt(np.sum(np.asarray(a, dtype=np.float64) ** 2)))


def _weights(net) -> dict[str, np.ndarray]:
    return {p.name: p.asnumpy().copy() for p in net.trainable_params()}


def _train(net, opt_cls, steps, on_loss=None, dbg=None, **opt_kw):
    """A value_and_grad loop; returns losses and, per step, (weights before, grads, weights after, optimizer)."""
    opt = opt_cls(net.trainable_params(), **opt_kw)
    grad_fn = ms.value_and_grad(lambda x: (net(x) ** 2).mean(), None, opt.parameters)
    losses, steps_seen = [], []
    for x in _batches(steps):
        before = _weights(net)
        loss, grads = grad_fn(x)
        if dbg is not None:
            dbg.record_loss(loss)
        opt(grads)
        losses.append(float(loss.asnumpy()))
        steps_seen.append((x, before, [g.asnumpy().copy() for g in grads], _weights(net), opt))
        if on_loss is not None:
            on_loss(len(losses) - 1, opt)
    return losses, steps_seen


def _reference_row(x, before, grads, after, names, moments) -> dict:
    """Every series of one step, by hand: the forward and its backward in numpy."""
    w0, b0, w2, b2 = (before[n].astype(np.float64) for n in ("0.weight", "0.bias", "2.weight", "2.bias"))
    h1 = _np(x) @ w0.T + b0
    h2 = np.tanh(h1)
    out = h2 @ w2.T + b2
    g_out = 2 * out / out.size
    g_h2 = g_out @ w2
    g_h1 = g_h2 * (1 - h2 ** 2)
    row = {("Run", "loss"): float(np.mean(out ** 2))}
    for i, (h, g, cls) in enumerate(((h1, g_h1, "Dense"), (h2, g_h2, "Tanh"), (out, g_out, "Dense"))):
        row[(f"Cell.{i}.{cls}", "output_norm")] = _norm(h)
        row[(f"Cell.{i}.{cls}", "output_max_abs")] = float(np.abs(h).max())
        row[(f"Cell.{i}.{cls}", "grad_input_norm")] = _norm(g)
    for n, g in zip(names, grads, strict=True):
        upd = _norm(before[n].astype(np.float64) - after[n])
        row[(f"Parameter.{n}", "weight_norm")] = _norm(before[n])
        row[(f"Parameter.{n}", "grad_norm")] = _norm(g)
        row[(f"Parameter.{n}", "update_norm")] = upd
        row[(f"Parameter.{n}", "update_ratio")] = upd / _norm(before[n])
    for field, values in moments.items():
        for n, v in zip(names, values, strict=True):
            row[(f"Parameter.{n}", field)] = _norm(v)
    row[("Run", "grad_norm_total")] = float(np.sqrt(sum(_norm(g) ** 2 for g in grads)))
    return row


@pytest.mark.parametrize("opt_cls, kw, fields", [
    (nn.Adam, {"learning_rate": 0.05}, {"exp_avg_norm": "moment1", "exp_avg_sq_norm": "moment2"}),
    (nn.Momentum, {"learning_rate": 0.1, "momentum": 0.9}, {"momentum_norm": "moments"}),
])
def test_series_equal_a_hand_computed_reference(opt_cls, kw, fields):
    steps = 3
    moments_ref: list[dict] = []

    def keep_moments(step, opt):
        moments_ref.append({f: [p.asnumpy().copy() for p in getattr(opt, attr)] for f, attr in fields.items()})

    ref_losses, ref_steps = _train(_net(), opt_cls, steps, keep_moments, **kw)
    net = _net()
    dbg = nbdebug.Debugger(net, level="monitor")
    try:
        losses, _ = _train(net, opt_cls, steps, dbg=dbg, **kw)
        assert losses == ref_losses  # bitwise: the monitor changes nothing of the training
        m = dbg.session.monitor
        assert dbg.step_index == steps and len(m) == steps
        assert len(dbg.graph) == 0 and all(len(t.keys) == 0 for t in dbg.session.steps.values())
        names = [p.name for p in net.trainable_params()]
        for step, (x, before, grads, after, _opt) in enumerate(ref_steps):
            ref = _reference_row(x, before, grads, after, names, moments_ref[step])
            got = m.row(step)
            missing = set(ref) - set(got)
            assert not missing, f"step {step}: no {sorted(missing)}"
            for key, want in ref.items():
                assert got[key] == pytest.approx(want, rel=2e-5, abs=1e-7), (step, key)
    finally:
        dbg.close()


def test_the_model_own_loss_and_to_on_a_nan_batch():
    """A network returning its loss (``nn.WithLossCell``) gives ``Run.loss`` without record_loss; a NaN batch
    makes the monitor series non-finite at that step and TO fires there, not before."""
    net = nn.WithLossCell(_net(), nn.MSELoss())
    opt = nn.SGD(net.trainable_params(), 0.01)
    grad_fn = ms.value_and_grad(net, None, opt.parameters)
    dbg = nbdebug.Debugger(net, level="monitor")
    try:
        dbg.watch("TO")
        losses = []
        for step, x in enumerate(_batches(4)):
            if step == 2:
                x = ms.Tensor(np.where(np.arange(24).reshape(6, 4) == 0, np.nan, x.asnumpy()).astype(np.float32))
            loss, grads = grad_fn(x, ms.Tensor(np.zeros((6, 2), np.float32)))
            opt(grads)
            losses.append(float(loss.asnumpy()))
        m = dbg.session.monitor
        assert m.series("Run", "loss")[1][:2].tolist() == pytest.approx(losses[:2], rel=1e-6)
        assert "output_norm" in m.fields("Cell._backbone.0.Dense")
        hits = [h for h in dbg.hits if h.is_hit]
        assert hits and min(h.step for h in hits) == 2
        assert ("Run", "loss") in {(h.node, h.slot) for h in hits if h.step == 2}
    finally:
        dbg.close()


def test_graph_mode_refuses_monitor_and_names_graph_every():
    ms.set_context(mode=ms.GRAPH_MODE)
    with pytest.raises(ValueError, match="graph_every") as err:
        nbdebug.Debugger(_net(), level="monitor")
    assert "PYNATIVE_MODE" in str(err.value)
