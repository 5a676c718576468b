"""level="monitor" + ``TO`` + ``on_hit="replay"``: a NaN from one bad batch, seen only in the monitor series,
is replayed at op level and the replay names the op that made it.

The run records no tensors (monitor level); TO fires on the non-finite monitor series of the bad step; the
step function (``@dbg.step_fn``) kept that step's pre-step state, so the replay at ``mix`` computes it again
bitwise with every tensor and :meth:`first_nonfinite` points at the producing op.
"""

from __future__ import annotations

import numpy as np
import torch

import nbdebug


class _Div(torch.nn.Module):
    """``fc1(x) / x.sum(1)``: a batch row summing to 0 makes the division the NaN/Inf's origin."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 1)

    def forward(self, x):
        h = self.fc1(x) / x.sum(dim=1, keepdim=True)
        return self.fc2(h)


def _run(use_run: bool, bad: int = 3):
    torch.manual_seed(0)
    model = _Div()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = nbdebug.Debugger(model, level="monitor", on_hit="replay")
    dbg.watch("TO")

    @dbg.step_fn
    def train_step(x):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        dbg.record_loss(loss)
        loss.backward()
        opt.step()
        return loss

    g = torch.Generator().manual_seed(1)
    batches = [torch.rand(3, 4, generator=g) + 0.5 for _ in range(6)]
    batches[bad][1] = torch.tensor([1.0, -1.0, 2.0, -2.0])  # the bad batch: a row summing to 0

    def loop():
        for b in batches:
            train_step(b)

    if use_run:
        dbg.run(loop)
    else:
        loop()
    return dbg, batches


def test_monitor_nan_is_replayed_at_mix_and_names_the_producing_op():
    dbg, batches = _run(use_run=False)
    try:
        m = dbg.session.monitor
        assert np.isfinite(m.value(2, "Run", "loss")) and not np.isfinite(m.value(3, "Run", "loss"))
        hits = [h for h in dbg.hits if h.is_hit]
        assert hits and min(h.step for h in hits) == 3  # nothing on the clean steps
        assert len(dbg.graph) == 0  # the live run recorded no ops: the replay's graph is its own
        r = dbg.replayed
        assert r is not None, "the TO hit at monitor level was not replayed"
        assert r.step == 3 and r.bitwise and r.level == "mix"
        node, slot, step = r.first_nonfinite()
        assert (node, slot, step) == ("Tensor.__truediv__.0.forward", "output.0", 3)
        b = r.tensor(node, "input.1")  # the zero row sum of the bad batch
        assert np.array_equal(b.ravel(), batches[3].sum(dim=1).numpy()) and b.ravel()[1] == 0.0
        assert all(len(t.keys) == 0 for t in dbg.session.steps.values())  # the live capture stayed at monitor
    finally:
        dbg.close()


def test_monitor_nan_under_run_pauses_after_the_replay():
    dbg, _ = _run(use_run=True)
    try:
        assert str(dbg.wait(60)) == "paused"
        assert dbg.replayed is not None and dbg.replayed.step == 3
        assert "replayed at mix" in dbg.pause_reason and "Tensor.__truediv__.0.forward" in dbg.pause_reason
        assert dbg.step_index == 4  # paused at the boundary after the bad step
        dbg.cont()
        assert str(dbg.wait(60)) in ("finished", "paused")
        assert dbg.session.monitor.last_step >= 4  # the monitor went on recording after the replay
    finally:
        dbg.close()
