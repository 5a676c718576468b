"""The module share of input gradients (``torch/grad_share.py``): where a call's autograd nodes start,
and which of them consume the call's inputs."""

from __future__ import annotations

import pytest
import torch

from nbdebug.frameworks.torch import grad_share
from nbdebug.frameworks.torch.grad_share import consumers, edge_of, next_sequence_nr


@pytest.mark.parametrize("peek", [True, False], ids=["counter", "fallback"])
def test_nodes_made_after_the_mark_and_only_they_are_the_calls(peek, monkeypatch):
    if not peek:
        monkeypatch.setattr(grad_share, "_PEEK", None)
    elif grad_share._PEEK is None:
        pytest.fail("this torch has no torch._C._autograd._get_sequence_nr: the fallback is what runs")
    x = torch.ones(3, requires_grad=True) * 1.0  # made before the call
    before = x.grad_fn._sequence_nr()
    mark = next_sequence_nr()
    assert mark > before
    y = x.exp() + x * 2.0  # the call: three nodes
    made = [y.grad_fn, *(n for n, _ in y.grad_fn.next_functions)]
    assert all(n._sequence_nr() >= mark for n in made)
    found = consumers([y.grad_fn], mark, {edge_of(x): 0})
    assert sorted(type(n).__name__ for n in found) == ["ExpBackward0", "MulBackward0"]
    # a mark taken after the call excludes its nodes
    assert consumers([y.grad_fn], next_sequence_nr(), {edge_of(x): 0}) == {}
