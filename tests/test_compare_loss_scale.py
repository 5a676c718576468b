"""Loss-scale history (seed 003): per-step scale and overflow from a real torch GradScaler, persistent
overflow detection, and MindSpore-style manual recording."""

import numpy as np
import pytest
import torch

from nbdebug.frameworks.torch.loss_scale import GradScalerProbe
from nbdebug.watch.loss_scale import LossScaleTracker


def _train(scaler, steps, bad_steps):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    before = model.weight.detach().clone()
    for i in range(steps):
        opt.zero_grad()
        x = torch.randn(2, 4)
        if i in bad_steps:
            x[0, 0] = float("inf")  # the scaled gradients overflow: GradScaler skips the step
        scaler.scale(model(x).pow(2).mean()).backward()
        scaler.step(opt)
        scaler.update()
    return model, before


def test_gradscaler_probe_records_scale_and_overflow_once_per_step():
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=100)
    probe = GradScalerProbe(scaler)
    hits = []
    probe.tracker.watch(3, hits.append)
    _train(scaler, 8, bad_steps={2, 4, 5, 6})
    hist = probe.tracker.history()
    assert [r.step for r in hist] == list(range(8))
    assert [r.overflow for r in hist] == [False, False, True, False, True, True, True, False]
    # the scale each step ran with: halved after every overflowing step
    assert [r.scale for r in hist] == [1024.0, 1024.0, 1024.0, 512.0, 512.0, 256.0, 128.0, 64.0]
    assert probe.tracker.persisting(3) == [(4, 6)] and probe.tracker.persisting(1) == [(2, 2), (4, 6)]
    (hit,) = hits
    assert (hit.first_step, hit.step, hit.k) == (4, 6, 3) and "persisted for 3" in hit.describe()
    probe.close()
    assert "update" not in scaler.__dict__
    _train(scaler, 1, bad_steps=set())
    assert len(probe.tracker) == 8  # closed: nothing more recorded


def test_probe_step_source_and_rejects_double_wrap():
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    counter = iter(range(100, 200))
    seen = []
    probe = GradScalerProbe(scaler, step=lambda: next(counter), on_update=seen.append)
    with pytest.raises(RuntimeError, match="already wrapped"):
        GradScalerProbe(scaler)
    _train(scaler, 2, bad_steps=set())
    assert [r.step for r in probe.tracker.history()] == [100, 101] and seen == probe.tracker.history()
    with pytest.raises(TypeError, match="GradScaler"):
        GradScalerProbe(object())
    probe.close()


def test_manual_recording_like_mindspore_loss_scale_cells():
    # TrainOneStepWithLossScaleCell returns (loss, overflow, scaling_sens): record them as they come
    t = LossScaleTracker()
    for overflow, scale in [(np.bool_(False), np.float32(1.0)), (np.array(True), np.array(1.0)),
                            (True, 0.5), (False, 0.25)]:
        t.record(scale, overflow)
    assert [(r.step, r.scale, r.overflow) for r in t.history()] == [
        (0, 1.0, False), (1, 1.0, True), (2, 0.5, True), (3, 0.25, False)]
    assert t.persisting(2) == [(1, 2)] and t.overflow_run == 0
    t.record(1.0, True, step=10)
    t.record(1.0, True, step=12)  # not consecutive steps: two runs of one
    assert t.persisting(2) == [(1, 2)]
    with pytest.raises(ValueError, match="k must be"):
        t.persisting(0)
    assert "overflow" in t._repr_html_()


def test_mindspore_dynamic_loss_scaler_feeds_the_tracker():
    # MindSpore 2.10's TrainOneStepWithLossScaleCell needs an Ascend-only status op; on CPU the functional
    # mindspore.amp.DynamicLossScaler gives the same (scale, overflow) per step
    import mindspore as ms
    from mindspore import nn
    from mindspore.amp import DynamicLossScaler, all_finite

    net = nn.Dense(4, 1)
    loss_fn, opt = nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01)
    scaler = DynamicLossScaler(scale_value=1024.0, scale_factor=2, scale_window=1000)
    grad_fn = ms.value_and_grad(lambda x, y: scaler.scale(loss_fn(net(x), y)), None, opt.parameters)
    tracker = LossScaleTracker()
    for i in range(6):
        x = np.ones((2, 4), np.float32)
        if i in (2, 3, 4):
            x[0, 0] = np.inf
        scale = scaler.scale_value.value().copy()  # the scale this step runs with (a MindSpore tensor)
        _loss, grads = grad_fn(ms.Tensor(x), ms.Tensor(np.zeros((2, 1), np.float32)))
        grads = scaler.unscale(grads)
        finite = all_finite(grads)
        scaler.adjust(finite)
        if finite:
            opt(grads)
        tracker.record(scale, ~finite)
    assert [(r.scale, r.overflow) for r in tracker.history()] == [
        (1024.0, False), (1024.0, False), (1024.0, True), (512.0, True), (256.0, True), (128.0, False)]
    assert tracker.persisting(3) == [(2, 4)]
