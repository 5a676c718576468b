"""Held-out trials of daily notebook workflows (round 4): interrupting training, re-running cells, two
debuggers, a long run's timeline — in the kernel and, where the panel is involved, in real JupyterLab /
Notebook 7 through Chromium (tests/browser.py).

Defects they showed, each tested here:

- the kernel's Interrupt (``KeyboardInterrupt``) in a training loop's *backward pass or optimizer step*: the
  step was left open (autograd skips its final callbacks, the optimizer its post-hook), so the next cell's
  first iteration was recorded into it — the step showed the module called twice (``forward.0`` and
  ``forward.1``) with the interrupted iteration's and the next one's tensors mixed. An interrupted forward
  already closed its step on its own; now an interrupted backward or optimizer step does too (the next
  outermost module call finds the backward pass unfinished, or the optimizer's step no longer on the stack).
  A forward run inside them (a checkpoint's recomputation, LBFGS's closure) still belongs to the step.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as cp

import nbdebug


class _Interrupt(torch.autograd.Function):
    """Raises ``KeyboardInterrupt`` in its backward when ``on`` (what Ctrl-C / the kernel's Interrupt raises
    between two bytecodes of a backward hook)."""

    on = False

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        if _Interrupt.on:
            raise KeyboardInterrupt
        return g


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 1)

    def forward(self, x):
        return self.b(_Interrupt.apply(self.a(x).relu()))


@pytest.mark.parametrize("where", ["backward", "optimizer"])
@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_an_interrupted_backward_or_optimizer_step_stands_alone(level: str, where: str) -> None:
    torch.manual_seed(0)
    model = _Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    interrupt_opt = [False]

    def pre(_opt, _args, _kwargs):  # runs inside optimizer.step(), after nbdebug's own pre-hook
        if interrupt_opt[0]:
            raise KeyboardInterrupt

    opt.register_step_pre_hook(pre)

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(3, 4)).pow(2).mean().backward()
            opt.step()

    with nbdebug.Debugger(model, level=level) as dbg:
        train(2)
        _Interrupt.on, interrupt_opt[0] = where == "backward", where == "optimizer"
        try:
            with pytest.raises(KeyboardInterrupt):
                train(1)  # the cell interrupted
        finally:
            _Interrupt.on = interrupt_opt[0] = False
        assert dbg.step_index == 2
        train(3)  # the next cell continues training
        assert dbg.step_index == 6, "the interrupted step is one step, the three after it three more"
        whole = set(dbg.session.steps[1].keys)
        for step in (3, 4, 5):
            keys = dbg.session.steps[step].keys
            assert set(keys) == whole and len(keys) == len(whole), (step, sorted(set(keys) ^ whole)[:4])
        partial = set(dbg.session.steps[2].keys)
        assert partial < whole, sorted(partial - whole)[:4]  # nothing of the next iteration in it


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_checkpoints_recomputation_and_an_lbfgs_closure_stay_in_their_step(reentrant: bool) -> None:
    """The forward a checkpoint recomputes inside the backward pass, and the forward LBFGS's closure runs
    inside ``optimizer.step()``, are no interrupted step: one step per iteration, all alike."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=2)

    def closure():
        opt.zero_grad()
        h = cp.checkpoint(model[:2], torch.randn(3, 4, requires_grad=reentrant), use_reentrant=reentrant)
        loss = model[2](h).pow(2).mean()
        loss.backward()
        return loss

    with nbdebug.Debugger(model, level="L0") as dbg:
        for _ in range(3):
            opt.step(closure)
        assert dbg.step_index == 3
        sizes = collections.Counter(len(dbg.session.steps[i].keys) for i in range(3))
        assert len(sizes) == 1, sizes


def _plain_training():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(n: int) -> None:
        for _ in range(n):
            opt.zero_grad()
            model(torch.randn(2, 4)).pow(2).mean().backward()
            opt.step()

    return model, train


def test_the_control_line_counts_the_steps_of_a_training_cell_run_again() -> None:
    """The training cell (a plain loop, outside ``dbg.run``) run again after the panel is shown: the control
    line said "3 steps recorded" for ever (its redraw was keyed on the state only), beside a header at step 5."""
    model, train = _plain_training()
    with nbdebug.Debugger(model) as dbg:
        train(3)
        panel = dbg.panel()
        panel.flush()
        assert "3 steps recorded" in panel.controls.status.value, panel.controls.status.value
        train(2)
        panel.flush()
        assert "5 steps recorded" in panel.controls.status.value, panel.controls.status.value
        assert "4" in panel.header.step.value, panel.header.step.value
        panel.close()


def test_an_interrupted_training_cell_reads_interrupted_not_failed() -> None:
    """The kernel's Interrupt in a plain training loop: the panel's header said "failed in step N at …:
    KeyboardInterrupt" — the user stopped it; it reads "interrupted in step N at …" now, and training the
    next cell clears it."""
    from nbdebug.ui.panel import after_cell

    model, train = _plain_training()
    with nbdebug.Debugger(model) as dbg:
        train(2)
        panel = dbg.panel()
        panel.flush()
        stop = model[2].register_forward_hook(lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
        try:
            train(1)
        except KeyboardInterrupt as e:
            after_cell(type("Result", (), {"error_in_exec": e})())  # IPython's post_run_cell
        finally:
            stop.remove()
        panel.flush()
        text = panel.header.failure.value
        assert "interrupted in step 2 at Module.2.Linear.forward.0 (KeyboardInterrupt)" in text, text
        assert "failed" not in text, text
        train(1)
        panel.flush()
        assert "interrupted" not in panel.header.failure.value, panel.header.failure.value
        panel.close()
