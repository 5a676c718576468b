"""Step boundaries with several optimizers and ``dbg.step()`` (no ``@dbg.step_fn``): each ``optimizer.step()``
ends a step until the first ``dbg.step()``, so in a GAN loop calling ``dbg.step()`` at the end of each
iteration the first iteration was two steps. ``dbg.step()`` called once before the loop (nothing ran yet) turns
the automatic boundary off without ending an empty step: one step per iteration from the first one. Without it,
the first ``dbg.step()`` says that the steps before it were split by the optimizers."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nbdebug


class GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gen = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 6))
        self.disc = nn.Sequential(nn.Linear(6, 8), nn.LeakyReLU(0.2), nn.Linear(8, 1))


def gan_loop(model: GAN, dbg: nbdebug.Debugger, iters: int) -> None:
    g = torch.Generator().manual_seed(1)
    og = torch.optim.SGD(model.gen.parameters(), lr=1e-2)
    od = torch.optim.SGD(model.disc.parameters(), lr=1e-2)
    ones, zeros = torch.ones(4, 1), torch.zeros(4, 1)
    for _ in range(iters):
        z, real = torch.randn(4, 4, generator=g), torch.randn(4, 6, generator=g)
        od.zero_grad()
        fake = model.gen(z)
        ld = F.binary_cross_entropy_with_logits(model.disc(real), ones) + \
            F.binary_cross_entropy_with_logits(model.disc(fake.detach()), zeros)
        ld.backward()
        od.step()
        og.zero_grad()
        F.binary_cross_entropy_with_logits(model.disc(fake), ones).backward()
        og.step()
        dbg.step()


def optimizer_steps(dbg: nbdebug.Debugger, step: int) -> list[str]:
    return sorted({n for n, _slot in dbg.session.table(step).keys if n.startswith("Optimizer.")})


@pytest.mark.parametrize("level", ["L0", "monitor"])
def test_dbg_step_before_the_loop_makes_each_gan_iteration_one_step(level):
    torch.manual_seed(0)
    model = GAN()
    with nbdebug.Debugger(model, level=level) as dbg, warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to warn about
        dbg.step()  # before the loop: no step ended, the optimizers' boundaries off
        assert dbg.session.step_index == 0 and not dbg.session.steps
        gan_loop(model, dbg, 3)
        assert dbg.session.step_index == 3
        if level == "L0":  # every step holds both optimizers' steps
            assert all(optimizer_steps(dbg, k) == ["Optimizer.SGD.step.0", "Optimizer.SGD.step.1"]
                       for k in range(3))


def test_the_first_dbg_step_after_a_split_iteration_says_so():
    torch.manual_seed(0)
    model = GAN()
    with nbdebug.Debugger(model, level="L0") as dbg:
        with pytest.warns(UserWarning, match=r"steps 0\.\.1 were each ended by an optimizer\.step\(\)"):
            gan_loop(model, dbg, 1)
        assert dbg.session.step_index == 2  # the first iteration: the discriminator's step, the generator's
        assert optimizer_steps(dbg, 0) == ["Optimizer.SGD.step.0"]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # said once
            gan_loop(model, dbg, 2)
        assert dbg.session.step_index == 4 and optimizer_steps(dbg, 3) == ["Optimizer.SGD.step.0",
                                                                           "Optimizer.SGD.step.1"]


def test_one_optimizer_with_dbg_step_after_it_is_one_step_per_iteration_and_quiet():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nbdebug.Debugger(model, level="L0") as dbg, warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            opt.zero_grad()
            model(torch.randn(4, 3)).sum().backward()
            opt.step()
            dbg.step()
        assert dbg.session.step_index == 3
