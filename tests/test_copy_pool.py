"""Private copies (the parameters each step used) are made into the buffers of copies the store dropped,
never into one that something still holds: a value read earlier keeps showing the value it was."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import nbdebug
from nbdebug.frameworks.torch.ops import CopyPool


def _train(model: nn.Module, steps: int, dbg=None, held: dict | None = None) -> list[np.ndarray]:
    torch.manual_seed(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    used = []
    for i in range(steps):
        used.append(model[0].weight.detach().clone().numpy())  # the value this step's forward uses
        opt.zero_grad()
        model(torch.randn(8, 256)).square().mean().backward()
        opt.step()
        if held is not None and dbg is not None:
            held[i] = dbg.tensor("Parameter.0.weight", "output.0")  # the user keeps the array
    return used


def test_parameter_copies_reuse_dropped_buffers_and_stay_exact():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))  # 256 KB weight: pooled
    dbg = nbdebug.Debugger(model, level="L0")
    try:
        used = _train(model, 6)
        pool = dbg._adapter.ops.pool
        assert pool.reused >= 4  # from the third step on, the copies of two steps ago come back
        # what the debugger shows for the last two steps is what those forwards used
        assert np.array_equal(dbg.tensor("Parameter.0.weight", "output.0"), used[-1])
        assert np.array_equal(dbg.tensor("Parameter.0.weight", "output.0", step="previous"), used[-2])
        assert np.array_equal(dbg.tensor("Module.0.Linear.forward.0", "parameters.weight"), used[-1])
    finally:
        dbg.close()
    assert pool.closed and not pool.free and not pool.idle


def test_a_value_the_user_holds_is_never_recycled():
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    dbg = nbdebug.Debugger(model, level="L0")
    held: dict[int, np.ndarray] = {}
    try:
        used = _train(model, 6, dbg, held)
        for i, arr in held.items():  # each array still shows the value step i used
            assert np.array_equal(arr, used[i]), i
    finally:
        dbg.close()


def _free(pool: CopyPool) -> int:
    return sum(len(v) for v in pool.free.values())


def test_pool_gives_back_only_unshared_buffers():
    pool = CopyPool()
    src = torch.randn(128, 128)
    c = pool.copy(src)
    view = c[0]  # a view of its storage lives on: not reusable
    pool.give(c)
    assert _free(pool) == 0
    del view
    arr = c.numpy()  # a NumPy array over it: not reusable
    pool.give(c)
    assert _free(pool) == 0
    del arr
    pool.give(c)
    ptr = c.data_ptr()
    del c
    assert _free(pool) == 1
    again = pool.copy(src * 2)
    assert again.data_ptr() == ptr and torch.equal(again, src * 2) and pool.reused == 1
    small = torch.ones(3)  # small copies are left to the allocator
    pool.give(pool.copy(small))
    assert _free(pool) == 0
    pool.trim()
    pool.give(again)  # given back before a trim: dropped at the following one if not taken
    del again
    assert _free(pool) == 1
    pool.trim()
    pool.trim()
    assert _free(pool) == 0 and not any(pool.idle.values())
