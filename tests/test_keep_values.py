"""``keep(nodes)``: values not retained by default (the optimizer's in-place updates, values over the memory
budget) become readable from the node's next execution on — and what is then shown is the value used:
its statistics are those recorded for that slot. The tensor view offers it where a value is missing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nbdebug
from nbdebug.session.session import numpy_raw
from nbdebug.session.store import NotRetainedError
from nbdebug.ui.panel import Panel


def _model_and_step(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    data = [torch.randn(5, 4) for _ in range(4)]

    def step(i: int) -> None:
        opt.zero_grad()
        model(data[i]).pow(2).sum().backward()
        opt.step()

    return model, step


def _assert_value_is_the_one_used(dbg, node: str) -> int:
    slots = sorted(dbg.graph.nodes[node].shapes)
    for slot in slots:
        arr = dbg.tensor(node, slot)
        st = dbg.stats(node, slot)
        raw = numpy_raw(arr)
        assert st["max"] == pytest.approx(raw[0]) and st["min"] == pytest.approx(raw[1])
        assert st["norm"] == pytest.approx(np.sqrt(raw[4]), rel=1e-6)
        assert tuple(arr.shape) == tuple(st["shape"])
    return len(slots)


def test_keep_makes_optimizer_updates_readable_from_the_next_step():
    model, step = _model_and_step()
    dbg = nbdebug.Debugger(model, level="L1")
    step(0)
    updates = [n.name for n in dbg.graph if n.section == "optimizer" and n.name.startswith("Tensor.")]
    assert updates, "AdamW's in-place updates are op nodes at L1"
    name = next(n for n in updates if n.startswith("Tensor.lerp_."))
    with pytest.raises(NotRetainedError, match=r"keep\(node\)"):
        dbg.tensor(name, "output.0")
    kept = dbg.keep("Tensor.lerp_.*")
    assert name in kept and all(n.startswith("Tensor.lerp_.") for n in kept)
    step(1)
    # every slot of every kept node: the value the op used or produced, even though later AdamW ops of the
    # same step (and of this one) overwrote those tensors in place
    assert sum(_assert_value_is_the_one_used(dbg, n) for n in kept) >= 3 * len(kept)
    # nodes not kept stay statistics only
    other = next(n for n in updates if n.startswith("Tensor.addcdiv_."))
    with pytest.raises(NotRetainedError):
        dbg.tensor(other, "output.0")
    assert dbg.keep("Tensor.lerp_.*", on=False) == frozenset()
    step(2)
    with pytest.raises(NotRetainedError):
        dbg.tensor(name, "output.0")
    dbg.close()


def test_keep_overrides_the_memory_budget():
    model, step = _model_and_step(1)
    dbg = nbdebug.Debugger(model, level="L0", memory_budget=0)
    step(0)
    node = "Module.1.LayerNorm.forward.0"
    with pytest.raises(NotRetainedError, match="memory budget"):
        dbg.tensor(node, "output.0")
    dbg.keep(node)
    step(1)
    _assert_value_is_the_one_used(dbg, node)
    dbg.close()


def test_keep_rejects_a_glob_that_matches_nothing():
    model, step = _model_and_step()
    dbg = nbdebug.Debugger(model, level="L0")
    step(0)
    with pytest.raises(ValueError, match="matches none of the"):
        dbg.keep("Module.*.Conv2d.*")
    with pytest.raises(TypeError):
        dbg.keep(None)
    assert dbg.session.kept == frozenset()
    dbg.close()


def test_tensor_view_offers_keep_where_a_value_is_not_retained():
    model, step = _model_and_step()
    dbg = nbdebug.Debugger(model, level="L1")
    step(0)
    panel = Panel(dbg)
    tv = panel.tensor_view
    tv.open("Module.1.LayerNorm.forward.0" if "Module.1.LayerNorm.forward.0" in dbg.graph.nodes
            else "Functional.layer_norm.0.forward", "output.0")
    assert tv.keep.layout.display == "none"  # retained: nothing to offer
    tv.open("Tensor.lerp_.0.forward", "output.0")
    assert tv.keep.layout.display == "flex" and not tv.keep.disabled
    tv.keep.click()
    assert dbg.session.kept == {"Tensor.lerp_.0.forward"} and tv.keep.disabled
    step(1)
    tv.open("Tensor.lerp_.0.forward", "output.0")
    assert tv.error_texts["current"] == "" and tv.values() is not None
    dbg.close()
