"""Attach/detach hygiene: nothing left behind, bitwise identical outputs, no reference leak, errors."""

import gc
import weakref

import pytest
import torch
import torch.nn as nn
from conftest import Net, train_steps

import nbdebug


def _hook_count(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
        n += len(m._backward_pre_hooks) + len(getattr(m, "_forward_hooks_with_kwargs", {}))
    for p in model.parameters():
        n += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        n += len(p._backward_hooks or {})
    return n


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
def test_close_leaves_model_bitwise_identical(level):
    torch.manual_seed(0)
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    assert _hook_count(b) == 0
    _, ref_losses = train_steps(a, steps=3)
    dbg = nbdebug.Debugger(b, level=level)
    _, dbg_losses = train_steps(b, steps=3)
    assert dbg_losses == ref_losses  # capturing does not change numerics
    dbg.close()
    assert _hook_count(b) == 0
    assert torch.overrides._get_current_function_mode_stack() == []
    import torch.optim.optimizer as o
    ours = [h for h in (*o._global_optimizer_pre_hooks.values(), *o._global_optimizer_post_hooks.values())
            if getattr(h, "__self__", None) is dbg._adapter]
    assert ours == []
    x = torch.randn(4, 8)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert torch.equal(a(x), b(x))
    steps = dbg.step_index
    train_steps(b, steps=1)
    assert dbg.step_index == steps  # closed: nothing recorded


def test_no_reference_keeps_model_alive():
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    train_steps(model, steps=2)
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None
    dbg.close()


def test_attach_errors():
    model = Net()
    dbg = nbdebug.Debugger(model)
    with pytest.raises(RuntimeError, match="already attached"):
        nbdebug.Debugger(model)
    dbg.close()
    nbdebug.Debugger(model).close()  # after close, attaching again is fine
    with pytest.raises(TypeError, match="torch.nn.Module or a mindspore.nn.Cell"):
        nbdebug.Debugger([1, 2, 3])
    with pytest.raises(ValueError, match="unknown level 'L7'.*L0, L1, mix"):
        nbdebug.Debugger(Net(), level="L7")


def test_capture_off_records_nothing_and_can_resume():
    model = Net()
    dbg = nbdebug.Debugger(model, level="mix", capture=False)
    train_steps(model, steps=2)
    assert dbg.step_index == 0 and len(dbg.graph) == 0
    assert torch.overrides._get_current_function_mode_stack() == []
    dbg.capture = True
    train_steps(model, steps=1)
    assert dbg.step_index == 1 and len(dbg.graph) > 0
    dbg.close()


def test_manual_step_boundary_overrides_optimizer():
    model = Net()
    with nbdebug.Debugger(model, level="L0") as dbg:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):  # two micro-batches with accumulation, one optimizer step each... then dbg.step
            opt.zero_grad()
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            dbg.step()
        assert dbg.step_index == 2
        # without the optimizer: forward only, dbg.step marks the boundary
        model(torch.randn(2, 8))
        dbg.step()
        assert dbg.step_index == 3
        assert ("Module.fc1.Linear.forward.0", "output.0") in dbg.session.steps[2]


def test_model_dropped_without_close_releases_global_hooks():
    import torch.optim.optimizer as o

    model = Net()
    dbg = nbdebug.Debugger(model, level="mix")
    adapter = dbg._adapter
    del model
    gc.collect()
    hooks = [*o._global_optimizer_pre_hooks.values(), *o._global_optimizer_post_hooks.values()]
    assert not [h for h in hooks if getattr(h, "__self__", None) is adapter]
    assert adapter.closed


def test_a_new_model_at_a_reused_address_can_be_attached():
    seen = set()
    nbdebug.Debugger(Net())  # first attach outside the loop: what it imports and caches stays alive
    gc.collect()
    # every object alive now goes to gc's permanent generation, so each collection below walks only what the
    # loop made (a full collection of the worker's heap took ~1 s, 50 of them most of this test's minute);
    # the loop's unreachable models are collected just the same
    gc.freeze()
    try:
        for _ in range(50):  # CPython reuses ids of collected objects; attach must not confuse them
            model = Net()
            seen.add(id(model))
            nbdebug.Debugger(model)  # never closed: the model dies at the next iteration
            del model
            gc.collect()
    finally:
        gc.unfreeze()
    assert len(seen) < 50  # an address was reused (the case under test), and no false "already attached"
