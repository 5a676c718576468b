"""``first_nonfinite`` names where a *propagating* NaN/Inf starts: intended ±Inf that its consumers absorb
(T5's ``log(0)`` in its relative-position buckets, an attention mask before a softmax) is benign; the user
may also name intended ±Inf (``ignore=`` / ``Debugger(benign_nonfinite=...)``)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import nbdebug


def _poison(layer: torch.nn.Linear) -> None:
    """Make ``layer`` return NaN from an op inside its own call (its scope)."""
    def forward(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.weight, layer.bias) * float("nan")

    layer.forward = forward


class MaskedAttention(torch.nn.Module):
    """Single-head attention with a boolean mask turned into -inf scores (masked_fill) or an additive one."""

    def __init__(self, additive: bool) -> None:
        super().__init__()
        self.additive = additive
        self.q, self.k, self.v, self.out = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / math.sqrt(8)
        if self.additive:
            scores = scores + torch.zeros_like(scores).masked_fill(~keep, float("-inf"))
        else:
            scores = scores.masked_fill(~keep, float("-inf"))
        return self.out(torch.softmax(scores, dim=-1) @ self.v(x))


def _attention_run(model: torch.nn.Module, dbg: nbdebug.Debugger, steps: int = 1) -> None:
    torch.manual_seed(1)
    x = torch.randn(2, 5, 8)
    keep = torch.tril(torch.ones(5, 5, dtype=torch.bool))  # causal: the upper triangle is -inf
    for _ in range(steps):
        model(x, keep).pow(2).mean().backward()
        dbg.step()


@pytest.mark.parametrize("level", ["L1", "mix"])
@pytest.mark.parametrize("additive", [False, True])
def test_an_attention_mask_is_benign_but_a_nan_after_it_is_not(level, additive):
    model = MaskedAttention(additive)
    with nbdebug.Debugger(model, level=level) as dbg:
        _attention_run(model, dbg)
        assert dbg.first_nonfinite() is None
        origin = dbg.first_nonfinite(benign=False)
        assert origin is not None and "masked_fill" in origin[0]
        _poison(model.v)
        _attention_run(model, dbg)
        found = dbg.first_nonfinite()
        assert found is not None and found[2] == 1
        assert dbg.graph.nodes[found[0]].scope.endswith("v")


def test_an_inf_reaching_the_loss_is_reported():
    model = torch.nn.Linear(4, 1)
    with nbdebug.Debugger(model, level="L1") as dbg:
        torch.log(model(torch.zeros(1, 4)) * 0).sum().backward()  # log(0) = -inf flows into the loss
        dbg.step()
        node, slot, _ = dbg.first_nonfinite(step=0)
        assert node.startswith("Torch.log.") and slot == "output.0"


def _masked_logits_step(model: torch.nn.Module, dbg: nbdebug.Debugger) -> None:
    """Logits masked with -inf for decoding are returned beside the loss: nothing absorbs their -inf."""
    out = model(torch.ones(2, 4))
    banned = torch.tensor([[True, False], [False, True]])
    decoding = out.masked_fill(banned, float("-inf"))  # intended, and a model output
    out.pow(2).mean().backward()
    dbg.step()
    assert torch.isinf(decoding).any()


def test_intended_infinities_can_be_named():
    model = torch.nn.Linear(4, 2)
    with nbdebug.Debugger(model, level="L1") as dbg:
        _masked_logits_step(model, dbg)
        node, _, _ = dbg.first_nonfinite(step=0)
        assert "masked_fill" in node
        assert dbg.first_nonfinite(step=0, ignore="*masked_fill*") is None
        assert dbg.first_nonfinite(step=0, ignore=["Torch.log.*"]) is not None
    with nbdebug.Debugger(model, level="L1", benign_nonfinite=["*masked_fill*"]) as dbg:
        _masked_logits_step(model, dbg)
        assert dbg.first_nonfinite(step=0) is None  # named as intended when the Debugger was made
